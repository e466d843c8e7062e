//! A semaphore's slot rows: permit `i` of semaphore `S` counting `N` is a
//! lock on row `S\x01sem\x01<i>` (four digits, `i` below `N`), taken with
//! `SELECT ... FOR UPDATE SKIP LOCKED` over the `N` rows, so one statement
//! finds a free permit whatever the others hold.

use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::raw::prelude::*;
use sqlx::{AssertSqlSafe, Row};

use crate::config::NAME;
use crate::conn::Holding;
use crate::core::MysqlBackend;
use crate::error::{code, db_number, map_err};

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

/// The range of every slot row of semaphore `name`, of any count: from the
/// slots' prefix (included) to just past them (excluded).
pub(crate) fn slot_range(name: &str) -> (String, String) {
    (format!("{name}\u{1}sem\u{1}"), slots_end(name))
}

/// How many slots a waiter waits on at once, each on a connection of its
/// own: every slot of a semaphore of up to this many permits.
const WAIT_WIDTH: u32 = 8;

/// With more slots than [`WAIT_WIDTH`], how long a waiter waits on a few
/// before it looks at them all again: the server's shortest lock wait
/// (one second), and the client's bound on it.
const CHUNK: Duration = Duration::from_millis(1500);

/// How long the waits of one round last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    /// Until the deadline.
    Whole(Deadline),
    /// One second, the server's shortest lock wait.
    Chunk,
}

/// How many times the slot rows are created before the backend gives up
/// (someone deleting them as fast).
const CREATE_TRIES: u32 = 3;

impl MysqlBackend {
    /// Takes a free slot of semaphore `name` counting `permits` within
    /// `deadline`, starting on `h`'s transaction (`wait`: the ttl and the
    /// lock wait its session was begun with): the connection holding it
    /// (`h`, or one of the waits beside it), the slot's row, and when the
    /// locking read that got it was sent. With no slot by the deadline, the
    /// row is `None` and the connection is one to give back.
    ///
    /// All slots held: a client counting more holding a slot beyond ours is
    /// an error (once per acquisition); otherwise the wait is on up to
    /// [`WAIT_WIDTH`] slots at once, each on a connection of its own, and
    /// the first granted is the permit. With more slots than that, the
    /// waits are on a random few for one second, then every slot is
    /// looked at again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: every connection it holds is a [`Holding`], which a
    /// drop closes and `KILL`s.
    pub(crate) async fn take_slot(
        &self,
        mut h: Holding,
        name: &str,
        permits: u32,
        deadline: Deadline,
        wait: (u64, u64),
    ) -> Result<(Holding, Option<(String, Instant)>)> {
        if !(1..=lockcore::semaphore::MAX_PERMITS).contains(&permits) {
            return Err(Error::invalid_config(
                NAME,
                format!(
                    "a semaphore has 1 to {} permits, not {permits}",
                    lockcore::semaphore::MAX_PERMITS
                ),
            ));
        }
        let rows: Vec<String> = (0..permits).map(|i| slot_row(name, i)).collect();
        let (first, last) = (slot_row(name, 0), slot_row(name, permits - 1));
        let mut creates = 0;
        // How many slot rows beyond ours there were, once our own were
        // all found; `checked` once those were looked at.
        let mut beyond = None;
        let mut checked = false;
        // Connections of earlier waits, kept for the next.
        let mut spares = Vec::new();
        let mut chunked = false;
        loop {
            let sent = Instant::now();
            if let Some(row) = self.free_slot(&mut h, &rows).await? {
                return Ok((h, Some((row, sent))));
            }
            if beyond.is_none() {
                let (ours, past) = self.count_slots(&mut h, name, &first, &last).await?;
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
                    self.create_rows(&mut h, &rows).await?;
                    continue;
                }
                // All there: look again, since the first look may have
                // come before another client's rows were committed.
                beyond = Some(past);
                continue;
            }
            if !checked {
                checked = true;
                if let Some(existing @ 1..) = beyond {
                    self.check_beyond(&mut h, name, &last, permits, existing)
                        .await?;
                }
            }
            // The whole wait at once on every slot (or at the end of a
            // deadline); with more slots than a waiter waits on, a second on
            // a random few, then every slot looked at again.
            let span = match deadline {
                Deadline::Now => return Ok((h, None)),
                Deadline::At(t) if t <= Instant::now() => return Ok((h, None)),
                // A server's one-second wait may last up to two.
                Deadline::At(t) if t <= Instant::now() + 2 * CHUNK => Span::Whole(deadline),
                _ if permits > WAIT_WIDTH => Span::Chunk,
                _ => Span::Whole(deadline),
            };
            if span == Span::Chunk && !chunked {
                // Its session waits one second per chunk from now on, as do
                // the connections opened beside it.
                self.exec_raw(
                    &mut h,
                    "SET SESSION innodb_lock_wait_timeout = 1".to_owned(),
                    "setting the lock wait",
                )
                .await?;
                chunked = true;
            }
            spares.insert(0, h);
            // The lock wait the sessions were left with.
            let session = (wait.0, if chunked { 1 } else { wait.1 });
            let got = self
                .wait_slots(&mut spares, name, permits, span, session)
                .await?;
            if let Some((held, row, at)) = got {
                // The other connections are closed, and their threads
                // killed, as they go.
                return Ok((held, Some((row, at))));
            }
            // Every wait ran out: they are back in `spares`, in
            // transactions begun again; one looks at every slot.
            h = spares
                .pop()
                .ok_or_else(|| Error::backend_error(NAME, "a semaphore waited on no slot"))?;
        }
    }

    /// Waits on up to [`WAIT_WIDTH`] slots at once (all of them, or a
    /// random few) for `span`, on the connections in `spares` and on new
    /// ones beside them: the first slot granted, with its connection; the
    /// other waits are dropped, which closes their connections and `KILL`s
    /// their threads. With none granted, every connection is back in
    /// `spares`.
    async fn wait_slots(
        &self,
        spares: &mut Vec<Holding>,
        name: &str,
        permits: u32,
        span: Span,
        (ttl_secs, lock_wait_secs): (u64, u64),
    ) -> Result<Option<(Holding, String, Instant)>> {
        let picks: Vec<u32> = if permits <= WAIT_WIDTH {
            (0..permits).collect()
        } else {
            rand::seq::index::sample(&mut rand::rng(), permits as usize, WAIT_WIDTH as usize)
                .into_iter()
                .filter_map(|i| u32::try_from(i).ok())
                .collect()
        };
        let session_wait = match span {
            Span::Chunk => 1,
            Span::Whole(_) => lock_wait_secs,
        };
        let mut waits: FuturesUnordered<_> = picks
            .into_iter()
            .map(|i| {
                let own = spares.pop();
                async move {
                    let mut h = match own {
                        Some(h) => h,
                        None => self.open_transaction(ttl_secs, session_wait).await?,
                    };
                    let row = slot_row(name, i);
                    let got = match span {
                        Span::Whole(d) => {
                            self.wait_for_row(&mut h, &row, d, session_wait, false, None)
                                .await?
                        }
                        Span::Chunk => self.wait_chunk(&mut h, &row).await?,
                    };
                    tracing::trace!(row, ?got, "waited on a slot");
                    Ok::<_, Error>((h, row, got))
                }
            })
            .collect();
        while let Some(res) = waits.next().await {
            let (h, row, got) = res?;
            match got {
                Some(at) => return Ok(Some((h, row, at))),
                None => spares.push(h),
            }
        }
        Ok(None)
    }

    /// One second's wait for slot row `row` (the session's lock wait): when
    /// the locking read that got it was sent, or `None` with the
    /// transaction begun again.
    async fn wait_chunk(&self, h: &mut Holding, row: &str) -> Result<Option<Instant>> {
        let sent = Instant::now();
        match self
            .lock_row(h, row, Deadline::At(sent + CHUNK), false, None)
            .await?
        {
            Some(true) => Ok(Some(sent)),
            got => {
                // Run out (or the row deleted meanwhile, which the next look
                // finds): a server with innodb_rollback_on_timeout rolled
                // the transaction back.
                if got.is_none() {
                    self.exec_raw(
                        h,
                        "ROLLBACK; START TRANSACTION".to_owned(),
                        "beginning the wait again",
                    )
                    .await?;
                }
                Ok(None)
            }
        }
    }

    /// One `FOR UPDATE SKIP LOCKED` over the slot rows `rows`, each named
    /// (point lookups: no other row is read, so none is locked even for a
    /// moment): the row it locked, if any was free.
    async fn free_slot(&self, h: &mut Holding, rows: &[String]) -> Result<Option<String>> {
        let sh = self.shared.clone();
        let marks = vec!["?"; rows.len()].join(",");
        let sql = format!(
            "{}{marks}) ORDER BY `name` LIMIT 1 FOR UPDATE SKIP LOCKED",
            sh.sql.slot_free
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for r in rows {
            q = q.bind(r.as_bytes());
        }
        let fut = q.fetch_optional(h.conn()?);
        let row = sh
            .answer("taking a free slot", sh.cfg.request_timeout, false, fut)
            .await?
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
        let row = sh
            .answer("counting the slots", sh.cfg.request_timeout, false, fut)
            .await?
            .map_err(|e| map_err(e, "counting the slots", &sh.server))?;
        let get = |i| -> Result<u64> {
            row.try_get::<Option<u64>, _>(i)
                .map(Option::unwrap_or_default)
                .map_err(|e| map_err(e, "counting the slots", &sh.server))
        };
        Ok((get(0)?, get(1)?))
    }

    /// Creates the slot rows `rows` that do not exist yet, outside the
    /// holding transaction, in one autocommit statement, then starts a new
    /// one. A row another client creates at the same moment is no error.
    async fn create_rows(&self, h: &mut Holding, rows: &[String]) -> Result<()> {
        let sh = self.shared.clone();
        let what = "creating the lock rows";
        self.exec_raw(h, "ROLLBACK".to_owned(), "rolling back")
            .await?;
        let picks = vec!["SELECT ? AS n"; rows.len()].join(" UNION ALL ");
        let table = &sh.cfg.table;
        let sql = format!(
            "INSERT INTO `{table}` (`name`) SELECT s.n FROM ({picks}) s WHERE NOT EXISTS (SELECT 1 FROM `{table}` t WHERE t.`name` = s.n)"
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for r in rows {
            q = q.bind(r.as_bytes());
        }
        // An autocommit insert (the transaction was rolled back first) of
        // an unlocked row: created or not, nothing is held, so one that
        // did not answer is Unavailable.
        match sh
            .answer(what, sh.cfg.request_timeout, false, q.execute(h.conn()?))
            .await?
        {
            Ok(_) => {}
            // There already (a client created it at the same moment), or
            // the duplicate check waited on a row that exists and is held
            // (created after this statement looked, then taken as a
            // permit): the rows are there either way.
            Err(e)
                if matches!(
                    db_number(&e),
                    Some(code::DUP_ENTRY | code::LOCK_WAIT_TIMEOUT)
                ) => {}
            Err(e) => return Err(map_err(e, what, &sh.server)),
        }
        self.exec_raw(
            h,
            "START TRANSACTION".to_owned(),
            "starting the lock transaction",
        )
        .await
    }

    /// With every one of our slots held: is one of the `existing` slots
    /// beyond `last` (counted by `count_slots`, of a client counting more)
    /// held? Then the counts disagree. The free ones are
    /// locked shared for a moment to tell them from the held (two clients
    /// looking at once do not hide them from each other), and the
    /// transaction begins again to let them go.
    async fn check_beyond(
        &self,
        h: &mut Holding,
        name: &str,
        last: &str,
        permits: u32,
        existing: u64,
    ) -> Result<()> {
        let sh = self.shared.clone();
        let end = slots_end(name);
        let what = "looking at the slots beyond the count";
        let free = sqlx::query(AssertSqlSafe(sh.sql.slots_beyond_free.clone()))
            .bind(last.as_bytes())
            .bind(end.as_bytes())
            .fetch_all(h.conn()?);
        let free = sh
            .answer(what, sh.cfg.request_timeout, false, free)
            .await?
            .map_err(|e| skip_locked_err(e, &sh.server))?;
        self.exec_raw(
            h,
            "ROLLBACK; START TRANSACTION".to_owned(),
            "beginning the wait again",
        )
        .await?;
        // Rows are never deleted: ones created since they were counted
        // only make `free` larger.
        if (free.len() as u64) < existing {
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
