//! A semaphore's slot rows: permit `i` of semaphore `S` counting `N` is a
//! lock on row `S\x01sem\x01<i>` (four digits, `i` below `N`), taken with
//! `SELECT ... FOR UPDATE SKIP LOCKED` over the `N` rows, so one statement
//! finds a free permit whatever the others hold.

use std::time::{Duration, Instant};

use lockcore::backend::prelude::*;
use rand::RngExt;
use sqlx::{AssertSqlSafe, Row};

use crate::backend::MysqlBackend;
use crate::config::NAME;
use crate::error::{code, db_number, map_err, timed_out};
use crate::holding::Holding;

/// The row of slot `i` of semaphore `name`: a control character, which no
/// lock name has, keeps it apart from every lock's row.
pub(crate) fn slot_row(name: &str, i: u32) -> String {
    format!("{name}\u{1}sem\u{1}{i:04}")
}

/// The name of semaphore `name`'s fencing counter, one for all its slots.
pub(crate) fn counter_row(name: &str) -> String {
    format!("{name}\u{1}sem")
}

/// Just past every slot row of `name`: `\x02` follows the `\x01` that ends
/// the slots' prefix.
fn slots_end(name: &str) -> String {
    format!("{name}\u{1}sem\u{2}")
}

/// How long a waiter waits on one slot before it looks at them all again:
/// the server's shortest lock wait.
const SLOT_WAIT: Duration = Duration::from_secs(1);

/// How many times the slot rows are created before the backend gives up
/// (someone deleting them as fast).
const CREATE_TRIES: u32 = 3;

impl MysqlBackend {
    /// Takes a free slot of semaphore `name` counting `permits` on `h`'s
    /// transaction within `deadline`: the slot's row and when the locking
    /// read that got it was sent, `None` when the deadline passed.
    ///
    /// All slots held: a client counting more holding a slot beyond ours is
    /// an error (once per acquisition); otherwise the wait is on one slot
    /// at random for [`SLOT_WAIT`], then a look at them all again.
    pub(crate) async fn take_slot(
        &self,
        h: &mut Holding,
        name: &str,
        permits: u32,
        deadline: Deadline,
    ) -> Result<Option<(String, Instant)>> {
        let (first, last) = (slot_row(name, 0), slot_row(name, permits - 1));
        let mut creates = 0;
        // How many slot rows beyond ours there were, once our own were
        // all found; `checked` once those were looked at.
        let mut beyond = None;
        let mut checked = false;
        loop {
            let sent = Instant::now();
            if let Some(row) = self.free_slot(h, &first, &last).await? {
                return Ok(Some((row, sent)));
            }
            if beyond.is_none() {
                let (ours, past) = self.count_slots(h, name, &first, &last).await?;
                if ours < u64::from(permits) {
                    creates += 1;
                    if creates > CREATE_TRIES {
                        return Err(Error::backend_error(
                            NAME,
                            format!(
                                "the slot rows of a semaphore vanished right after they were created in `{}`; is something deleting rows?",
                                self.shared.cfg.table
                            ),
                        ));
                    }
                    self.create_slots(h, name, permits).await?;
                    continue;
                }
                // All there: look again, since the first look may have
                // come before another client's rows were committed.
                beyond = Some(past);
                continue;
            }
            if !checked {
                checked = true;
                if beyond > Some(0) {
                    self.check_beyond(h, name, &last, permits).await?;
                }
            }
            let until = match deadline {
                Deadline::Now => return Ok(None),
                Deadline::At(t) if t <= Instant::now() => return Ok(None),
                Deadline::At(t) => t.min(Instant::now() + SLOT_WAIT + SLOT_WAIT / 2),
                Deadline::Never => Instant::now() + SLOT_WAIT + SLOT_WAIT / 2,
            };
            let row = slot_row(name, rand::rng().random_range(0..permits));
            let sent = Instant::now();
            match self.lock_row(h, &row, Deadline::At(until), false).await? {
                Some(true) => return Ok(Some((row, sent))),
                // Deleted meanwhile: created again above.
                Some(false) => beyond = None,
                // The wait ran out: look at every slot again, in a
                // transaction begun again (a server with
                // innodb_rollback_on_timeout rolled it back).
                None => {
                    self.exec_raw(
                        h,
                        "ROLLBACK; START TRANSACTION".to_owned(),
                        "beginning the wait again",
                    )
                    .await?
                }
            }
        }
    }

    /// One `FOR UPDATE SKIP LOCKED` over the slot rows from `first` to
    /// `last`: the row it locked, if any was free.
    async fn free_slot(&self, h: &mut Holding, first: &str, last: &str) -> Result<Option<String>> {
        let sh = self.shared.clone();
        let fut = sqlx::query(AssertSqlSafe(sh.sql.slot_free.clone()))
            .bind(first.as_bytes())
            .bind(last.as_bytes())
            .fetch_optional(h.conn()?);
        let row = tokio::time::timeout(sh.cfg.request_timeout, fut)
            .await
            .map_err(|_| timed_out("taking a free slot", &sh.server, sh.cfg.request_timeout))?
            .map_err(|e| skip_locked_err(e, &sh.server))?;
        let Some(row) = row else { return Ok(None) };
        let bytes: Vec<u8> = row
            .try_get(0)
            .map_err(|e| map_err(e, "reading a slot row", &sh.server))?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| Error::backend_error(NAME, "a slot row's name is not UTF-8"))
    }

    /// How many of our slot rows exist, and how many slot rows beyond ours
    /// (of clients counting more): a read that locks nothing.
    async fn count_slots(
        &self,
        h: &mut Holding,
        name: &str,
        first: &str,
        last: &str,
    ) -> Result<(u64, u64)> {
        let sh = self.shared.clone();
        let fut = sqlx::query(AssertSqlSafe(sh.sql.slot_counts.clone()))
            .bind(last.as_bytes())
            .bind(last.as_bytes())
            .bind(first.as_bytes())
            .bind(slots_end(name).as_bytes())
            .fetch_one(h.conn()?);
        let row = tokio::time::timeout(sh.cfg.request_timeout, fut)
            .await
            .map_err(|_| timed_out("counting the slots", &sh.server, sh.cfg.request_timeout))?
            .map_err(|e| map_err(e, "counting the slots", &sh.server))?;
        let get = |i| -> Result<u64> {
            row.try_get::<Option<u64>, _>(i)
                .map(Option::unwrap_or_default)
                .map_err(|e| map_err(e, "counting the slots", &sh.server))
        };
        Ok((get(0)?, get(1)?))
    }

    /// Creates the missing slot rows, outside the holding transaction, then
    /// starts a new one.
    async fn create_slots(&self, h: &mut Holding, name: &str, permits: u32) -> Result<()> {
        let sh = self.shared.clone();
        self.exec_raw(h, "ROLLBACK".to_owned(), "rolling back").await?;
        let picks = vec!["SELECT ? AS n"; permits as usize].join(" UNION ALL ");
        let table = &sh.cfg.table;
        let sql = format!(
            "INSERT INTO `{table}` (`name`) SELECT s.n FROM ({picks}) s WHERE NOT EXISTS (SELECT 1 FROM `{table}` t WHERE t.`name` = s.n)"
        );
        let rows: Vec<String> = (0..permits).map(|i| slot_row(name, i)).collect();
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for r in &rows {
            q = q.bind(r.as_bytes());
        }
        match tokio::time::timeout(sh.cfg.request_timeout, q.execute(h.conn()?)).await {
            Err(_) => {
                return Err(timed_out(
                    "creating the slot rows",
                    &sh.server,
                    sh.cfg.request_timeout,
                ))
            }
            // Another client created some at the same moment: counted again.
            Ok(Ok(_)) => {}
            Ok(Err(e)) if db_number(&e) == Some(code::DUP_ENTRY) => {}
            Ok(Err(e)) => return Err(map_err(e, "creating the slot rows", &sh.server)),
        }
        self.exec_raw(
            h,
            "START TRANSACTION".to_owned(),
            "starting the lock transaction",
        )
        .await
    }

    /// With every one of our slots held: is a slot beyond `last` (a client
    /// counting more) held too? Then the counts disagree. The free ones are
    /// locked for a moment to tell them from the held, and the transaction
    /// begins again to let them go.
    async fn check_beyond(
        &self,
        h: &mut Holding,
        name: &str,
        last: &str,
        permits: u32,
    ) -> Result<()> {
        let sh = self.shared.clone();
        let end = slots_end(name);
        let what = "looking at the slots beyond the count";
        let existing = sqlx::query(AssertSqlSafe(sh.sql.slots_beyond.clone()))
            .bind(last.as_bytes())
            .bind(end.as_bytes())
            .fetch_all(h.conn()?);
        let existing = tokio::time::timeout(sh.cfg.request_timeout, existing)
            .await
            .map_err(|_| timed_out(what, &sh.server, sh.cfg.request_timeout))?
            .map_err(|e| map_err(e, what, &sh.server))?;
        let free = sqlx::query(AssertSqlSafe(sh.sql.slots_beyond_free.clone()))
            .bind(last.as_bytes())
            .bind(end.as_bytes())
            .fetch_all(h.conn()?);
        let free = tokio::time::timeout(sh.cfg.request_timeout, free)
            .await
            .map_err(|_| timed_out(what, &sh.server, sh.cfg.request_timeout))?
            .map_err(|e| skip_locked_err(e, &sh.server))?;
        self.exec_raw(
            h,
            "ROLLBACK; START TRANSACTION".to_owned(),
            "beginning the wait again",
        )
        .await?;
        if free.len() < existing.len() {
            return Err(Error::invalid_config(
                NAME,
                format!(
                    "this semaphore counts {permits} permits, but a client counting more holds one beyond them: every client of a semaphore must count the same"
                ),
            )
            .with_name(name));
        }
        Ok(())
    }
}

/// A `SKIP LOCKED` statement's error: a parse error is a server too old for
/// it, with the way out.
fn skip_locked_err(e: sqlx::Error, server: &str) -> Error {
    if db_number(&e) == Some(code::PARSE_ERROR) {
        return Error::invalid_config(
            NAME,
            format!(
                "{server} does not know `FOR UPDATE SKIP LOCKED` (MariaDB 10.6 and MySQL 8.0 do), which a semaphore's slots need: upgrade, or lay semaphores out from locks with ?semaphore=built on every client: {e}"
            ),
        );
    }
    map_err(e, "taking a free slot", server)
}
