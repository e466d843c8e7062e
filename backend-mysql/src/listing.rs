//! Listing: the names whose rows are locked under a prefix, and the
//! holders of a read-write lock's or a semaphore's roles in the backend's
//! own layout, all told by probes that never wait.
//!
//! A session that does not hold a row cannot ask the server who does
//! without the `PROCESS` privilege (the server's lock tables). What any
//! session can ask is whether a row is locked, and how: a locking read
//! with `SKIP LOCKED` returns the rows it could lock and skips the others.
//! Shared, it skips the rows held for update (a lock's, a writer's, a
//! permit's slot), and a row a writer waits for; for update, after that
//! shared read, it skips the rows others hold shared too (readers). Each
//! probe runs in a transaction of its own on an auxiliary connection and
//! is rolled back in the same request; one cut off is closed, not
//! returned to the pool.
//!
//! The probes need `SKIP LOCKED` (MariaDB 10.6, MySQL 8.0): on an older
//! server, listing and the roles are `Ok(None)`, as for a backend that
//! cannot tell.

use std::collections::{BTreeSet, HashSet};

use lockcore::{HolderInfo, Listing, Role};
use lockcore::{Layout, Result};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, Row};

use crate::conn::AuxConn;
use crate::core::{rw_row, MysqlBackend};
use crate::error::{code, db_number, map_err};
use crate::slots::slot_range;

/// How a read-write lock's row ends (see `rw_row`).
const RW_SUFFIX: &[u8] = b"\x01rw";

/// The fewest rows a page of the listing reads.
const MIN_PAGE: usize = 64;

/// The most rows a page of the listing reads (and probes in one request).
const MAX_PAGE: usize = 512;

/// How many pages the listing reads at most: rows are never deleted, so a
/// prefix may cover many free names; the listing stops after these.
const MAX_PAGES: usize = 32;

/// How a read-write lock's row is held, as a probe saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RwHeld {
    /// Free (or never used).
    Free,
    /// Held shared (by one or more readers), no writer holding or waiting.
    Shared,
    /// Held for update (a writer), or held shared with a writer waiting
    /// behind the readers: the two look alike to a probe.
    Exclusive,
}

/// The name a lock row belongs to: the row itself for a lock (or a part
/// of a primitive laid out from locks), the read-write lock's or the
/// semaphore's for one of their rows; `None` for a row of no such form.
fn name_of_row(row: &str) -> Option<&str> {
    let Some((name, rest)) = row.split_once('\u{1}') else {
        return Some(row);
    };
    let slot = rest
        .strip_prefix("sem\u{1}")
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    (rest == "rw" || slot).then_some(name)
}

/// The smallest byte string above every one that starts with `prefix`
/// (`ab` gives `ac`); above every name (longer than any) when there is
/// none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // Longer than any name (at most 256 bytes), so above every one.
    vec![u8::MAX; lockcore::MAX_NAME_BYTES + 16]
}

impl MysqlBackend {
    /// The names under `prefix` whose rows are locked, at most `limit`, in
    /// name order (see [`Backend::list`](lockcore::raw::Backend::list)):
    /// a lock's, an election's or a part's name whose row is held, a
    /// read-write lock's whose row is held by a writer or readers, a
    /// semaphore's with a slot held. The lock table is read a page at a
    /// time in name order (a read that locks nothing), and each page's
    /// rows are probed in one request ([`Sql::rows_probe`]). Rows are
    /// never deleted, so free names outnumber held ones: the listing stops
    /// after [`MAX_PAGES`] pages (between 2 048 and 16 384 rows, by
    /// `limit`), and a held name beyond them is not listed (the listing
    /// says it is not complete). A waiter is
    /// not seen (only the rows held); a row locked for a moment by
    /// another probe or an insert shows held that moment.
    ///
    /// `Ok(None)` on a server without `SKIP LOCKED`.
    ///
    /// [`Sql::rows_probe`]: crate::sql::Sql::rows_probe
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (a probe's locks end with its
    /// connection, which is closed when dropped mid-request).
    pub(crate) async fn held_names(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let mut names = BTreeSet::new();
        if limit == 0 {
            return Ok(Some(Listing::new(Vec::new(), false)));
        }
        let end = prefix_end(prefix.as_bytes());
        let page = limit.saturating_mul(4).clamp(MIN_PAGE, MAX_PAGE);
        let mut from = prefix.as_bytes().to_vec();
        for _ in 0..MAX_PAGES {
            let rows = self.rows_from(&from, &end, page).await?;
            let Some(last) = rows.last() else {
                return Ok(Some(Listing::new(names.into_iter().collect(), true)));
            };
            // Just past the last row: the next page starts there.
            from.clone_from(last);
            from.push(0);
            let Some(held) = self.held_rows(&rows).await? else {
                return Ok(None);
            };
            for row in held {
                let Ok(row) = String::from_utf8(row) else {
                    continue;
                };
                if let Some(name) = name_of_row(&row).filter(|n| n.starts_with(prefix)) {
                    names.insert(name.to_owned());
                    if names.len() > limit {
                        return Ok(Some(Listing::bounded(names.into_iter().collect(), limit)));
                    }
                }
            }
            if rows.len() < page {
                return Ok(Some(Listing::bounded(names.into_iter().collect(), limit)));
            }
        }
        tracing::debug!(
            prefix,
            rows = MAX_PAGES * page,
            "listing stopped after its last page; held names beyond it were not looked at"
        );
        // Not complete: held names beyond the last page were not looked at.
        Ok(Some(Listing::new(
            names.into_iter().take(limit).collect(),
            false,
        )))
    }

    /// Up to `page` lock rows from `from` (included) to `end` (excluded),
    /// in name order: a read that locks nothing.
    async fn rows_from(&self, from: &[u8], end: &[u8], page: usize) -> Result<Vec<Vec<u8>>> {
        let sh = &self.shared;
        let what = "listing the lock rows";
        let rt = sh.cfg.request_timeout;
        let mut aux = AuxConn::take(sh, what).await?;
        let q = sqlx::query(AssertSqlSafe(sh.sql.list_rows.clone()))
            .bind(from.to_vec())
            .bind(end.to_vec())
            .bind(u64::try_from(page).unwrap_or(u64::MAX))
            .fetch_all(aux.conn()?);
        let rows = sh.answer(what, rt, false, q).await?;
        aux.finished_if(&rows);
        let rows = rows.map_err(|e| map_err(e, what, &sh.server))?;
        let get = |e: sqlx::Error| map_err(e, what, &sh.server);
        let mut names = Vec::with_capacity(rows.len());
        for r in &rows {
            names.push(r.try_get::<Vec<u8>, _>(0).map_err(get)?);
        }
        Ok(names)
    }

    /// Which of `rows` (one page, in name order) are held: for update by
    /// anyone, or, for a read-write lock's row, shared by readers. `None`
    /// on a server without `SKIP LOCKED`.
    async fn held_rows(&self, rows: &[Vec<u8>]) -> Result<Option<Vec<Vec<u8>>>> {
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Ok(Some(Vec::new()));
        };
        let rw: Vec<&[u8]> = rows
            .iter()
            .filter(|r| r.ends_with(RW_SUFFIX))
            .map(Vec::as_slice)
            .collect();
        let sql = self.shared.sql.rows_probe(first, last, &rw);
        let Some(probed) = self.probe(sql, "looking which lock rows are held").await? else {
            return Ok(None);
        };
        let (mut unlocked, mut alone) = (HashSet::new(), HashSet::new());
        for (row, tag) in tagged(&probed, &self.shared.server)? {
            if tag == 1 {
                unlocked.insert(row);
            } else {
                alone.insert(row);
            }
        }
        let held = rows
            .iter()
            .filter(|r| !unlocked.contains(*r) || (r.ends_with(RW_SUFFIX) && !alone.contains(*r)))
            .cloned()
            .collect();
        Ok(Some(held))
    }

    /// The holders of `name` in `role` of this backend's own layouts (see
    /// [`Backend::inspect_role`](lockcore::raw::Backend::inspect_role)),
    /// `None` for a layout built from locks, or on a server without `SKIP
    /// LOCKED`.
    ///
    /// What a probe can tell, and no more (who holds a row is the server's
    /// lock tables' to say, readable only with `PROCESS`):
    ///
    /// - [`Role::Permit`]: one holder per slot row held, in slot order,
    ///   with no owner, token or ttl: a permit records its connection and
    ///   owner only in the semaphore's one fencing row, which names the
    ///   latest permit granted, not which slot it holds nor whether it
    ///   still does. A permit of a client counting more (a slot beyond
    ///   others' count) shows too.
    /// - [`Role::Reader`]: while readers hold the row and no writer holds
    ///   or waits, one holder with no owner, token or ttl, standing for
    ///   all of them (one or more: readers cannot be told apart or
    ///   counted); else none.
    /// - [`Role::Writer`]: while the row is held for update, one holder
    ///   with no owner, token or ttl; else none. Readers with a writer
    ///   waiting behind them look the same to a probe (the server queues
    ///   the probe's shared read behind the waiting writer), so they show
    ///   as a writer, and as no readers, until they leave.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (a probe's locks end with its
    /// connection, which is closed when dropped mid-request).
    pub(crate) async fn role_holders(
        &self,
        name: &str,
        role: Role,
    ) -> Result<Option<Vec<HolderInfo>>> {
        let cfg = &self.shared.cfg;
        let unknown = || HolderInfo::new(None, None, None);
        match role {
            Role::Permit if cfg.semaphore == Layout::Native => {
                let Some(held) = self.slots_held(name).await? else {
                    return Ok(None);
                };
                Ok(Some(held.iter().map(|_| unknown()).collect()))
            }
            Role::Reader | Role::Writer if cfg.rwlock == Layout::Native => {
                let Some(held) = self.rw_held(name).await? else {
                    return Ok(None);
                };
                let holds = match role {
                    Role::Reader => held == RwHeld::Shared,
                    _ => held == RwHeld::Exclusive,
                };
                Ok(Some(if holds { vec![unknown()] } else { Vec::new() }))
            }
            _ => Ok(None),
        }
    }

    /// The slot rows of semaphore `name` held now, in slot order: every
    /// slot row, less those a shared read that skips held rows returns
    /// ([`Sql::slots_probe`](crate::sql::Sql::slots_probe)). `None` on a
    /// server without `SKIP LOCKED`.
    async fn slots_held(&self, name: &str) -> Result<Option<Vec<Vec<u8>>>> {
        let (start, end) = slot_range(name);
        let sql = self
            .shared
            .sql
            .slots_probe(start.as_bytes(), end.as_bytes());
        let Some(probed) = self.probe(sql, "looking which slots are held").await? else {
            return Ok(None);
        };
        let (mut all, mut free) = (Vec::new(), HashSet::new());
        for (row, tag) in tagged(&probed, &self.shared.server)? {
            if tag == 1 {
                all.push(row);
            } else {
                free.insert(row);
            }
        }
        all.sort();
        all.retain(|row| !free.contains(row));
        Ok(Some(all))
    }

    /// How the row of read-write lock `name` is held now
    /// ([`Sql::rw_probe`](crate::sql::Sql::rw_probe)). `None` on a server
    /// without `SKIP LOCKED`.
    async fn rw_held(&self, name: &str) -> Result<Option<RwHeld>> {
        let sql = self.shared.sql.rw_probe(rw_row(name).as_bytes());
        let Some(probed) = self
            .probe(sql, "looking how the read-write lock is held")
            .await?
        else {
            return Ok(None);
        };
        let server = &self.shared.server;
        let tags = probed
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<std::result::Result<HashSet<i64>, _>>()
            .map_err(|e| map_err(e, "reading a probe", server))?;
        let held = if !tags.contains(&1) || tags.contains(&3) {
            RwHeld::Free
        } else if tags.contains(&2) {
            RwHeld::Shared
        } else {
            RwHeld::Exclusive
        };
        Ok(Some(held))
    }

    /// Runs probe `sql` (a transaction of its own that ends in `ROLLBACK`)
    /// on an auxiliary connection: every row its statements return.
    /// `None` when the server does not know `SKIP LOCKED`. A probe that
    /// failed or was cut off may have left its transaction open: its
    /// connection is closed, not returned to the pool.
    async fn probe(&self, sql: String, what: &str) -> Result<Option<Vec<MySqlRow>>> {
        let sh = &self.shared;
        let rt = sh.cfg.request_timeout;
        let mut aux = AuxConn::take(sh, what).await?;
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(aux.conn()?);
        let probed = sh.answer(what, rt, false, fut).await?;
        if probed.is_ok() {
            aux.finished_if(&probed);
        }
        match probed {
            Ok(rows) => Ok(Some(rows)),
            Err(e) if db_number(&e) == Some(code::PARSE_ERROR) => {
                tracing::debug!(error = %e, "the server does not know SKIP LOCKED (MariaDB 10.6 and MySQL 8.0 do): no listing, no holders by role");
                Ok(None)
            }
            Err(e) => Err(map_err(e, what, &sh.server)),
        }
    }
}

/// The rows of a probe that returns a name and a tag: (name, tag).
fn tagged(rows: &[MySqlRow], server: &str) -> Result<Vec<(Vec<u8>, i64)>> {
    let get = |e: sqlx::Error| map_err(e, "reading a probe", server);
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let name: Vec<u8> = r.try_get(0).map_err(get)?;
        let tag: i64 = r.try_get(1).map_err(get)?;
        out.push((name, tag));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_name_their_primitive() {
        assert_eq!(name_of_row("jobs/nightly"), Some("jobs/nightly"));
        assert_eq!(
            name_of_row("s\u{1f}permit-0003"),
            Some("s\u{1f}permit-0003")
        );
        assert_eq!(name_of_row("cfg\u{1}rw"), Some("cfg"));
        assert_eq!(name_of_row("sem\u{1}sem\u{1}0007"), Some("sem"));
        assert_eq!(name_of_row("x\u{1}sem"), None);
        assert_eq!(name_of_row("x\u{1}sem\u{1}"), None);
        assert_eq!(name_of_row("x\u{1}other"), None);
    }

    #[test]
    fn the_end_of_a_prefix() {
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        let end = prefix_end(b"");
        assert!(end.len() > lockcore::MAX_NAME_BYTES && end.iter().all(|b| *b == u8::MAX));
    }
}
