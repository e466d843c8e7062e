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
//! renewals go one to a call as before.

use std::sync::Arc;
use std::time::Duration;

use lockcore::raw::batch::{Batches, Waiting};
use redis::RedisResult;
use tokio::sync::oneshot;

use crate::conn::Conn;
use crate::managed::Managed;
use crate::scripts::RENEW_MANY;

/// How long the first renewal of a batch waits for others to join it.
pub(crate) const WINDOW: Duration = Duration::from_millis(2);
/// Keys per call.
pub(crate) const PER_CALL: usize = 256;
/// Calls in flight at once (on the one connection, one after another).
const IN_FLIGHT: usize = 8;

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
        })
    }

    /// `PEXPIRE key ttl` if the key holds `token`: 1 when renewed, 0 when
    /// another owner's value (or another type) is there, -1 when the key
    /// is gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal dropped before its call was sent is left
    /// out of it; one dropped after it may still extend the lease (by at
    /// most its ttl), as a dropped single call would.
    pub(crate) async fn renew(&self, lease: &Arc<KeyToken>, ttl_ms: u64) -> RedisResult<i64> {
        let (reply, answer) = oneshot::channel();
        let ask = Renew {
            lease: lease.clone(),
            ttl_ms,
            reply,
        };
        self.batches.send(ask, || {
            let conn = Conn::Single(self.conn.clone());
            move |batch| {
                let conn = conn.clone();
                async move { renew_batch(&conn, batch).await }
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

/// One [`RENEW_MANY`] call for `batch`; answers each renewal.
async fn renew_batch(conn: &Conn, batch: Vec<Renew>) {
    let mut call = RENEW_MANY.prepare_invoke();
    for r in &batch {
        call.key(r.lease.key.as_str());
    }
    for r in &batch {
        call.arg(r.lease.token.as_str()).arg(r.ttl_ms);
    }
    let result: RedisResult<Vec<i64>> = conn.invoke(&call).await;
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
        Err(e) => {
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
    }
}
