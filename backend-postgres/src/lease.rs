//! A held lock: the connection whose session holds the advisory lock. A
//! renewal sets the session's `idle_session_timeout` to the ttl again, so a
//! holder that stalls loses its session, and the lock, within the ttl; a
//! release unlocks and keeps the connection for reuse.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::held_conn::HeldConn;
use lockcore::raw::prelude::*;
use sqlx::AssertSqlSafe;

use crate::config::NAME;
use crate::conn::{LockConn, Shared};
use crate::error::{map_err, session_gone};
use crate::sql::{ttl_ms, Kind};

/// The lease of one held lock.
#[derive(Debug)]
pub(crate) struct PgLease {
    held: HeldConn<LockConn>,
    shared: Arc<Shared>,
    name: String,
    kind: Kind,
    owner: String,
}

impl PgLease {
    /// The lease of `name` taken as `kind` by `owner` on `conn`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        conn: LockConn,
        (name, kind): (&str, Kind),
        owner: String,
    ) -> Self {
        PgLease {
            held: HeldConn::new(NAME, conn),
            shared,
            name: name.to_owned(),
            kind,
            owner,
        }
    }
}

#[async_trait]
impl BackendLease for PgLease {
    /// # Cancel safety
    ///
    /// Cancel safe: the statement runs to its end in a task of its own.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let sh = Arc::clone(&self.shared);
        let statement = self.shared.sql.renew;
        let limit = self.shared.cfg.request_timeout;
        let sent = Instant::now();
        let renewing = self.held.run(move |mut slot| async move {
            let Some(c) = slot.as_mut() else {
                return Ok(false);
            };
            let renewal = sqlx::query(statement)
                .bind(ttl_ms(ttl))
                .execute(&mut c.conn);
            match tokio::time::timeout(limit, renewal).await {
                Ok(Ok(_)) => Ok(true),
                Ok(Err(e)) if session_gone(&e) => {
                    slot.take();
                    Ok(false)
                }
                Ok(Err(e)) => Err(map_err(e, "renewing", &sh.server)),
                // Unanswered: the connection is closed (the server ends
                // the session, and the lock, once it sees that), so that
                // no later request reads this one's reply, and nothing
                // waits behind it.
                Err(_) => {
                    slot.take();
                    Err(Error::new(
                        ErrorKind::Indeterminate,
                        NAME,
                        format!(
                            "renewing on {}: no answer within {limit:?}; the connection is closed",
                            sh.server
                        ),
                    ))
                }
            }
        });
        let renewed = renewing.await;
        match renewed.map_err(|e| e.with_name(&self.name))? {
            true => Ok(Renewal::Renewed {
                valid_until: validity_deadline(sent, ttl),
            }),
            false => Ok(Renewal::Lost),
        }
    }

    /// # Cancel safety
    ///
    /// A dropped release closes the connection, which ends the session and
    /// its lock.
    async fn release(&self) -> Result<Released> {
        let sh = &self.shared;
        // A renewal in flight ends within the request timeout.
        let taken = tokio::time::timeout(2 * sh.cfg.request_timeout, self.held.take()).await;
        let Ok(taken) = taken else {
            self.held.abandon(|_| {});
            return Err(Error::new(
                ErrorKind::Indeterminate,
                NAME,
                format!(
                    "releasing on {}: a renewal in flight did not end; the connection is closed",
                    sh.server
                ),
            )
            .with_name(&self.name));
        };
        let Some(mut c) = taken else {
            return Ok(Released::NotHeld);
        };
        let releasing = sqlx::query_as::<_, (bool, Option<String>)>(AssertSqlSafe(
            sh.sql.taking(self.kind).release.as_str(),
        ))
        .bind(&self.name)
        .bind(&self.owner)
        .bind(self.kind.row(&self.name))
        .fetch_one(&mut c.conn);
        match tokio::time::timeout(sh.cfg.request_timeout, releasing).await {
            Ok(Ok((true, _))) => {
                sh.give_back(c);
                Ok(Released::Released)
            }
            Ok(Ok((false, _))) => Ok(Released::NotHeld),
            Ok(Err(e)) if session_gone(&e) => Ok(Released::NotHeld),
            Ok(Err(e)) => Err(map_err(e, "releasing", &sh.server).with_name(&self.name)),
            Err(_) => Err(Error::new(
                ErrorKind::Indeterminate,
                NAME,
                format!(
                    "releasing on {}: no answer within {:?}; the connection is closed, which ends the lock once the server sees it",
                    sh.server, sh.cfg.request_timeout
                ),
            )
            .with_name(&self.name)),
        }
    }

    fn abandon(&self) {
        self.held.abandon(|_| {});
    }
}
