//! What commits on its own, apart from the holding transaction: the
//! fencing counter and the value beside a lease.

use std::time::Instant;

use lockcore::raw::prelude::*;
use sqlx::{AssertSqlSafe, Connection};

use crate::config::NAME;
use crate::core::MysqlBackend;
use crate::error::map_err;

impl MysqlBackend {
    /// Advances the name's fencing counter in its own autocommit statement
    /// (see [`autocommit`](MysqlBackend::autocommit)), recording the
    /// holder's connection id and owner.
    pub(crate) async fn next_fence(&self, name: &str, conn_id: u64, owner: String) -> Result<u64> {
        let done = self
            .autocommit(
                Autocommit::Fence {
                    name,
                    conn_id,
                    owner: &owner,
                },
                "advancing the fencing counter",
            )
            .await?;
        match done.last_insert_id() {
            0 => Err(Error::backend_error(
                NAME,
                "the fencing counter statement returned no value",
            )),
            f => Ok(f),
        }
    }

    /// Records a candidate's value beside its lock, with the term (fencing
    /// token) it belongs to, in its own autocommit statement.
    pub(crate) async fn record_value(&self, name: &str, fence: u64, value: &str) -> Result<()> {
        self.autocommit(
            Autocommit::Value { name, fence, value },
            "recording the leader's value",
        )
        .await
        .map(drop)
    }

    /// Runs `stmt` in its own autocommit statement on another connection
    /// than the holding one (an idle one of its own, see `conn.rs`), so that
    /// it never rolls back with a dead holder. An idle connection that died
    /// (a server restart) fails at once and the statement is sent again on
    /// another: at worst a counter skips a value, and tokens still rise.
    async fn autocommit(
        &self,
        stmt: Autocommit<'_>,
        what: &str,
    ) -> Result<sqlx::mysql::MySqlQueryResult> {
        let sh = &self.shared;
        let give_up = Instant::now() + sh.cfg.request_timeout;
        let mut tries = sh.cfg.pool_size + 1;
        loop {
            // A connection first: nothing is sent until there is one, so
            // one that did not come in time is Unavailable.
            let left = give_up.saturating_duration_since(Instant::now());
            let getting = async {
                match sh.fence_idle.take(left).await {
                    Some(c) => Ok((c, true)),
                    None => sqlx::MySqlConnection::connect_with(&sh.opts)
                        .await
                        .map(|c| (c, false)),
                }
            };
            let (mut c, reused) = sh
                .answer("connecting", left, false, getting)
                .await?
                .map_err(|e| map_err(e, "connecting", &sh.server))?;
            // The write itself: one that did not answer may have committed.
            // Dropped unanswered, the connection is closed with it.
            let left = give_up.saturating_duration_since(Instant::now());
            let writing = async move {
                let done = match stmt {
                    Autocommit::Fence {
                        name,
                        conn_id,
                        owner,
                    } => {
                        sqlx::query(AssertSqlSafe(sh.sql.fence.clone()))
                            .bind(name.as_bytes())
                            .bind(conn_id)
                            .bind(owner)
                            .execute(&mut c)
                            .await
                    }
                    Autocommit::Value { name, fence, value } => {
                        sqlx::query(AssertSqlSafe(sh.sql.value.clone()))
                            .bind(name.as_bytes())
                            .bind(fence)
                            .bind(value.as_bytes())
                            .execute(&mut c)
                            .await
                    }
                };
                (c, done)
            };
            let written = async { Ok::<_, std::convert::Infallible>(writing.await) };
            let Ok((c, done)) = sh.answer(what, left, true, written).await?;
            return match done {
                Ok(done) => {
                    sh.fence_idle.park(c);
                    Ok(done)
                }
                // A dead idle connection (it is dropped): send again.
                Err(sqlx::Error::Io(_)) if reused && tries > 1 => {
                    tries -= 1;
                    tracing::debug!("an idle connection was dead; sending again");
                    continue;
                }
                Err(sqlx::Error::Io(_)) if reused => {
                    Err(Error::unavailable(NAME, "a dead idle connection"))
                }
                Err(e) => Err(map_err(e, what, &sh.server)),
            };
        }
    }
}

/// A statement [`autocommit`](MysqlBackend::autocommit) runs.
#[derive(Debug, Clone, Copy)]
enum Autocommit<'a> {
    /// Advance `name`'s fencing counter for the holder `conn_id`, `owner`.
    Fence {
        name: &'a str,
        conn_id: u64,
        owner: &'a str,
    },
    /// Record `value` as the value of `name`'s holder of term `fence`.
    Value {
        name: &'a str,
        fence: u64,
        value: &'a str,
    },
}
