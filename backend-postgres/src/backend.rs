//! [`Backend`] for PostgreSQL: a lock is a session-level advisory lock on a
//! connection of its own, tried in one statement that also advances the
//! fencing counter and names the holder, then, when the name is held,
//! awaited in the server's own queue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;
use lockcore::raw::waiting;
use sqlx::AssertSqlSafe;

use crate::config::NAME;
use crate::conn::{ask, LockConn};
use crate::core::PostgresBackend;
use crate::error::{code, map_err, session_gone, sqlstate};
use crate::lease::PgLease;
use crate::sql::{ttl_ms, Kind};

/// How `mode` is taken here: locks and a read-write lock's two roles;
/// semaphores are built from locks.
fn kind_of(mode: Mode) -> Result<Kind> {
    match mode {
        Mode::Exclusive => Ok(Kind::Lock),
        // (asked only with `rwlock=shared`, the default)
        Mode::Read => Ok(Kind::Reader),
        Mode::Write => Ok(Kind::Writer),
        _ => Err(Error::invalid_config(
            NAME,
            "semaphores are built from locks on PostgreSQL",
        )),
    }
}

/// What one try on a connection gave.
enum Tried {
    Granted(Grant),
    Held(LockConn),
    /// The connection was found closed (by a server restart, a terminated
    /// session): nothing was taken.
    Gone(Error),
}

#[async_trait]
impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, LeaseKind::Connection)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
            .rw_layout(self.shared.cfg.rwlock)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: a dropped acquisition closes its connection and ends
    /// its server session (`pg_terminate_backend`, in the background), with
    /// the lock it took or waited for.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let kind = kind_of(req.mode)?;
        let sh = &self.shared;
        let (mut c, mut reused) = sh.lock_conn().await?;
        let c = loop {
            match self.try_on(c, &req, kind).await? {
                Tried::Granted(g) => return Ok(Some(g)),
                Tried::Held(c) => break c,
                // An idle connection the server closed meanwhile (a
                // restart, a terminated session): once more on a new one.
                Tried::Gone(e) if reused => {
                    tracing::debug!(error = %e, "an idle connection was gone; trying on a new one");
                    c = sh.open().await?;
                    reused = false;
                }
                Tried::Gone(e) => return Err(e),
            }
        };
        if req.deadline == Deadline::Now {
            sh.give_back(c);
            return Ok(None);
        }
        waiting();
        self.wait_on(c, &req, kind).await
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        crate::holder::inspect(&self.shared, name).await.map(Some)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        crate::holder::list(&self.shared, prefix, limit)
            .await
            .map(Some)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        if self.shared.cfg.rwlock != Layout::Native {
            return Ok(None);
        }
        crate::holder::rw_holders(&self.shared, name, role).await
    }
}

impl PostgresBackend {
    /// Ends `pid`'s session if the acquisition on it is dropped.
    fn end_if_dropped(&self, session: (i32, i64)) -> CleanupOnDrop {
        let sh = self.shared.clone();
        CleanupOnDrop::new("end a dropped acquisition's server session", async move {
            sh.terminate(session).await;
        })
    }

    /// One try on `c`: granted (counter advanced, holder named, idle timeout
    /// set, all in one statement), or held by another session.
    async fn try_on(&self, mut c: LockConn, req: &AcquireRequest<'_>, kind: Kind) -> Result<Tried> {
        let sh = &self.shared;
        let owner = req.owner.to_string();
        let undo = self.end_if_dropped((c.pid, c.started));
        let sent = Instant::now();
        let trying = sqlx::query_as::<_, (bool, Option<i64>, Option<String>)>(AssertSqlSafe(
            sh.sql.taking(kind).try_lock.as_str(),
        ))
        .bind(req.name)
        .bind(&owner)
        .bind(req.value)
        .bind(ttl_ms(req.ttl))
        .bind(kind.row(req.name))
        .fetch_one(&mut c.conn);
        let limit = sh.cfg.request_timeout;
        let r = match tokio::time::timeout(limit, trying).await {
            Ok(Err(e)) if session_gone(&e) => {
                drop(c);
                // The session is gone already: nothing to end.
                undo.disarm();
                return Ok(Tried::Gone(
                    map_err(e, "trying the lock", &sh.server).with_name(req.name),
                ));
            }
            Ok(r) => r.map_err(|e| map_err(e, "trying the lock", &sh.server)),
            Err(_) => Err(Error::unavailable(
                NAME,
                format!(
                    "trying the lock on {}: no answer within {limit:?}",
                    sh.server
                ),
            )),
        };
        match r {
            Ok((true, Some(fence), _)) => {
                undo.disarm();
                Ok(Tried::Granted(self.grant(c, req, kind, fence, sent)?))
            }
            Ok((false, _, _)) => {
                undo.disarm();
                Ok(Tried::Held(c))
            }
            Ok((true, None, _)) => {
                drop(c);
                drop(undo);
                Err(
                    Error::backend_error(NAME, "the lock was taken but its row was not written")
                        .with_name(req.name),
                )
            }
            Err(e) => {
                // Closing the connection ends the session, and with it
                // anything the statement took; the session is also ended
                // on the server, in the background.
                drop(c);
                drop(undo);
                Err(e.with_name(req.name))
            }
        }
    }

    /// Waits in the server's queue on `c` until `req`'s deadline, then
    /// advances the counter and names the holder.
    async fn wait_on(
        &self,
        mut c: LockConn,
        req: &AcquireRequest<'_>,
        kind: Kind,
    ) -> Result<Option<Grant>> {
        let sh = &self.shared;
        let undo = self.end_if_dropped((c.pid, c.started));
        let (wait_ms, limit) = match req.deadline {
            Deadline::At(t) => {
                let left = t
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                (
                    left.as_millis().to_string(),
                    Some(left + sh.cfg.request_timeout),
                )
            }
            Deadline::Never | Deadline::Now => ("0".to_owned(), None),
        };
        let waited = sqlx::query(AssertSqlSafe(sh.sql.taking(kind).wait_lock.as_str()))
            .bind(req.name)
            .bind(wait_ms)
            .bind(ttl_ms(req.ttl))
            .execute(&mut c.conn);
        let waited = match limit {
            Some(limit) => tokio::time::timeout(limit, waited).await.map_err(|_| limit),
            None => Ok(waited.await),
        };
        match waited {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if sqlstate(&e).as_deref() == Some(code::LOCK_NOT_AVAILABLE) => {
                undo.disarm();
                self.keep_after_timeout(c).await;
                return Ok(None);
            }
            Ok(Err(e)) => {
                drop(c);
                drop(undo);
                return Err(map_err(e, "waiting for the lock", &sh.server).with_name(req.name));
            }
            Err(limit) => {
                drop(c);
                drop(undo);
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "waiting for the lock on {}: no answer within {limit:?}",
                        sh.server
                    ),
                )
                .with_name(req.name));
            }
        }
        let owner = req.owner.to_string();
        let sent = Instant::now();
        let r = ask(
            sh,
            "naming the holder",
            sh.cfg.request_timeout,
            false,
            sqlx::query_as::<_, (Option<i64>, Option<String>)>(AssertSqlSafe(
                sh.sql.taking(kind).granted.as_str(),
            ))
            .bind(req.name)
            .bind(&owner)
            .bind(req.value)
            .bind(ttl_ms(req.ttl))
            .bind(kind.row(req.name))
            .fetch_one(&mut c.conn),
        )
        .await;
        match r {
            Ok((Some(fence), _)) => {
                undo.disarm();
                self.grant(c, req, kind, fence, sent).map(Some)
            }
            Ok((None, _)) => {
                drop(c);
                drop(undo);
                Err(
                    Error::backend_error(NAME, "the holder's row was not written")
                        .with_name(req.name),
                )
            }
            Err(e) => {
                drop(c);
                drop(undo);
                Err(e.with_name(req.name))
            }
        }
    }

    /// A connection whose wait ran out keeps `lock_timeout` set: set back
    /// to none, it is kept for reuse.
    async fn keep_after_timeout(&self, mut c: LockConn) {
        let sh = &self.shared;
        let reset = ask(
            sh,
            "resetting lock_timeout",
            sh.cfg.request_timeout,
            false,
            sqlx::query("SET lock_timeout = 0").execute(&mut c.conn),
        )
        .await;
        if reset.is_ok() {
            sh.give_back(c);
        }
    }

    /// The grant of `req` held on `c` with `fence`, valid from `sent`.
    fn grant(
        &self,
        c: LockConn,
        req: &AcquireRequest<'_>,
        kind: Kind,
        fence: i64,
        sent: Instant,
    ) -> Result<Grant> {
        let fence = u64::try_from(fence).map_err(|_| {
            Error::backend_error(NAME, format!("fencing counter {fence} is negative"))
                .with_name(req.name)
        })?;
        Ok(Grant {
            lease: Box::new(PgLease::new(
                Arc::clone(&self.shared),
                c,
                (req.name, kind),
                req.owner.to_string(),
            )),
            fence: Some(fence),
            valid_until: validity_deadline(sent, req.ttl),
        })
    }
}
