//! Push wake-ups: one pub/sub connection per server, shared by all waiters,
//! kept by one task.
//!
//! A waiter subscribes to its lock's release channel *before* retrying, so a
//! release between its failed attempt and its wait is not missed: the
//! release script publishes on the channel and every local waiter on it is
//! woken. Channels are counted per waiter and unsubscribed with the last one.
//!
//! The connection belongs to one task, which is the only one to touch it:
//! it subscribes and unsubscribes on request, pings the connection every
//! second while any channel is wanted (a silent, half-open connection is
//! found out within a ping and its timeout), and after any failure connects
//! again and subscribes every channel still wanted, then wakes every waiter
//! to retry (a release may have gone unheard meanwhile); it also connects
//! again when the server to listen on moves (Sentinel named another
//! master). While the
//! connection is down, waiters fall back to a bounded poll. Every request
//! on the connection has the response timeout; nothing waits on it
//! unbounded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lockcore::raw::retry::Backoff;
use lockcore::raw::sync::lock;
use lockcore::raw::Deadline;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};

/// How often the task pings a connection that carries subscriptions.
const PING_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Chan {
    tx: watch::Sender<u64>,
    users: usize,
    /// The server confirmed the subscription on the current connection.
    confirmed: bool,
}

enum Request {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
}

/// The client of the server to listen on now (for Sentinel, the master of
/// the moment: a new pub/sub connection follows a failover).
type ClientOf = Box<dyn Fn() -> redis::Client + Send + Sync>;

struct Inner {
    client: ClientOf,
    timeout: Duration,
    channels: Mutex<HashMap<String, Chan>>,
    requests: mpsc::UnboundedSender<Request>,
    /// The task's receiving end until the task starts.
    pending: Mutex<Option<mpsc::UnboundedReceiver<Request>>>,
    started: AtomicBool,
}

impl Inner {
    fn wake(&self, channel: &str) {
        if let Some(c) = lock(&self.channels).get(channel) {
            c.tx.send_modify(|v| *v += 1);
        }
    }

    /// Marks every channel unconfirmed (the connection is gone) and wakes
    /// every waiter to retry by itself.
    fn disconnected(&self) {
        for c in lock(&self.channels).values_mut() {
            c.confirmed = false;
            c.tx.send_modify(|v| *v += 1);
        }
    }

    fn wanted(&self) -> Vec<String> {
        lock(&self.channels).keys().cloned().collect()
    }

    fn confirm(&self, channel: &str) {
        if let Some(c) = lock(&self.channels).get_mut(channel) {
            c.confirmed = true;
        }
    }
}

/// The wake-up hub of one server.
#[derive(Clone)]
pub(crate) struct Wakeups {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wakeups")
            .field("channels", &lock(&self.inner.channels).len())
            .finish()
    }
}

/// One waiter's interest in a channel.
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    rx: watch::Receiver<u64>,
}

impl Subscription {
    /// Whether a release on the channel reaches this waiter by a push now
    /// (else it polls).
    pub(crate) fn live(&self) -> bool {
        lock(&self.inner.channels)
            .get(&self.channel)
            .is_some_and(|c| c.confirmed)
    }

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
            let mut map = lock(&self.inner.channels);
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
            let channel = std::mem::take(&mut self.channel);
            let _ = self.inner.requests.send(Request::Unsubscribe(channel));
        }
    }
}

impl Wakeups {
    pub(crate) fn new(
        client: impl Fn() -> redis::Client + Send + Sync + 'static,
        timeout: Duration,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Wakeups {
            inner: Arc::new(Inner {
                client: Box::new(client),
                timeout,
                channels: Mutex::default(),
                requests: tx,
                pending: Mutex::new(Some(rx)),
                started: AtomicBool::new(false),
            }),
        }
    }

    /// Subscribes to `channel`; returns once the server confirmed it, or
    /// after the response timeout without (the waiter polls until the task
    /// confirms it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the subscription is dropped with the future, and
    /// unsubscribed if it was the channel's last.
    pub(crate) async fn subscribe(&self, channel: &str) -> Subscription {
        self.start();
        let (rx, first) = {
            let mut map = lock(&self.inner.channels);
            let c = map.entry(channel.to_owned()).or_insert_with(|| Chan {
                tx: watch::channel(0).0,
                users: 0,
                confirmed: false,
            });
            c.users += 1;
            (c.tx.subscribe(), c.users == 1 || !c.confirmed)
        };
        let sub = Subscription {
            inner: self.inner.clone(),
            channel: channel.to_owned(),
            rx,
        };
        if first {
            let (tx, done) = oneshot::channel();
            if self
                .inner
                .requests
                .send(Request::Subscribe(channel.to_owned(), tx))
                .is_ok()
            {
                let _ = tokio::time::timeout(self.inner.timeout, done).await;
            }
        }
        sub
    }

    fn start(&self) {
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(rx) = lock(&self.inner.pending).take() else {
            return;
        };
        tokio::spawn(keep(Arc::downgrade(&self.inner), rx));
    }
}

/// The task that owns the pub/sub connection, until the hub is gone.
async fn keep(hub: Weak<Inner>, mut requests: mpsc::UnboundedReceiver<Request>) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut queued: Vec<Request> = Vec::new();
    loop {
        // Nothing to listen for: wait for a request.
        let idle = hub.upgrade().is_none_or(|h| h.wanted().is_empty());
        if idle && queued.is_empty() {
            match requests.recv().await {
                Some(r) => queued.push(r),
                None => return,
            }
        }
        let Some(inner) = hub.upgrade() else { return };
        match connected(&inner).await {
            Some((sink, stream)) => {
                backoff.reset();
                for r in queued.drain(..) {
                    if let Request::Subscribe(_, done) = r {
                        // Every wanted channel is subscribed by now.
                        let _ = done.send(true);
                    }
                }
                let timeout = inner.timeout;
                let at = target(&inner);
                drop(inner);
                serve(&hub, sink, stream, &mut requests, timeout, &at).await;
                if let Some(inner) = hub.upgrade() {
                    inner.disconnected();
                }
            }
            None => {
                inner.disconnected();
                drop(inner);
                for r in queued.drain(..) {
                    if let Request::Subscribe(_, done) = r {
                        let _ = done.send(false);
                    }
                }
                tokio::time::sleep(backoff.next_delay()).await;
                // Take what came meanwhile; subscriptions are in the map.
                while let Ok(r) = requests.try_recv() {
                    queued.push(r);
                }
            }
        }
    }
}

/// The address of the server to listen on now.
fn target(inner: &Inner) -> String {
    (inner.client)().get_connection_info().addr().to_string()
}

/// A new connection with every wanted channel subscribed, or `None`.
async fn connected(inner: &Inner) -> Option<(PubSubSink, PubSubStream)> {
    let t = inner.timeout;
    let conn = tokio::time::timeout(t * 2, (inner.client)().get_async_pubsub())
        .await
        .ok()?
        .map_err(|e| tracing::debug!(error = %e, "pub/sub connection failed; waiters poll"))
        .ok()?;
    let (mut sink, stream) = conn.split();
    for channel in inner.wanted() {
        match tokio::time::timeout(t, sink.subscribe(&channel)).await {
            Ok(Ok(())) => inner.confirm(&channel),
            _ => return None,
        }
    }
    Some((sink, stream))
}

/// Serves one connection until it fails or the hub is gone.
async fn serve(
    hub: &Weak<Inner>,
    mut sink: PubSubSink,
    mut stream: PubSubStream,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    t: Duration,
    at: &str,
) {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else { return };
                let Some(inner) = hub.upgrade() else { return };
                inner.wake(msg.get_channel_name());
            }
            r = requests.recv() => match r {
                None => return,
                Some(Request::Subscribe(channel, done)) => {
                    let ok = matches!(tokio::time::timeout(t, sink.subscribe(&channel)).await, Ok(Ok(())));
                    if ok {
                        if let Some(inner) = hub.upgrade() {
                            inner.confirm(&channel);
                        }
                    }
                    let _ = done.send(ok);
                    if !ok {
                        return;
                    }
                }
                Some(Request::Unsubscribe(channel)) => {
                    // A new waiter may have subscribed again meanwhile.
                    let wanted = hub.upgrade().is_some_and(|h| lock(&h.channels).contains_key(&channel));
                    if !wanted
                        && !matches!(tokio::time::timeout(t, sink.unsubscribe(&channel)).await, Ok(Ok(())))
                    {
                        return;
                    }
                }
            },
            _ = ping.tick() => {
                // The commands' connection moved (Sentinel named another
                // master): listen there.
                if hub.upgrade().is_some_and(|h| target(&h) != at) {
                    tracing::debug!("the master moved; the pub/sub connection follows");
                    return;
                }
                let wanted = hub.upgrade().is_some_and(|h| !lock(&h.channels).is_empty());
                if wanted && !matches!(tokio::time::timeout(t, sink.ping::<redis::Value>()).await, Ok(Ok(_))) {
                    tracing::debug!("the pub/sub connection stopped answering; connecting again");
                    return;
                }
            }
        }
    }
}

/// The longest a waiter sleeps between attempts when no wake-up comes (a
/// bounded fallback for a lost pub/sub connection).
pub(crate) const FALLBACK_POLL: Duration = Duration::from_secs(2);

/// Waits for a wake-up, the holder's expiry, the fallback poll or the
/// deadline, whichever comes first.
pub(crate) async fn wait_turn(subs: &mut [Subscription], holder_pttl: i64, deadline: Deadline) {
    let nap = match u64::try_from(holder_pttl) {
        Ok(ms) => Duration::from_millis(ms + 1).min(FALLBACK_POLL),
        Err(_) if holder_pttl == -2 => Duration::ZERO, // gone meanwhile
        Err(_) => FALLBACK_POLL,                       // no expiry, or unknown
    };
    let nap = if subs.iter().any(Subscription::live) {
        nap
    } else {
        nap.min(Duration::from_millis(100))
    };
    let mut until = Instant::now() + nap;
    if let Some(d) = deadline.instant() {
        until = until.min(d);
    }
    if subs.is_empty() {
        tokio::time::sleep_until(until.into()).await;
        return;
    }
    let woken = futures_util::future::select_all(subs.iter_mut().map(|s| Box::pin(s.changed())));
    tokio::select! {
        _ = woken => {}
        () = tokio::time::sleep_until(until.into()) => {}
    }
}
