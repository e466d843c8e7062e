//! The fencing counter, and what commits on its own apart from the
//! holding transaction: the value beside a lease and a lock-delay's record.
//!
//! A token is never below the server's clock in microseconds (UTC). A
//! lock's holder (one at a time: a lock, an election, a writer) sets its
//! counter row to the clock in its own transaction, with no commit: the
//! successor's token is read from the clock after this holder's
//! transaction ended, so it is larger even when that transaction rolled
//! back (a crash, a `KILL`, a server restart), as long as the clock does
//! not step back by more than the time between the two acquisitions.
//! Where the committed counter is not below the clock (readers and
//! permits, many in one microsecond, raised it past the clock), the holder
//! advances it on its own, committed, as readers and permits always do:
//! tokens go on rising from every committed one.

use std::time::Instant;

use lockcore::raw::prelude::*;
use sqlx::{AssertSqlSafe, Connection};

use crate::config::NAME;
use crate::conn::Shared;
use crate::core::MysqlBackend;
use crate::error::map_err;
use crate::sql::{hex, CLOCK_US};

impl MysqlBackend {
    /// Advances the name's fencing counter in its own autocommit statement
    /// (see [`autocommit`](MysqlBackend::autocommit)), recording the
    /// holder's connection id and owner.
    pub(crate) async fn next_fence(&self, name: &str, conn_id: u64, owner: String) -> Result<u64> {
        let done = self
            .shared
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

    /// The request that locks `row` for a lock's holder (`lock`, the
    /// locking read as built in `sql.rs`, with one `?` for the row) and, in
    /// the same transaction, sets its fencing counter to the server's clock
    /// where the counter is below it, recording the holder's connection id
    /// and owner (inspection reads them uncommitted): nothing commits, and
    /// the counter row stays locked until the transaction ends. Its last
    /// row is the counter's new value, or `NULL` when it was not set (the
    /// counter not below the clock, or no counter or lock row yet: the
    /// lock connection reads committed, so nothing else was locked), for
    /// the caller to advance it on its own ([`next_fence`](Self::next_fence)).
    /// The statements after a locking read that fails are not run.
    pub(crate) fn lock_and_fence_sql(
        &self,
        lock: &str,
        row: &str,
        conn_id: u64,
        owner: &str,
    ) -> String {
        let (table, fence) = (&self.shared.cfg.table, self.shared.cfg.fence_table());
        // Bytes as hex literals: safe in the text, compared byte for byte.
        let row = format!("X'{}'", hex(row.as_bytes()));
        let owner = format!("X'{}'", hex(owner.as_bytes()));
        let lock = lock.replacen('?', &row, 1);
        format!(
            "{lock}; UPDATE `{fence}` SET `fence` = LAST_INSERT_ID({CLOCK_US}), `holder_conn` = {conn_id}, `owner` = {owner} \
             WHERE `name` = {row} AND `fence` < {CLOCK_US} AND EXISTS (SELECT 1 FROM `{table}` WHERE `name` = {row}); \
             SELECT IF(ROW_COUNT() = 1, CAST(LAST_INSERT_ID() AS UNSIGNED), NULL), NULL"
        )
    }

    /// Records a candidate's value beside its lock, with the term (fencing
    /// token) it belongs to, in its own autocommit statement.
    pub(crate) async fn record_value(&self, name: &str, fence: u64, value: &str) -> Result<()> {
        self.shared
            .autocommit(
                Autocommit::Value { name, fence, value },
                "recording the leader's value",
            )
            .await
            .map(drop)
    }
}

impl Shared {
    /// Runs `stmt` in its own autocommit statement on another connection
    /// than the holding one (an idle one of its own, see `conn.rs`), so that
    /// it never rolls back with a dead holder. An idle connection that died
    /// (a server restart) fails at once and the statement is sent again on
    /// another: at worst a counter skips a value, and tokens still rise.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have committed the statement.
    pub(crate) async fn autocommit(
        &self,
        stmt: Autocommit<'_>,
        what: &str,
    ) -> Result<sqlx::mysql::MySqlQueryResult> {
        let sh = self;
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
                    Autocommit::DelaySet { name, lease, owner }
                    | Autocommit::DelayKeep { name, lease, owner } => {
                        let sql = match stmt {
                            Autocommit::DelaySet { .. } => &sh.sql.delay_set,
                            _ => &sh.sql.delay_keep,
                        };
                        sqlx::query(AssertSqlSafe(sql.clone()))
                            .bind(name.as_bytes())
                            .bind(u64::try_from(lease.as_micros()).unwrap_or(u64::MAX))
                            .bind(owner)
                            .execute(&mut c)
                            .await
                    }
                    Autocommit::DelayClear { name, owner } => {
                        sqlx::query(AssertSqlSafe(sh.sql.delay_clear.clone()))
                            .bind(name.as_bytes())
                            .bind(owner)
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

/// A statement [`autocommit`](Shared::autocommit) runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Autocommit<'a> {
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
    /// Record `owner`'s lock-delay deadline of `name`, `lease` (its ttl and
    /// delay) from now on the server's clock, over any record there.
    DelaySet {
        name: &'a str,
        lease: std::time::Duration,
        owner: &'a str,
    },
    /// Move `owner`'s deadline as [`Autocommit::DelaySet`], recreating its
    /// record if gone, leaving another owner's alone.
    DelayKeep {
        name: &'a str,
        lease: std::time::Duration,
        owner: &'a str,
    },
    /// Delete `owner`'s record of `name`.
    DelayClear { name: &'a str, owner: &'a str },
}
