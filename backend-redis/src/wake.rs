//! Push wake-ups: one pub/sub connection per server, shared by all waiters.
//!
//! A waiter subscribes to its lock's release channel *before* retrying, so a
//! release between its failed attempt and its wait is not missed: the
//! release script publishes on the channel and every local waiter on it is
//! woken. Subscriptions are counted per channel and dropped with the last
//! waiter. If the pub/sub connection fails, waiters fall back to a bounded
//! poll until it is re-established by the next subscription.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::watch;

#[derive(Debug)]
struct Chan {
    tx: watch::Sender<u64>,
    users: usize,
}

#[derive(Default)]
struct Inner {
    sink: tokio::sync::Mutex<Option<(PubSubSink, Arc<AtomicBool>)>>,
    channels: Mutex<HashMap<String, Chan>>,
}

fn chans(inner: &Inner) -> std::sync::MutexGuard<'_, HashMap<String, Chan>> {
    inner
        .channels
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    fn wake(&self, channel: &str) {
        if let Some(c) = chans(self).get(channel) {
            c.tx.send_modify(|v| *v += 1);
        }
    }

    fn wake_all(&self) {
        for c in chans(self).values() {
            c.tx.send_modify(|v| *v += 1);
        }
    }
}

/// The wake-up hub of one server.
#[derive(Clone)]
pub(crate) struct Wakeups {
    client: redis::Client,
    timeout: Duration,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("channels", &chans(&self.inner).len())
            .finish()
    }
}

/// One waiter's interest in a channel.
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    rx: watch::Receiver<u64>,
    /// Whether the server confirmed the subscription (else: poll).
    pub(crate) live: bool,
}

impl Subscription {
    /// Resolves at the next wake-up on the channel (or a reconnect).
    pub(crate) async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let mut map = chans(&self.inner);
            match map.get_mut(&self.channel) {
                Some(c) if c.users > 1 => {
                    c.users -= 1;
                    false
                }
                Some(_) => {
                    map.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last {
            let (inner, channel) = (self.inner.clone(), std::mem::take(&mut self.channel));
            lockcore::cleanup::spawn_cleanup("unsubscribe a release channel", async move {
                let mut sink = inner.sink.lock().await;
                // A new waiter may have subscribed again meanwhile.
                if chans(&inner).contains_key(&channel) {
                    return;
                }
                if let Some((s, _)) = sink.as_mut() {
                    let _ = s.unsubscribe(&channel).await;
                }
            });
        }
    }
}

impl Wakeups {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Self {
        Wakeups {
            client,
            timeout,
            inner: Arc::default(),
        }
    }

    /// Subscribes to `channel`; returns once the server confirmed it, or with
    /// `live == false` when it could not (the caller polls then).
    pub(crate) async fn subscribe(&self, channel: &str) -> Subscription {
        let rx = {
            let mut map = chans(&self.inner);
            let c = map.entry(channel.to_owned()).or_insert_with(|| Chan {
                tx: watch::channel(0).0,
                users: 0,
            });
            c.users += 1;
            c.tx.subscribe()
        };
        let mut sub = Subscription {
            inner: self.inner.clone(),
            channel: channel.to_owned(),
            rx,
            live: false,
        };
        match tokio::time::timeout(self.timeout, self.confirm(channel)).await {
            Ok(Ok(())) => sub.live = true,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "release channel subscription failed; polling")
            }
            Err(_) => tracing::debug!("release channel subscription timed out; polling"),
        }
        sub
    }

    async fn confirm(&self, channel: &str) -> redis::RedisResult<()> {
        let mut guard = self.inner.sink.lock().await;
        if guard
            .as_ref()
            .is_some_and(|(_, alive)| !alive.load(Ordering::Acquire))
        {
            *guard = None;
        }
        if guard.is_none() {
            let (sink, mut stream) = self.client.get_async_pubsub().await?.split();
            let alive = Arc::new(AtomicBool::new(true));
            let (weak, flag) = (Arc::downgrade(&self.inner), alive.clone());
            tokio::spawn(async move {
                while let Some(msg) = stream.next().await {
                    let Some(inner) = weak.upgrade() else { return };
                    inner.wake(msg.get_channel_name());
                }
                flag.store(false, Ordering::Release);
                if let Some(inner) = weak.upgrade() {
                    // Whoever waited on this connection re-polls.
                    inner.wake_all();
                }
            });
            *guard = Some((sink, alive));
        }
        let Some((sink, _)) = guard.as_mut() else {
            return Ok(());
        };
        let r = sink.subscribe(channel).await;
        if r.is_err() {
            *guard = None;
        }
        r
    }
}
