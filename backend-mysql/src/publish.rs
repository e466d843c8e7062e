//! A holder names itself on its holding connection with a user lock, for
//! inspection by any client.

use std::time::Duration;

use lockcore::raw::prelude::*;
use sqlx::{AssertSqlSafe, Row};

use crate::config::NAME;
use crate::conn::Holding;
use crate::conn::Shared;
use crate::error::map_err;
use crate::sql::is_user_lock_name;

/// The holder of a lock publishes itself on its holding connection: it
/// takes the row's user lock (`GET_LOCK`), which ends with the
/// connection and which it lets go of before its row
/// ([`MysqlLease`](crate::lease::MysqlLease)'s release), so that
/// `IS_USED_LOCK` names the holder's connection
/// ([`Backend::inspect`]). The
/// round trip also proves the holding transaction alive.
///
/// Keeps the user lock's name in the holding (`Holding::user_lock`),
/// none when another session holds it: the lock is granted all the same
/// (the row is what excludes), and inspection, which then finds the user
/// lock held by a session the fencing row does not name, says it cannot
/// tell. Any session can take a user lock, so one must never keep a holder
/// from its row. A previous holder whose connection died may keep it a
/// moment after its row (the server rolls back before it frees user
/// locks), so an acquisition with time to spare gives it `wait` seconds;
/// one left unpublished tries again at each renewal
/// ([`MysqlLease`](crate::lease::MysqlLease)), with no wait.
///
/// Left unpublished at its acquisition (`term`, its fencing token, is
/// given then), the holder takes the user lock of its term instead
/// ([`publish_term`]), which no earlier holder ever takes: once the other
/// session lets go of the row's user lock, inspection finds the row's
/// user lock free and the term's held by the connection the fencing row
/// names, and names the holder, rather than showing the name free until
/// the next renewal publishes it.
///
/// The same round trip reads the row's lock-delay record, where the table
/// of lock-delays exists: the holder is then the row's, so the record is
/// its predecessor's (or its own).
///
/// # Cancel safety
///
/// A dropped call leaves its reply unread on the holding connection, which
/// must not be used again: the acquisition's dirty [`Holding`] is closed
/// when dropped, and a renewal's is marked in flight.
pub(crate) async fn publish(
    sh: &Shared,
    h: &mut Holding,
    row: &str,
    wait: u64,
    term: Option<u64>,
    owner: &str,
) -> Result<Option<DelayRecord>> {
    let what = "publishing the holder (GET_LOCK)";
    let limit = sh.cfg.request_timeout + Duration::from_secs(wait);
    let mut asking = sqlx::query(AssertSqlSafe(sh.sql.publish.clone()));
    if sh.delays {
        asking = asking.bind(row.as_bytes()).bind(owner);
    }
    asking = asking.bind(row.as_bytes()).bind(wait).bind(row.as_bytes());
    if sh.delays {
        asking = asking.bind(row.as_bytes()).bind(row.as_bytes());
    }
    let (user_lock, record) = get_user_lock(sh, h, asking, what, limit).await?;
    match user_lock {
        // Another owner's lock-delay runs: the caller waits it out
        // unpublished (see `delay.rs`).
        UserLock::Deferred => Ok(record),
        UserLock::Ours(key) => {
            h.user_lock = Some(key);
            Ok(record)
        }
        UserLock::Another(key) => {
            if wait > 0 {
                tracing::warn!(
                    row,
                    key,
                    "another session holds this lock's user lock: the lock is held, but inspection cannot name its holder while that session holds it (it names it by its term once that session lets go, and by the user lock once a renewal takes it)"
                );
            } else {
                tracing::debug!(row, key, "this lock's user lock is still another session's");
            }
            match term {
                Some(fence) if h.term_lock.is_none() => {
                    publish_term(sh, h, row, fence).await.map(|()| record)
                }
                _ => Ok(record),
            }
        }
    }
}

/// Lets go of the user locks a new holder took in [`publish`] (it waits
/// out a predecessor's lock-delay unpublished, so that inspection shows
/// the name held with no owner then, not as its holder). One round trip on
/// the holding connection, which also proves it alive.
///
/// # Cancel safety
///
/// As [`publish`].
pub(crate) async fn unpublish(sh: &Shared, h: &mut Holding) -> Result<()> {
    let keys: Vec<String> = h.user_lock.iter().chain(&h.term_lock).cloned().collect();
    if keys.is_empty() {
        return Ok(());
    }
    if let Some(key) = keys.iter().find(|key| !is_user_lock_name(key)) {
        return Err(Error::backend_error(
            NAME,
            format!("a user lock named {key:?} cannot be released"),
        ));
    }
    let releases: Vec<String> = keys
        .iter()
        .map(|key| format!("RELEASE_LOCK('{key}')"))
        .collect();
    let what = "letting go of the holder's user lock (RELEASE_LOCK)";
    let sql = format!("DO {}", releases.join(", "));
    let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(h.conn()?);
    sh.answer(what, sh.cfg.request_timeout, false, fut)
        .await?
        .map_err(|e| map_err(e, what, &sh.server))?;
    h.user_lock = None;
    h.term_lock = None;
    Ok(())
}

/// A lock-delay's record of a row: a holder with a lock-delay keeps its
/// deadline there (see `counter.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DelayRecord {
    /// How long until the deadline, from the reading statement's start;
    /// zero once passed.
    pub(crate) left: Duration,
    /// The holder that wrote it (its owner token).
    pub(crate) owner: String,
}

/// Who holds a user lock after a `GET_LOCK` (its name in the reply's
/// second column).
enum UserLock {
    /// This session took it.
    Ours(String),
    /// Another session holds it.
    Another(String),
    /// Not asked for: another owner's lock-delay runs.
    Deferred,
}

/// Sends `asking` (a `GET_LOCK` and the lock's name) on the holding
/// connection within `limit`.
///
/// # Cancel safety
///
/// As [`publish`].
async fn get_user_lock(
    sh: &Shared,
    h: &mut Holding,
    asking: sqlx::query::Query<'_, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    what: &str,
    limit: Duration,
) -> Result<(UserLock, Option<DelayRecord>)> {
    let got = sh
        .answer(what, limit, false, asking.fetch_one(h.conn()?))
        .await?
        .map_err(|e| map_err(e, what, &sh.server))?;
    let (taken, key) = (
        got.try_get::<Option<i64>, _>(0)
            .map_err(|e| map_err(e, what, &sh.server))?,
        got.try_get::<String, _>(1)
            .map_err(|e| map_err(e, what, &sh.server))?,
    );
    // A publishing statement's third and fourth columns: the lock-delay
    // record, if any.
    let record = if got.len() >= 4 {
        let left = got
            .try_get::<Option<i64>, _>(2)
            .map_err(|e| map_err(e, what, &sh.server))?;
        let owner = got
            .try_get::<Option<String>, _>(3)
            .map_err(|e| map_err(e, what, &sh.server))?;
        left.zip(owner).map(|(left, owner)| DelayRecord {
            left: Duration::from_micros(u64::try_from(left).unwrap_or(0)),
            owner,
        })
    } else {
        None
    };
    let user_lock = match taken {
        Some(-1) => UserLock::Deferred,
        Some(1) if is_user_lock_name(&key) => UserLock::Ours(key),
        Some(1) => {
            return Err(Error::backend_error(
                NAME,
                format!("the server named a user lock {key:?}, not one of ours"),
            ))
        }
        _ => UserLock::Another(key),
    };
    Ok((user_lock, record))
}

/// The holder of term `fence` of `row`, whose row's user lock is another
/// session's, takes the user lock of its term (`GET_LOCK` without waiting)
/// and keeps its name in the holding (`Holding::term_lock`), to let go of
/// before its row. Any session may take a user lock, so one found taken
/// (by a session that computed its name) is left alone: the holder is
/// then shown held with no owner until a renewal publishes it.
///
/// # Cancel safety
///
/// As [`publish`].
async fn publish_term(sh: &Shared, h: &mut Holding, row: &str, fence: u64) -> Result<()> {
    let what = "publishing the holder's term (GET_LOCK)";
    let limit = sh.cfg.request_timeout;
    let asking = sqlx::query(AssertSqlSafe(sh.sql.term_lock.clone()))
        .bind(row.as_bytes())
        .bind(fence)
        .bind(row.as_bytes())
        .bind(fence);
    match get_user_lock(sh, h, asking, what, limit).await?.0 {
        UserLock::Deferred => Ok(()),
        UserLock::Ours(key) => {
            h.term_lock = Some(key);
            Ok(())
        }
        UserLock::Another(key) => {
            tracing::warn!(
                row,
                key,
                fence,
                "another session holds the user lock of this lock's term too: inspection shows the lock held with no owner until a renewal publishes it"
            );
            Ok(())
        }
    }
}
