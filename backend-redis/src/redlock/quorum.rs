//! One call on every master at once, and the counting of their replies.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{FutureExt, Shared};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::cleanup::spawn_cleanup;
use tokio::sync::oneshot;

use crate::conn::Conn;
use crate::managed::Managed;
use crate::renewals::{KeyToken, Renewals};
use crate::scripts::RELEASE;
use crate::wake::Wakeups;

/// One master: its connection (made in the background, replaced when it
/// stops answering), its batched renewals and its wake-ups.
#[derive(Debug)]
pub(super) struct Instance {
    pub(super) conn: Arc<Managed>,
    pub(super) renewals: Arc<Renewals>,
    pub(super) wake: Wakeups,
}

/// What each instance is asked, about one lock key.
#[derive(Debug)]
pub(super) enum Ask {
    /// `SET key token NX PX ttl`: `(1, 0)` when set, `(0, -1)` when not
    /// (the holder's pttl is not read here; [`Ask::Pttl`] does that).
    SetNx { token: String, ttl: String },
    /// A script over the key: its reply, as `(n, 0)` or `(n, detail)`.
    Script(&'static redis::Script, Vec<String>),
    /// `PTTL key`: `(0, pttl)`.
    Pttl,
}

/// One request for every instance it is sent to.
#[derive(Debug)]
pub(super) struct Call {
    pub(super) key: String,
    pub(super) ask: Ask,
    pub(super) limit: Duration,
}

/// Sends `call` to one instance within its limit. `Some(reply)` if it
/// answered in time.
pub(super) async fn call_one(conn: Arc<Managed>, call: Arc<Call>) -> Option<(i64, i64)> {
    let c = Conn::Single(conn.clone());
    let reply = async {
        match &call.ask {
            Ask::SetNx { token, ttl } => {
                let mut cmd = redis::cmd("SET");
                cmd.arg(&call.key).arg(token).arg("NX").arg("PX").arg(ttl);
                let set: Option<String> = c.cmd(&cmd).await.ok()?;
                Some(if set.is_some() { (1, 0) } else { (0, -1) })
            }
            Ask::Script(script, args) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let r: redis::Value = c.script(script, &[&call.key], &args).await.ok()?;
                match r {
                    redis::Value::Int(n) => Some((n, 0)),
                    v => redis::from_redis_value::<(i64, i64)>(v).ok(),
                }
            }
            Ask::Pttl => {
                let mut cmd = redis::cmd("PTTL");
                cmd.arg(&call.key);
                let pttl: i64 = c.cmd(&cmd).await.ok()?;
                Some((0, pttl))
            }
        }
    };
    match tokio::time::timeout(call.limit, reply).await {
        Ok(reply) => reply,
        Err(_) => {
            // Slow or silent: have the connection checked.
            conn.suspect_current();
            None
        }
    }
}

/// Replies of the instances a call went to, in their order: `None` for one
/// that did not answer in time.
type Replies = Vec<Option<(i64, i64)>>;

/// The calls of an [`on_each`] still out when it returned, by instance:
/// they finish in the background, as a counted cleanup step (so
/// [`lockcore::cleanup::flush`] waits for them), and each says when it did.
/// Shared, so that a release dropped halfway and sent again still waits.
#[derive(Debug, Default, Clone)]
pub(super) struct Straggling(Vec<Option<Shared<oneshot::Receiver<()>>>>);

impl Straggling {
    /// The call still out on instance `at`, if any.
    fn on(&self, at: usize) -> Option<Shared<oneshot::Receiver<()>>> {
        self.0.get(at).cloned().flatten()
    }
}

/// Sends `call` to every instance at once and waits for all of them.
pub(super) async fn on_all(instances: &[Instance], call: Call) -> Replies {
    let conns: Vec<Arc<Managed>> = instances.iter().map(|i| i.conn.clone()).collect();
    on_each(&conns, call, |_| false, Straggling::default())
        .await
        .0
}

/// Sends `call` to each of `conns` at once, and returns once all answered
/// (or timed out) or once `decided` says the replies in so far settle the
/// outcome. Replies still out then count as `None` here, and the calls
/// finish in the background ([`Straggling`]).
///
/// `after` holds the calls of an earlier `on_each` on the same key still
/// out (an acquire's, for its release): on each instance, this call is sent
/// only once the earlier one there finished, since a call waiting for its
/// connection (being made again, or reloading a script) is not yet in the
/// connection's order. Instances with nothing out are sent it at once.
pub(super) async fn on_each(
    conns: &[Arc<Managed>],
    call: Call,
    decided: impl Fn(&Replies) -> bool,
    after: Straggling,
) -> (Replies, Straggling) {
    let call = Arc::new(call);
    let mut out: FuturesUnordered<_> = conns
        .iter()
        .enumerate()
        .map(|(at, conn)| {
            let earlier = after.on(at);
            let (conn, call) = (conn.clone(), call.clone());
            async move {
                if let Some(earlier) = earlier {
                    let _ = earlier.await;
                }
                (at, call_one(conn, call).await)
            }
        })
        .collect();
    let mut replies: Replies = vec![None; conns.len()];
    let mut answered = vec![false; conns.len()];
    while let Some((at, reply)) = out.next().await {
        if let Some(slot) = replies.get_mut(at) {
            *slot = reply;
        }
        if let Some(a) = answered.get_mut(at) {
            *a = true;
        }
        if !out.is_empty() && decided(&replies) {
            let mut done: Vec<Option<oneshot::Sender<()>>> = Vec::new();
            let mut straggling = Vec::new();
            for a in &answered {
                if *a {
                    done.push(None);
                    straggling.push(None);
                } else {
                    let (tx, rx) = oneshot::channel();
                    done.push(Some(tx));
                    straggling.push(Some(rx.shared()));
                }
            }
            spawn_cleanup(
                "finish a RedLock call on the instances that had not answered",
                async move {
                    while let Some((at, _)) = out.next().await {
                        if let Some(tx) = done.get_mut(at).and_then(Option::take) {
                            let _ = tx.send(());
                        }
                    }
                },
            );
            return (replies, Straggling(straggling));
        }
    }
    (replies, Straggling::default())
}

/// Renews `lease` on every instance at once, in each instance's next batch
/// of renewals, within `limit`: `(1, 0)` renewed, `(0, 0)` another
/// owner's (or a value of another type), `(-1, 0)` missing, `None` no
/// answer in time.
pub(super) async fn renew_all(
    instances: &[Instance],
    lease: &Arc<KeyToken>,
    ttl_ms: u64,
    limit: Duration,
) -> Replies {
    // Each instance's answer, or that it failed or has not answered; one
    // timer for all of them.
    const FAILED: i64 = i64::MIN;
    const WAITING: i64 = i64::MIN + 1;
    let got: Vec<AtomicI64> = instances.iter().map(|_| AtomicI64::new(WAITING)).collect();
    let asks = instances.iter().zip(&got).map(|(i, slot)| async move {
        let n = i.renewals.renew(lease, ttl_ms).await.unwrap_or(FAILED);
        slot.store(n, Ordering::Relaxed);
    });
    let _ = tokio::time::timeout(limit, futures_util::future::join_all(asks)).await;
    instances
        .iter()
        .zip(got)
        .map(|(i, slot)| match slot.into_inner() {
            FAILED => None,
            WAITING => {
                // Slow or silent: have the connection checked.
                i.conn.suspect_current();
                None
            }
            n => Some((n, 0)),
        })
        .collect()
}

/// How many replies were `n`.
pub(super) fn count(replies: &Replies, n: i64) -> usize {
    replies
        .iter()
        .filter(|r| matches!(r, Some((m, _)) if *m == n))
        .count()
}

/// How a release went on the instances.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReleaseCount {
    pub(super) released: usize,
    pub(super) refused: usize,
}

/// Compare-and-delete on every instance, each after the call of `after`
/// still out there; returns once a majority released (the rest go on in
/// the background) or all answered.
pub(super) async fn release_all(
    instances: Arc<Vec<Instance>>,
    limit: Duration,
    key: String,
    channel: String,
    token: String,
    after: Straggling,
) -> ReleaseCount {
    let quorum = instances.len() / 2 + 1;
    let conns: Vec<Arc<Managed>> = instances.iter().map(|i| i.conn.clone()).collect();
    let call = Call {
        key,
        ask: Ask::Script(&RELEASE, vec![token, channel]),
        limit,
    };
    let (replies, _) = on_each(&conns, call, |r| count(r, 1) >= quorum, after).await;
    ReleaseCount {
        released: count(&replies, 1),
        refused: count(&replies, 0),
    }
}
