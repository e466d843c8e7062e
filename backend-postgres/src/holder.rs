//! Who holds a name, and which names are held: `pg_locks` read first, then
//! the holder's row, in two statements, so that a reported holder held the
//! name at one instant with its own fence and value (a row names a server
//! process only while its holder has not released).

use std::time::{Duration, SystemTime};

use lockcore::raw::prelude::*;
use sqlx::AssertSqlSafe;

use crate::conn::{ask, Shared};
use crate::sql::{like_prefix, Kind};

/// The holder and the waiters of `name`. A holder that is not a client of
/// this library (`psql`, another program) is reported without an owner.
///
/// # Cancel safety
///
/// Cancel safe: it only reads.
pub(crate) async fn inspect(sh: &Shared, name: &str) -> Result<LockInfo> {
    let limit = sh.cfg.request_timeout;
    let lockers: Vec<(bool, Option<i32>, Option<String>)> = ask(
        sh,
        "reading pg_locks",
        limit,
        false,
        sqlx::query_as(AssertSqlSafe(sh.sql.lockers.as_str()))
            .bind(name)
            .fetch_all(&sh.aux),
    )
    .await
    .map_err(|e| e.with_name(name))?;
    let waiters = lockers.iter().filter(|(granted, ..)| !granted).count();
    let Some(&(_, pid, _)) = lockers.iter().find(|(granted, ..)| *granted) else {
        return Ok(LockInfo::new(None, Some(waiters)));
    };
    let holder = holder_of(sh, name, pid).await?;
    Ok(LockInfo::new(Some(holder), Some(waiters)))
}

/// The holder of row `row` if it is server process `pid`; one without an
/// owner where the row does not name it (a client not of this library).
async fn holder_of(sh: &Shared, row: &str, pid: Option<i32>) -> Result<HolderInfo> {
    let (name, limit) = (row, sh.cfg.request_timeout);
    let row: Option<(String, i64, Option<String>, Option<i64>)> = match pid {
        Some(pid) => ask(
            sh,
            "reading the holder's row",
            limit,
            false,
            sqlx::query_as(AssertSqlSafe(sh.sql.holder_row.as_str()))
                .bind(name)
                .bind(pid)
                .fetch_optional(&sh.aux),
        )
        .await
        .map_err(|e| e.with_name(name))?,
        None => None,
    };
    let holder = match row {
        Some((owner, fence, value, since_ms)) => {
            let since = since_ms
                .and_then(|ms| u64::try_from(ms).ok())
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
            HolderInfo::new(Some(owner), u64::try_from(fence).ok(), None)
                .with_value(value)
                .with_since(since)
        }
        None => HolderInfo::new(None, None, None),
    };
    Ok(holder)
}

/// The readers or the writer of read-write lock `name`, from `pg_locks`
/// (the shared and the exclusive holders of its key); a reader has no
/// owner of its own, a writer is named by its row.
///
/// # Cancel safety
///
/// Cancel safe: it only reads.
pub(crate) async fn rw_holders(
    sh: &Shared,
    name: &str,
    role: Role,
) -> Result<Option<Vec<HolderInfo>>> {
    let lockers: Vec<(bool, Option<i32>, Option<String>)> = ask(
        sh,
        "reading pg_locks",
        sh.cfg.request_timeout,
        false,
        sqlx::query_as(AssertSqlSafe(sh.sql.rw_lockers.as_str()))
            .bind(name)
            .fetch_all(&sh.aux),
    )
    .await
    .map_err(|e| e.with_name(name))?;
    let held = lockers.into_iter().filter(|(granted, ..)| *granted);
    Ok(Some(match role {
        Role::Reader => held
            .filter(|(_, _, mode)| mode.as_deref() == Some("ShareLock"))
            .map(|_| HolderInfo::new(None, None, None))
            .collect(),
        Role::Writer => {
            let mut out = Vec::new();
            for (_, pid, mode) in held {
                if mode.as_deref() == Some("ExclusiveLock") {
                    out.push(holder_of(sh, &Kind::Writer.row(name), pid).await?);
                }
            }
            out
        }
        _ => return Ok(None),
    }))
}

/// Names starting with `prefix` held by clients of this library, at most
/// `limit`.
///
/// # Cancel safety
///
/// Cancel safe: it only reads.
pub(crate) async fn list(sh: &Shared, prefix: &str, limit: usize) -> Result<Listing> {
    let names: Vec<String> = ask(
        sh,
        "listing held names",
        sh.cfg.request_timeout,
        false,
        sqlx::query_scalar(AssertSqlSafe(sh.sql.list.as_str()))
            .bind(like_prefix(prefix))
            .bind(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX))
            .fetch_all(&sh.aux),
    )
    .await?;
    Ok(Listing::bounded(names, limit))
}
