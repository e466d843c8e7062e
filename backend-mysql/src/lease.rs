//! A held row lock: the open transaction on its connection, kept alive and
//! checked by a `SELECT 1`, released by `ROLLBACK`.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::held_conn::HeldConn;
use lockcore::raw::prelude::*;
use sqlx::AssertSqlSafe;

use crate::config::NAME;
use crate::conn::Holding;
use crate::conn::Shared;
use crate::counter::Autocommit;
use crate::delay::clear;
use crate::publish::publish;
use crate::sql::is_user_lock_name;

/// A held row lock: the open transaction on its pinned connection.
pub(crate) struct MysqlLease {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    pub(crate) conn_id: u64,
    /// With a lock-delay, the owner whose record (see `delay.rs`) each
    /// renewal moves and the release deletes.
    pub(crate) delay_owner: Option<String>,
    /// Whether the holder publishes itself with a user lock (a lock's,
    /// with fencing): one that found it taken tries again at each renewal.
    pub(crate) publish: bool,
    pub(crate) lost: CancellationToken,
    pub(crate) conn: HeldConn<Holding>,
}

impl fmt::Debug for MysqlLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlLease")
            .field("name", &self.name)
            .field("conn_id", &self.conn_id)
            .finish_non_exhaustive()
    }
}

/// One renewal, run in a task of its own with the holding connection.
struct Renewing {
    shared: Arc<Shared>,
    name: String,
    conn_id: u64,
    delay_owner: Option<String>,
    publish: bool,
    lost: CancellationToken,
}

impl Renewing {
    /// The connection broke or did not answer: close it, raise lost.
    fn broken(&self, slot: &mut Option<Holding>, why: &str) -> Result<Renewal> {
        tracing::warn!(name = %self.name, conn_id = self.conn_id, why, "the connection holding a row lock is gone");
        drop(slot.take()); // dirty: closes the socket and KILLs the thread
        self.lost.cancel();
        Ok(Renewal::Lost)
    }

    async fn run(
        self,
        mut slot: tokio::sync::OwnedMutexGuard<Option<Holding>>,
        ttl: Duration,
    ) -> Result<Renewal> {
        let Some(h) = slot.as_mut() else {
            return Ok(Renewal::Lost);
        };
        if h.in_flight {
            return self.broken(&mut slot, "an earlier renewal was cut off mid-statement");
        }
        // With a lock-delay, the record's deadline moves first, then the
        // keepalive proves the row still held: the validity counts from the
        // record's sending, so it never outlasts the record less the delay.
        let sent = Instant::now();
        self.keep_record(ttl).await?;
        // Cleared once the reply is read: a renewal dropped before that
        // (its task aborted) leaves the connection marked.
        h.in_flight = true;
        let secs = whole_seconds(ttl);
        let limit = self.shared.cfg.request_timeout.min(ttl);
        let renewed = Renewal::Renewed {
            valid_until: validity_deadline(sent, ttl),
        };
        if self.publish && h.user_lock.is_none() && secs == h.session_ttl {
            // Unpublished (another session held the user lock): try again,
            // without waiting; the round trip is the keepalive.
            let owner = self.delay_owner.as_deref().unwrap_or_default();
            let publishing = publish(&self.shared, h, &self.name, 0, None, owner);
            return match self
                .shared
                .answer(KEEPALIVE, limit, false, publishing)
                .await
            {
                Ok(Ok(_)) => {
                    h.in_flight = false;
                    Ok(renewed)
                }
                Ok(Err(e)) | Err(e) => self.broken(&mut slot, &e.to_string()),
            };
        }
        let same_ttl = secs == h.session_ttl;
        let conn = h.conn()?;
        let sh = &self.shared;
        let res = if same_ttl {
            let fut = sqlx::query("SELECT 1").fetch_one(conn);
            sh.answer(KEEPALIVE, limit, false, fut)
                .await
                .map(|r| r.map(drop))
        } else {
            let sql = format!("SET SESSION wait_timeout = {secs}");
            let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn);
            sh.answer(KEEPALIVE, limit, false, fut)
                .await
                .map(|r| r.map(drop))
        };
        match res {
            Ok(Ok(())) => {
                if let Some(h) = slot.as_mut() {
                    h.in_flight = false;
                    h.session_ttl = secs;
                }
                Ok(renewed)
            }
            Ok(Err(e)) => self.broken(&mut slot, &e.to_string()),
            Err(e) => self.broken(&mut slot, &e.to_string()),
        }
    }
}

impl Renewing {
    /// With a lock-delay, moves the record's deadline to `ttl` (the
    /// holder's ttl and delay) from now, before the keepalive proves the
    /// row still held. A failure fails the renewal: the validity is not
    /// extended.
    async fn keep_record(&self, ttl: Duration) -> Result<()> {
        let Some(owner) = &self.delay_owner else {
            return Ok(());
        };
        let stmt = Autocommit::DelayKeep {
            name: &self.name,
            lease: ttl,
            owner,
        };
        self.shared
            .autocommit(stmt, "moving the lock-delay's deadline")
            .await
            .map(drop)
    }
}

/// What a renewal asks of the holding connection, in errors.
const KEEPALIVE: &str = "the keepalive of the holding connection";

#[async_trait]
impl BackendLease for MysqlLease {
    /// Proves the holding transaction alive on its connection and sets the
    /// session's `wait_timeout` from `ttl`; a holder whose row lock is
    /// published takes its user lock again where it lacked it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the statements run in a task of their own, which reads
    /// their reply even when the caller is gone, so the holding connection
    /// is never left with a reply unread. A dropped renewal at most renewed.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let job = Renewing {
            shared: self.shared.clone(),
            name: self.name.clone(),
            conn_id: self.conn_id,
            delay_owner: self.delay_owner.clone(),
            publish: self.publish,
            lost: self.lost.clone(),
        };
        // In a task of its own: a renewal whose caller goes away (a dropped
        // `extend`, a watchdog that gave up) still reads its reply, so the
        // holding connection is never left with a reply unread.
        self.conn.run(|slot| job.run(slot, ttl)).await
    }

    /// Lets go of the user locks, rolls the holding transaction back (which
    /// frees the row) and gives the connection back to the idle pool.
    ///
    /// # Cancel safety
    ///
    /// A release dropped while a renewal still had the connection took
    /// nothing: the lease is as it was (a dropped guard releases it in the
    /// background). One dropped after it took the connection out closes it
    /// dirty, which rolls the transaction back, so the row is freed at once
    /// or when the server notices the closed socket, never held on (its
    /// server thread is killed too, unless a cut-off renewal had already
    /// ended the session).
    async fn release(&self) -> Result<Released> {
        let Some(mut h) = self.conn.take().await else {
            return Ok(Released::NotHeld);
        };
        if let Some(owner) = &self.delay_owner {
            // The lock-delay's record first, while the row is still ours:
            // a clean release frees the name at once. One left behind (a
            // failure, logged) only delays the next holder.
            clear(self.shared.clone(), self.name.clone(), owner.clone()).await;
        }
        if h.in_flight {
            // A renewal was cut off mid-statement and its reply is unread:
            // the connection is closed and its session ended, which rolls
            // the transaction back (and frees the user lock). Whether it
            // still held the row then cannot be told: not held, as a lease
            // whose connection is gone.
            let id = h.id;
            h.kill_on_drop = false;
            drop(h);
            self.lost.cancel();
            if let Some(id) = id {
                self.shared.kill(id, false).await?;
            }
            return Ok(Released::NotHeld);
        }
        let rt = self.shared.cfg.request_timeout;
        // The user locks first (the row's, and its term's when it took
        // that instead): a later holder never finds them taken.
        let keys: Vec<&String> = h.user_lock.iter().chain(&h.term_lock).collect();
        if let Some(key) = keys.iter().find(|key| !is_user_lock_name(key)) {
            // Never the case (checked when taken): closed, dirty, which
            // frees all it holds.
            return Err(Error::backend_error(
                NAME,
                format!("a user lock named {key:?} cannot be released; the connection was closed"),
            ));
        }
        let sql = if keys.is_empty() {
            "ROLLBACK; SET SESSION wait_timeout = DEFAULT".to_owned()
        } else {
            let releases: Vec<String> = keys
                .iter()
                .map(|key| format!("RELEASE_LOCK('{key}')"))
                .collect();
            format!(
                "DO {}; ROLLBACK; SET SESSION wait_timeout = DEFAULT",
                releases.join(", ")
            )
        };
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(h.conn()?);
        match self.shared.answer("ROLLBACK", rt, true, fut).await {
            Ok(Ok(_)) => {
                h.dirty = false; // back to the pool
                Ok(Released::Released)
            }
            Ok(Err(e)) => {
                // The connection was gone (killed, timed out by the server):
                // the server had already rolled the transaction back.
                tracing::debug!(name = %self.name, error = %e, "release found the holding connection gone");
                self.lost.cancel();
                Ok(Released::NotHeld)
            }
            Err(e) => Err(Error::new(
                e.kind(),
                NAME,
                format!(
                    "{}; the connection was closed and its thread killed, so the row is freed when the server notices",
                    e.message()
                ),
            )),
        }
    }

    fn abandon(&self) {
        // As a dead process: the socket closes without COMMIT or ROLLBACK,
        // no KILL; the server rolls back when it sees the connection end.
        self.conn.abandon(|h| h.kill_on_drop = false);
    }
}
