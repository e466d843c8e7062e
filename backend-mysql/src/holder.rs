//! Finding who holds a name: inspection (the holder's published user lock
//! against its fencing row, and whether the row is locked at all), and, as
//! an operator would, the session to end, checked against the server's
//! lock-wait graph.

use std::time::{Duration, Instant};

use lockcore::raw::Deadline;
use lockcore::{Error, Result};
use lockcore::{HolderInfo, LockInfo};
use sqlx::{AssertSqlSafe, Row};

use crate::config::NAME;
use crate::conn::AuxConn;
use crate::conn::Holding;
use crate::core::MysqlBackend;
use crate::error::{code, db_number, map_err};
use crate::sql::waits;

/// How long inspection waits, at most, between its reads when it catches a
/// hand-over, or a holder that has its row but has not published itself
/// yet (see [`MysqlBackend::inspect_row`]): 10, 20, 40, 80 then 160 ms.
const INSPECT_BACKOFF: [u64; 5] = [10, 20, 40, 80, 160];

impl MysqlBackend {
    /// Who holds lock `name`: the session holding the row's user lock
    /// (`IS_USED_LOCK`) when it is the one the fencing row records, with
    /// that row's owner and token, and the value recorded for that token.
    /// Every holder writes its fencing row and value before it takes the
    /// user lock, and lets go of the user lock before its row, so a user
    /// lock held by the recorded connection is the current holding. A
    /// holder that found the row's user lock taken took the user lock of
    /// its term instead (see `transaction::publish`): with the row's user
    /// lock free, the term's held by the recorded connection names the
    /// holder just as well.
    ///
    /// The rows are read before the user lock is looked at, in one
    /// statement: a new holder may come between the two. A user lock held
    /// by a connection the fencing row does not name (a hand-over caught in
    /// the middle, a dead holder's session not yet ended) is read again,
    /// for up to about 300 ms; after that it is an error, not a holder
    /// without a name (a session outside the library holds the user lock,
    /// or a dropped acquisition's fencing row came late). A value row older
    /// than the token (a candidate whose value was committed between the two
    /// reads, or a plain lock's holder) is read once more.
    ///
    /// With no user lock held, the name is free only if its row is: a
    /// holder that has its row but has not published itself yet (between
    /// its locking read and its `GET_LOCK`, or left unpublished by a
    /// squatted user lock in an earlier client version), or a plain SQL
    /// session that locks the row, holds the name all the same. So one more
    /// request asks the server whether the row is locked, without waiting
    /// ([`row_locked`](MysqlBackend::row_locked)). If it is, the rows and
    /// user locks are read again, as above (a holder publishes itself a
    /// round trip or two after it has its row, so an election's observer
    /// sees its value rather than an unnamed leader); still unnamed after
    /// about 300 ms, the holder is shown with no owner, token or value
    /// (owner pending), never as free.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (a probe's shared row lock ends with its
    /// connection, which is closed when dropped mid-request).
    pub(crate) async fn inspect_row(&self, name: &str) -> Result<LockInfo> {
        let mut waits = INSPECT_BACKOFF.iter();
        let mut value_read_again = false;
        loop {
            let seen = self.read_holder(name).await?;
            match seen {
                Some(seen) if seen.names_holder() => {
                    let stale_value = seen.value_fence.is_some_and(|f| f < seen.fence);
                    if stale_value && !value_read_again {
                        value_read_again = true;
                        continue;
                    }
                    let value = seen
                        .value
                        .filter(|_| seen.value_fence == Some(seen.fence))
                        .map(|v| String::from_utf8_lossy(&v).into_owned());
                    let holder =
                        HolderInfo::new(seen.owner, Some(seen.fence), None).with_value(value);
                    return Ok(LockInfo::new(Some(holder), None));
                }
                Some(Seen {
                    using: Some(using),
                    recorded,
                    ..
                }) => match waits.next() {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
                    None => {
                        return Err(Error::backend_error(
                            NAME,
                            format!(
                                "the user lock of {name:?} is held by connection {using}, which its fencing row does not name ({recorded:?}): a session outside this library holds it, or a holder's record came late; who holds the name cannot be told"
                            ),
                        )
                        .with_name(name))
                    }
                },
                // No user lock held (or no fencing row yet): free only if
                // the row is; locked, read again until the holder is named.
                _ => {
                    if !self.row_locked(name).await? {
                        return Ok(LockInfo::new(None, None));
                    }
                    match waits.next() {
                        Some(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
                        None => {
                            let pending = HolderInfo::new(None, None, None);
                            return Ok(LockInfo::new(Some(pending), None));
                        }
                    }
                }
            }
        }
    }

    /// One read of the rows and user locks of `name`: `None` when it has
    /// no fencing row.
    async fn read_holder(&self, name: &str) -> Result<Option<Seen>> {
        let sh = &self.shared;
        let what = "inspecting the holder";
        let mut aux = AuxConn::take(sh, what).await?;
        let q = sqlx::query(AssertSqlSafe(sh.sql.inspect.clone()))
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .fetch_optional(aux.conn()?);
        let row = sh.answer(what, sh.cfg.request_timeout, false, q).await?;
        aux.finished_if(&row);
        let row = row.map_err(|e| map_err(e, what, &sh.server))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let get = |e: sqlx::Error| map_err(e, what, &sh.server);
        Ok(Some(Seen {
            fence: row.try_get(0).map_err(get)?,
            owner: row.try_get(1).map_err(get)?,
            recorded: row.try_get(2).map_err(get)?,
            using: row.try_get(3).map_err(get)?,
            value: row.try_get(4).map_err(get)?,
            value_fence: row.try_get(5).map_err(get)?,
            term_using: row.try_get(6).map_err(get)?,
        }))
    }

    /// Whether some transaction holds the row of `name` now (see
    /// [`Sql::row_probe`](crate::sql::Sql::row_probe)): a shared lock on
    /// it asked with `NOWAIT`, in a transaction of its own on an auxiliary
    /// connection, rolled back at once. A missing row is not locked. The
    /// probe holds the row shared for the moment between its read and its
    /// rollback: a try that asks for the row in that moment is refused
    /// once, and asks again (see `wait_for_row`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped probe's connection is closed, not returned to
    /// the pool, which ends its transaction.
    async fn row_locked(&self, name: &str) -> Result<bool> {
        let sh = &self.shared;
        let what = "looking whether the lock row is locked";
        let rt = sh.cfg.request_timeout;
        let mut aux = AuxConn::take(sh, what).await?;
        let probe = sqlx::raw_sql(AssertSqlSafe(sh.sql.row_probe(name))).execute(aux.conn()?);
        let probed = sh.answer(what, rt, false, probe).await?;
        match probed {
            Ok(_) => {
                aux.finished_if(&probed);
                Ok(false)
            }
            Err(e)
                if matches!(
                    db_number(&e),
                    Some(code::LOCK_NOWAIT | code::LOCK_WAIT_TIMEOUT)
                ) =>
            {
                // Refused: the request stopped there, its transaction open
                // (holding nothing). Ended here, or the connection is not
                // returned to the pool.
                let rollback = sqlx::raw_sql("ROLLBACK").execute(aux.conn()?);
                let done = sh.answer(what, rt, false, rollback).await?;
                aux.finished_if(&done);
                done.map_err(|e| map_err(e, what, &sh.server))?;
                Ok(true)
            }
            // Any other error may leave the probe's transaction open: the
            // connection is closed, not returned to the pool.
            Err(e) => Err(map_err(e, what, &sh.server)),
        }
    }

    /// The server connection id (`CONNECTION_ID()`) of the session holding
    /// `name`, if the name is held: what an operator passes to `KILL` to end
    /// the lock.
    ///
    /// Each holder records its connection id in the fencing row while it
    /// holds; but a connection that released the name may hold another one
    /// by now. So the recorded id counts only if the server itself shows it
    /// holding this name's row: a probe transaction asks for the row lock,
    /// and the server's lock-wait graph (`information_schema.INNODB_LOCK_WAITS`
    /// on MariaDB, `performance_schema.data_lock_waits` on MySQL 8) must show
    /// the recorded connection blocking it. With `fencing=none` nothing is
    /// recorded, and the holder is the one session that graph shows blocking
    /// the probe. Needs the `PROCESS` privilege.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`](lockcore::ErrorKind::Unavailable) when the
    /// server does not answer, [`ErrorKind::InvalidConfig`](lockcore::ErrorKind::InvalidConfig)
    /// without the `PROCESS` privilege.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (the probe's connection is closed, and its
    /// wait ended, when it is dropped).
    pub async fn holder_connection(&self, name: &str) -> Result<Option<u64>> {
        let mut probe = Holding::new(
            self.shared
                .own_conn(self.shared.cfg.connect_timeout)
                .await?,
            self.shared.clone(),
        );
        self.verified_holder(&mut probe, name).await
    }

    /// Ends the lock on `name` as an operator would: `KILL` of the holding
    /// session (its transaction rolls back, the next waiter gets the row).
    /// Returns whether a holder was found. Only the session the server shows
    /// holding this name's row is killed (see
    /// [`holder_connection`](MysqlBackend::holder_connection)).
    ///
    /// # Errors
    ///
    /// As [`holder_connection`](MysqlBackend::holder_connection);
    /// [`ErrorKind::Indeterminate`](lockcore::ErrorKind::Indeterminate) when
    /// the `KILL` was sent and not answered (it may have ended the holder);
    /// and an error when the `KILL` is refused (it needs the `CONNECTION ADMIN` privilege for other
    /// users' sessions).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have killed the holder.
    pub async fn kill_holder(&self, name: &str) -> Result<bool> {
        let mut probe = Holding::new(
            self.shared
                .own_conn(self.shared.cfg.connect_timeout)
                .await?,
            self.shared.clone(),
        );
        match self.verified_holder(&mut probe, name).await? {
            Some(id) => {
                self.shared.kill(id, false).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The recorded holder of `name`, if the server shows it blocking
    /// `probe`'s request for the row (see `holder_connection`).
    async fn verified_holder(&self, probe: &mut Holding, name: &str) -> Result<Option<u64>> {
        let sh = self.shared.clone();
        self.begin(probe, 60, 3).await?;
        let probe_id = probe.id.unwrap_or_default();
        if self
            .lock_row(probe, name, Deadline::Now, false, None)
            .await?
            .is_some()
        {
            // Free (or no such row): nobody holds it.
            return Ok(None);
        }
        // Held: wait for the row in the background, so that the server lists
        // the wait and who blocks it.
        let fut = sqlx::query(AssertSqlSafe(sh.sql.lock_wait.clone()))
            .bind(name.as_bytes().to_vec())
            .fetch_optional(probe.conn()?);
        let verdict = async {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                // MariaDB refreshes its lock tables only after 100 ms
                // without a read: a quicker read sees an old snapshot.
                tokio::time::sleep(Duration::from_millis(150)).await;
                let blockers = self.blockers_of(probe_id).await?;
                let found = if sh.cfg.fencing {
                    let recorded = self.recorded_holder(name).await?;
                    recorded.filter(|id| blockers.contains(id))
                } else {
                    // Nothing recorded: the one session blocking the probe.
                    match blockers[..] {
                        [id] => Some(id),
                        _ => None,
                    }
                };
                if found.is_some() {
                    return Ok(found);
                }
                if Instant::now() >= deadline {
                    // Held, but not by the recorded session (a new holder
                    // that has not recorded itself yet): nothing to kill.
                    return Ok(None);
                }
            }
        };
        tokio::select! {
            // The row came free meanwhile (or the wait ended).
            _ = fut => Ok(None),
            v = verdict => v,
        }
        // Dropping the probe (dirty) closes it and ends its wait.
    }

    /// The connection id recorded in the fencing row of `name`.
    async fn recorded_holder(&self, name: &str) -> Result<Option<u64>> {
        let sh = &self.shared;
        let mut aux = AuxConn::take(sh, "reading the holder").await?;
        let q = sqlx::query(AssertSqlSafe(sh.sql.holder.clone()))
            .bind(name.as_bytes())
            .fetch_optional(aux.conn()?);
        let row = sh
            .answer("reading the holder", sh.cfg.request_timeout, false, q)
            .await?;
        aux.finished_if(&row);
        let row = row.map_err(|e| map_err(e, "reading the holder", &sh.server))?;
        Ok(row.and_then(|r| r.try_get::<Option<u64>, _>(0).ok().flatten()))
    }

    /// The connection ids whose transactions block `waiter`'s lock request,
    /// from the server's lock-wait graph.
    async fn blockers_of(&self, waiter: u64) -> Result<Vec<u64>> {
        let sh = &self.shared;
        let mut last = None;
        for sql in [waits::BLOCKERS_MARIADB, waits::BLOCKERS_MYSQL8] {
            let mut aux = AuxConn::take(sh, "reading the lock waits").await?;
            let q = sqlx::query(sql).bind(waiter).fetch_all(aux.conn()?);
            let done = sh
                .answer("reading the lock waits", sh.cfg.request_timeout, false, q)
                .await?;
            aux.finished_if(&done);
            match done {
                Ok(rows) => {
                    return Ok(rows
                        .iter()
                        .filter_map(|r| r.try_get::<u64, _>(0).ok())
                        .collect())
                }
                // This server has the other table.
                Err(e) if db_number(&e).is_some() => last = Some(e),
                Err(e) => return Err(map_err(e, "reading the lock waits", &sh.server)),
            }
        }
        Err(match last {
            Some(e) => map_err(e, "reading the lock waits", &sh.server),
            None => Error::backend_error(NAME, "no lock-wait table"),
        })
    }
}

/// What one read of a lock's rows and user locks showed.
struct Seen {
    fence: u64,
    owner: Option<String>,
    /// The connection the fencing row names.
    recorded: Option<u64>,
    /// The connection holding the row's user lock.
    using: Option<u64>,
    value: Option<Vec<u8>>,
    value_fence: Option<u64>,
    /// The connection holding the user lock of the term the fencing row
    /// records.
    term_using: Option<u64>,
}

impl Seen {
    /// Whether the connection the fencing row names holds the row's user
    /// lock, or, with that one free, the user lock of the recorded term.
    fn names_holder(&self) -> bool {
        self.recorded.is_some()
            && (self.using == self.recorded
                || (self.using.is_none() && self.term_using == self.recorded))
    }
}
