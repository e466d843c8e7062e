//! Renewals on one server, many to a script call.
//!
//! With thousands of held locks, a script call per renewal is thousands of
//! calls a second, each parsed, looked up and run on its own by the server.
//! Renewals asked within [`WINDOW`] of each other go to the server together
//! instead, as one [`RENEW_MANY`] call over up to [`PER_CALL`] keys, and
//! each renewal gets its own key's answer. A renewal's validity still
//! counts from when it asked (before the window), so the window only ever
//! makes the holder's count shorter than the server's.
//!
//! On one instance (or Sentinel's master) and on each RedLock master; not
//! on a cluster, whose keys of one call must share a slot, and not with
//! the replica-sync guard or for a lease that carries a value, whose
//! renewals go one to a call as before. A server that refuses keys of
//! several slots in one call with `CROSSSLOT` (a `redis://` URL that names
//! a cluster node, or a proxy that answers so) gets each renewal in a call
//! of its own from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lockcore::raw::batch::{Batches, Waiting};
use redis::RedisResult;
use tokio::sync::oneshot;

use crate::config::NAME;
use crate::conn::{evalsha_sized, Conn};
use crate::managed::Managed;
use crate::scripts::RENEW_MANY;

/// How long the first renewal of a batch waits for others to join it.
pub(crate) const WINDOW: Duration = Duration::from_millis(2);
/// Keys per call.
pub(crate) const PER_CALL: usize = 256;
/// Calls in flight at once: one, so that on one connection the calls reach
/// the server in the order their renewals were asked. A renewal whose
/// asker gave up after its call was put together is still sent; were a
/// later call (with the same lease's next renewal) to overtake it (a script
/// reloaded after `NOSCRIPT`), a shorter ttl in it would land last and cut
/// the lease short behind its holder's back. (A call the client gave up on
/// at its response timeout may still run on the server after the next call
/// went on a new connection, as a single call could before.)
///
/// The cost: one server takes at most [`PER_CALL`] renewals per round trip
/// (plus the script's time), and a renewal may wait for the call before
/// its own: on a link of tens of milliseconds, with tens of thousands of
/// short-ttl leases, renewals fall behind. Keeping several calls in flight
/// with each lease's renewals in order is the way past that.
const IN_FLIGHT: usize = 1;

/// A lease's key and owner token, made once and shared by its renewals
/// (on every RedLock master).
#[derive(Debug)]
pub(crate) struct KeyToken {
    key: String,
    token: String,
}

impl KeyToken {
    /// The renewals' view of the lease on `key` held with `token`.
    pub(crate) fn new(key: &str, token: &str) -> Arc<KeyToken> {
        Arc::new(KeyToken {
            key: key.to_owned(),
            token: token.to_owned(),
        })
    }

    /// The lease's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The lease's owner token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}

/// One lease's renewal: its key and token, its ttl in milliseconds, and
/// where the answer goes.
struct Renew {
    lease: Arc<KeyToken>,
    ttl_ms: u64,
    reply: oneshot::Sender<RedisResult<i64>>,
}

impl Waiting for Renew {
    fn gave_up(&self) -> bool {
        self.reply.is_closed()
    }
}

/// The renewals of one server's connection.
pub(crate) struct Renewals {
    conn: Arc<Managed>,
    batches: Batches<Renew>,
    /// The server refused keys of several slots in one call: each renewal
    /// goes in a call of its own.
    one_each: Arc<AtomicBool>,
}

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals")
            .field("batches", &self.batches)
            .finish_non_exhaustive()
    }
}

impl Renewals {
    /// The renewals of `conn`; their task starts on the first renewal.
    pub(crate) fn new(conn: Arc<Managed>) -> Arc<Renewals> {
        Arc::new(Renewals {
            conn,
            batches: Batches::new(WINDOW, PER_CALL, IN_FLIGHT),
            one_each: Arc::default(),
        })
    }

    /// `PEXPIRE key ttl` if the key holds `token`: 1 when renewed, 0 when
    /// another owner's value (or another type) is there, -1 when the key
    /// is gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal dropped before its call was put together is
    /// left out of it; one dropped after that is still sent, and may set
    /// the lease's expiry to its ttl from then. The calls go one after
    /// another, so any later renewal of the lease lands after it.
    pub(crate) async fn renew(&self, lease: &Arc<KeyToken>, ttl_ms: u64) -> RedisResult<i64> {
        let (reply, answer) = oneshot::channel();
        let ask = Renew {
            lease: lease.clone(),
            ttl_ms,
            reply,
        };
        self.batches.send(ask, || {
            let (conn, one_each) = (Conn::Single(self.conn.clone()), self.one_each.clone());
            move |batch| {
                let (conn, one_each) = (conn.clone(), one_each.clone());
                async move { renew_batch(&conn, batch, &one_each).await }
            }
        });
        answer.await.unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the renewing task ended",
            )))
        })
    }
}

/// One [`RENEW_MANY`] call for `batch` (a call per renewal, from then on,
/// once the server refused keys of several slots in one); answers each
/// renewal.
///
/// The renewals of one batch are of distinct leases (a lease's next
/// renewal is asked after its last one was answered, or dropped, and a
/// dropped one is left out until its batch is put together), so their calls
/// of one key each may go at once; the next batch waits for them all.
async fn renew_batch(conn: &Conn, batch: Vec<Renew>, one_each: &AtomicBool) {
    let batch = if one_each.load(Ordering::Relaxed) {
        batch
    } else {
        match renew_call(conn, batch).await {
            None => return,
            Some(refused) => {
                one_each.store(true, Ordering::Relaxed);
                tracing::warn!(
                    backend = NAME,
                    "the server refused the renewals of several keys in one script call (CROSSSLOT: a cluster node, or a proxy); renewing each in a call of its own"
                );
                // Nothing of the refused call applied: leave out the
                // renewals given up meanwhile.
                refused.into_iter().filter(|r| !r.gave_up()).collect()
            }
        }
    };
    join_all(batch.into_iter().map(|r| renew_call(conn, vec![r]))).await;
}

/// One [`RENEW_MANY`] call for `batch`; answers each renewal, or gives the
/// batch back when the server refused its keys of several slots.
async fn renew_call(conn: &Conn, batch: Vec<Renew>) -> Option<Vec<Renew>> {
    // Each key, its token and its ttl (at most 20 digits).
    let bytes = batch
        .iter()
        .map(|r| r.lease.key.len() + r.lease.token.len() + 20)
        .sum();
    let mut call = evalsha_sized(&RENEW_MANY, batch.len(), 3 * batch.len(), bytes);
    for r in &batch {
        call.arg(r.lease.key.as_str());
    }
    for r in &batch {
        call.arg(r.lease.token.as_str()).arg(r.ttl_ms);
    }
    let result: RedisResult<Vec<i64>> = conn.eval(&RENEW_MANY, &call).await;
    match result {
        Ok(answers) if answers.len() == batch.len() => {
            for (r, n) in batch.into_iter().zip(answers) {
                let _ = r.reply.send(Ok(n));
            }
        }
        Ok(answers) => {
            let e = redis::RedisError::from((
                redis::ErrorKind::Parse,
                "renewals",
                format!("{} answers to {} renewals", answers.len(), batch.len()),
            ));
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
        Err(e)
            if batch.len() > 1
                && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot) =>
        {
            return Some(batch);
        }
        Err(e) => {
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
    }
    None
}
