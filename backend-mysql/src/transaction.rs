//! The statements of a holding transaction: start it, lock the row (and
//! create it on first use), advance the fencing counter, prove the
//! transaction alive, end it.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lockcore::raw::prelude::*;
use sqlx::{AssertSqlSafe, Either, Row};

use crate::config::NAME;
use crate::conn::{Holding, LockConn};
use crate::core::MysqlBackend;
use crate::error::{code, db_number, map_err};
use crate::sql::{hex, FOREVER_CHUNK_SECS};

/// How long a try looks again at a row another client is creating (2 ms
/// apart) before it takes the refusal as a holder's (a plain SQL session
/// that inserted the row and keeps its transaction open holds it).
const ROW_BEING_CREATED: Duration = Duration::from_millis(50);

impl MysqlBackend {
    /// A connection with the holding transaction started; an idle pooled
    /// connection that died with a server restart (the pool hands it out
    /// untested) is replaced once.
    pub(crate) async fn open_transaction(
        &self,
        ttl_secs: u64,
        lock_wait_secs: u64,
    ) -> Result<Holding> {
        let sh = &self.shared;
        let conn = self.shared.lock_conn().await?;
        let pooled = matches!(conn, LockConn::Pooled(_));
        let mut h = Holding::new(conn, sh.clone());
        match self.begin(&mut h, ttl_secs, lock_wait_secs).await {
            Ok(()) => Ok(h),
            Err(e) if pooled && e.kind() == ErrorKind::Unavailable => {
                tracing::debug!(error = %e, "an idle pooled connection was dead; opening a new one");
                drop(h);
                let mut h = Holding::new(
                    self.shared.own_conn(sh.cfg.connect_timeout).await?,
                    sh.clone(),
                );
                self.begin(&mut h, ttl_secs, lock_wait_secs).await?;
                Ok(h)
            }
            Err(e) => Err(e),
        }
    }

    /// Locks the row of `name` on `h`'s transaction within `deadline`
    /// (creating the row on first use): when the locking read that got it
    /// was sent, `None` when the deadline passed. With `fence_for`, an
    /// owner, the same request sets the fencing counter of the row (see
    /// [`lock_and_fence_sql`](MysqlBackend::lock_and_fence_sql)): the token
    /// is left in `h.fence`.
    pub(crate) async fn wait_for_row(
        &self,
        h: &mut Holding,
        name: &str,
        deadline: Deadline,
        first_wait: u64,
        shared: bool,
        fence_for: Option<&str>,
    ) -> Result<Option<Instant>> {
        let mut wait_set = first_wait;
        let mut created = false;
        let mut first_refusal: Option<Instant> = None;
        let mut seen_committed = false;
        loop {
            if let Deadline::At(t) = deadline {
                let left = t.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                let want = left.as_secs().max(1);
                if want != wait_set {
                    self.exec_raw(
                        h,
                        format!("SET SESSION innodb_lock_wait_timeout = {want}"),
                        "setting the lock wait",
                    )
                    .await?;
                    wait_set = want;
                }
            }
            let sent = Instant::now();
            match self.lock_row(h, name, deadline, shared, fence_for).await? {
                Some(true) => return Ok(Some(sent)),
                Some(false) if !created => {
                    self.create_row(h, name).await?;
                    created = true;
                }
                Some(false) => {
                    return Err(Error::backend_error(
                        NAME,
                        format!(
                            "the lock row vanished right after it was created in `{}`; is something deleting rows?",
                            self.shared.cfg.table
                        ),
                    ))
                }
                None if matches!(deadline, Deadline::Now) => {
                    // A try refused by a row another client is inserting
                    // (its insert's lock, not a holder's): once the row is
                    // committed, the try is made again, and once more
                    // (the insert's lock goes a moment after its row shows
                    // committed). Refused again, the row has a holder.
                    if seen_committed {
                        return Ok(None);
                    }
                    let looked_since = *first_refusal.get_or_insert_with(Instant::now);
                    if looked_since.elapsed() >= ROW_BEING_CREATED {
                        return Ok(None);
                    }
                    if self.begin_again_and_look(h, name).await? {
                        seen_committed = true;
                    } else {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                None => {
                    // The lock wait ran out: go on waiting, in a transaction
                    // begun again. A server with innodb_rollback_on_timeout
                    // rolled the whole transaction back, leaving the session
                    // in autocommit, where the next locking read would
                    // return the row and hold nothing.
                    self.exec_raw(
                        h,
                        "ROLLBACK".to_owned(),
                        "rolling back a timed-out wait",
                    )
                    .await?;
                    self.exec_raw(
                        h,
                        "START TRANSACTION".to_owned(),
                        "starting the lock transaction",
                    )
                    .await?;
                }
            }
        }
    }

    /// After a refused try, in one request: the transaction begun again
    /// (the refusal may have rolled it back whole, with
    /// innodb_rollback_on_timeout, since MariaDB's NOWAIT is a lock wait;
    /// the next locking read must not run in autocommit, where it would
    /// return the row and hold nothing), and whether the row of `name` is
    /// there and committed, by a read that locks nothing.
    async fn begin_again_and_look(&self, h: &mut Holding, name: &str) -> Result<bool> {
        let sh = &self.shared;
        let what = "starting the lock transaction again";
        // The name as a hex literal: bytes only, so safe in the text.
        let hex = hex(name.as_bytes());
        let sql = format!(
            "ROLLBACK; START TRANSACTION; SELECT 1 FROM `{}` WHERE `name` = X'{hex}'",
            sh.cfg.table
        );
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(h.conn()?);
        let rows = sh
            .answer(what, sh.cfg.request_timeout, false, fut)
            .await?
            .map_err(|e| map_err(e, what, &sh.server))?;
        Ok(!rows.is_empty())
    }

    /// One round trip on the holding transaction: it is alive.
    pub(crate) async fn prove_alive(&self, h: &mut Holding) -> Result<()> {
        let sh = &self.shared;
        let fut = sqlx::query("SELECT 1").fetch_one(h.conn()?);
        match sh
            .answer("checking the holding connection", sh.cfg.request_timeout, false, fut)
            .await?
        {
            Ok(_) => Ok(()),
            Err(e) => Err(Error::new(
                ErrorKind::Unavailable,
                NAME,
                format!(
                    "the holding connection to {} broke right after the lock was taken; it was not granted: {e}",
                    sh.server
                ),
            )
            .with_source(e)),
        }
    }

    /// Starts the holding transaction: sets the session's idle timeout from
    /// the ttl and its lock wait timeout, and learns the connection id.
    pub(crate) async fn begin(
        &self,
        h: &mut Holding,
        ttl_secs: u64,
        lock_wait_secs: u64,
    ) -> Result<()> {
        let sh = self.shared.clone();
        let sql = format!(
            "SET SESSION wait_timeout = {ttl_secs}, innodb_lock_wait_timeout = {lock_wait_secs}; START TRANSACTION; SELECT CAST(CONNECTION_ID() AS UNSIGNED)"
        );
        h.dirty = true;
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(h.conn()?);
        let rows = sh
            .answer(
                "starting the lock transaction",
                sh.cfg.request_timeout,
                false,
                fut,
            )
            .await?
            .map_err(|e| map_err(e, "starting the lock transaction", &sh.server))?;
        let id = rows
            .last()
            .map(|r| r.try_get::<u64, _>(0))
            .transpose()
            .map_err(|e| map_err(e, "reading the connection id", &sh.server))?
            .ok_or_else(|| Error::backend_error(NAME, "CONNECTION_ID() returned no row"))?;
        h.id = Some(id);
        h.session_ttl = ttl_secs;
        Ok(())
    }

    /// Runs a short statement on the holding connection.
    pub(crate) async fn exec_raw(&self, h: &mut Holding, sql: String, what: &str) -> Result<()> {
        let sh = &self.shared;
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(h.conn()?);
        sh.answer(what, sh.cfg.request_timeout, false, fut)
            .await?
            .map_err(|e| map_err(e, what, &sh.server))?;
        Ok(())
    }

    /// Ends the transaction and hands the connection back to the pool.
    pub(crate) async fn give_back(&self, mut h: Holding) -> Result<()> {
        self.exec_raw(
            &mut h,
            "ROLLBACK; SET SESSION wait_timeout = DEFAULT".to_owned(),
            "rolling back",
        )
        .await?;
        h.dirty = false;
        Ok(())
    }

    /// One locking read on the held transaction. `Ok(Some(true))`: locked;
    /// `Ok(Some(false))`: the row does not exist; `Ok(None)`: held by another
    /// (the wait or `NOWAIT` ended). With `fence_for`, as
    /// [`wait_for_row`](Self::wait_for_row).
    pub(crate) async fn lock_row(
        &self,
        h: &mut Holding,
        name: &str,
        deadline: Deadline,
        shared: bool,
        fence_for: Option<&str>,
    ) -> Result<Option<bool>> {
        let sh = self.shared.clone();
        let what = "locking the row";
        let held_err = |e: &sqlx::Error| {
            matches!(
                db_number(e),
                Some(code::LOCK_WAIT_TIMEOUT | code::LOCK_NOWAIT | code::QUERY_INTERRUPTED)
            )
        };
        let (nowait, wait) = if shared {
            (&sh.sql.share_nowait, &sh.sql.share_wait)
        } else {
            (&sh.sql.lock_nowait, &sh.sql.lock_wait)
        };
        let (sql, client_limit, cut_at) = match deadline {
            Deadline::Now => (nowait.clone(), sh.cfg.request_timeout, None),
            Deadline::At(t) => {
                let secs = t.saturating_duration_since(Instant::now()).as_secs();
                if secs >= 1 {
                    // The server's own lock wait for the whole seconds.
                    (
                        wait.clone(),
                        Duration::from_secs(secs) + sh.cfg.request_timeout,
                        None,
                    )
                } else {
                    // The sub-second rest: wait up to 1 s on the server and
                    // cut the wait at the deadline with KILL QUERY.
                    (
                        wait.clone(),
                        Duration::from_secs(1) + sh.cfg.request_timeout,
                        Some(t),
                    )
                }
            }
            Deadline::Never => (
                wait.clone(),
                Duration::from_secs(FOREVER_CHUNK_SECS) + sh.cfg.request_timeout,
                None,
            ),
        };
        let id = h.id;
        h.fence = None;
        let fenced = fence_for
            .map(|owner| self.lock_and_fence_sql(&sql, name, id.unwrap_or_default(), owner));
        let conn = h.conn()?;
        let fut = async move {
            match fenced {
                Some(sql) => locked_and_fenced(conn, sql).await,
                None => sqlx::query(AssertSqlSafe(sql))
                    .bind(name.as_bytes())
                    .fetch_optional(conn)
                    .await
                    .map(|row| (row.is_some(), None))
                    .map_err(|e| (false, e)),
            }
        };
        // A statement of the holding transaction: one that did not answer
        // is rolled back with its connection.
        let fut = sh.answer(what, client_limit, false, fut);
        let res = async {
            tokio::pin!(fut);
            match cut_at {
                None => fut.await,
                Some(t) => {
                    tokio::select! {
                        r = &mut fut => r,
                        () = tokio::time::sleep_until(t.into()) => {
                            if let Some(id) = id {
                                sh.kill(id, true).await?;
                            }
                            fut.await
                        }
                    }
                }
            }
        }
        .await;
        match res? {
            Ok((locked, fence)) => {
                // A row committed between the read and the counter's
                // statement is not held: its token, if set, goes with the
                // rollback that follows.
                h.fence = fence.filter(|_| locked);
                Ok(Some(locked))
            }
            // The row locked, its counter row held by another session past
            // the lock wait (no client of ours holds it without the lock's
            // row): the transaction, maybe rolled back whole, is closed with
            // the error. Cut at the deadline instead, it was not had in time.
            Err((true, e)) if db_number(&e) == Some(code::LOCK_WAIT_TIMEOUT) => Err(Error::unavailable(
                NAME,
                format!(
                    "the fencing counter row of {name:?} in `{}` is locked by a session outside this library: {e}",
                    sh.cfg.fence_table()
                ),
            )
            .with_source(e)),
            Err((_, e)) if held_err(&e) => Ok(None),
            Err((_, e)) => Err(map_err(e, what, &sh.server)),
        }
    }

    /// Creates the row of `name` outside the holding transaction, then
    /// starts a new one.
    pub(crate) async fn create_row(&self, h: &mut Holding, name: &str) -> Result<()> {
        let sh = self.shared.clone();
        self.exec_raw(h, "ROLLBACK".to_owned(), "rolling back")
            .await?;
        let fut = sqlx::query(AssertSqlSafe(sh.sql.insert_row.clone()))
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .execute(h.conn()?);
        // An autocommit insert (the transaction was rolled back first) of
        // an unlocked row: created or not, nothing is held, so one that
        // did not answer is Unavailable.
        match sh
            .answer("creating the lock row", sh.cfg.request_timeout, false, fut)
            .await?
        {
            Ok(_) => {}
            // There already, or the duplicate check waited on the row
            // created after this statement looked and then held: there
            // either way.
            Err(e)
                if matches!(
                    db_number(&e),
                    Some(code::DUP_ENTRY | code::LOCK_WAIT_TIMEOUT)
                ) => {}
            Err(e) => return Err(map_err(e, "creating the lock row", &sh.server)),
        }
        self.exec_raw(
            h,
            "START TRANSACTION".to_owned(),
            "starting the lock transaction",
        )
        .await
    }
}

/// Runs a [`lock_and_fence_sql`](MysqlBackend::lock_and_fence_sql) request:
/// whether the row was locked, and the token set. An error says whether
/// it came after the row was locked (from the counter's statements).
async fn locked_and_fenced(
    conn: &mut sqlx::MySqlConnection,
    sql: String,
) -> std::result::Result<(bool, Option<u64>), (bool, sqlx::Error)> {
    let mut replies = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_many(conn);
    let (mut locked, mut fence) = (false, None);
    while let Some(reply) = replies.next().await {
        match reply {
            // The locking read's row has one column, the last reply two.
            Ok(Either::Right(row)) if row.len() == 1 => locked = true,
            Ok(Either::Right(row)) => {
                fence = row.try_get::<Option<u64>, _>(0).map_err(|e| (locked, e))?;
            }
            Ok(Either::Left(_)) => {}
            Err(e) => return Err((locked, e)),
        }
    }
    Ok((locked, fence))
}
