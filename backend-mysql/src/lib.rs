//! MySQL 8 and MariaDB backend for [`lockcore`]: row locks with
//! `SELECT ... FOR UPDATE`, through sqlx.
//!
//! **Tables.** A lock name `N` is the row of `lockcore_locks` (set with
//! `?table=`) whose `name` is the bytes of `N`: a `VARBINARY(256)` primary
//! key, so names compare byte for byte (`A` and `a`, `x` and `x `, emoji
//! are distinct) and the locking read goes through the primary index,
//! locking exactly that one record. The row is created on first use by an
//! autocommit insert, outside any lock, and is never deleted by the library.
//! Beside it, `lockcore_locks_fence` keeps each name's fencing counter, the
//! connection id of the latest holder and its owner token, and
//! `lockcore_locks_value` the value an election's leader campaigned with,
//! with its term. The three tables are created by [`connect`] unless
//! `?ensure_schema=false`; [`schema_sql`] gives the statements for a
//! migration.
//!
//! **Acquire.** On a dedicated pooled connection: `SET SESSION wait_timeout`
//! from the ttl, `START TRANSACTION`, then `SELECT ... FOR UPDATE NOWAIT` for
//! a try, or a plain `FOR UPDATE` under the session's
//! `innodb_lock_wait_timeout` for a wait: whole seconds by the server, the
//! sub-second rest cut at the deadline by `KILL QUERY`; waiting forever
//! renews 30 s server waits in a loop. A commit or rollback of the holder
//! hands the row to a waiter at once (the server's own lock queue; no order
//! is promised). The transaction stays open while the lock is held; release
//! is an explicit `ROLLBACK` and returns the connection to the pool.
//!
//! **Read-write locks** ([`lockcore::RwLock`], [`lockcore::Layout::Native`])
//! lock a row of their own, `N` followed by `\x01rw` (no lock name has a
//! control character, so it is never a lock's row): a reader with `SELECT
//! ... LOCK IN SHARE MODE` (`NOWAIT` for a try, spelt `FOR SHARE NOWAIT`
//! on MySQL), a writer with `FOR UPDATE`, as above. Readers share the row
//! and a writer excludes them, as the server's own lock table says, so a
//! plain SQL session that locks the row shared or for update is a reader
//! or a writer. The server queues a reader behind a waiting writer, so a
//! stream of readers does not starve a writer (up to the 30 s server waits
//! of waiting forever, between which a reader may pass). Every reader and
//! writer advances the row's fencing counter: a writer's token rises
//! strictly, and a reader's sits between the writers' before and after it.
//! No reader limit. `?rwlock=built` lays read-write locks out from locks
//! instead, as on Redis and etcd (for a `migrate:` from one of those; every
//! client of a name must use the same layout, and a fleet changes layout
//! only with the read-write lock's users stopped). The operator tools
//! ([`MysqlBackend::kill_holder`], [`MysqlBackend::holder_connection`])
//! are for locks: a read-write lock's row records only its latest reader
//! or writer.
//!
//! **Semaphores** ([`lockcore::Semaphore`], [`lockcore::Layout::Native`])
//! of `K` permits lock one of `K` slot rows, `N\x01sem\x01<i>` for `i`
//! from `0000` below `K`, created together on first use. A permit is one
//! `SELECT ... FOR UPDATE SKIP LOCKED` over the slot rows, which locks the
//! first free one: a try is one statement whatever the others hold, and
//! clients trying at the same moment each get a different slot. With every
//! slot held, a waiter waits on every slot at once, each wait a `FOR
//! UPDATE` on a connection of its own, and the first granted is its
//! permit (the others are closed and their threads killed), as in the
//! built layout. A semaphore of more than 8 permits is waited on 8 slots
//! at a time, at random, for a second (the server's shortest lock wait),
//! then every slot is looked at again: a waiter uses at most 8
//! connections, and a permit freed on a slot it is not waiting on is found
//! within about a second. A plain SQL session that locks a slot row `FOR
//! UPDATE` holds that permit. Every permit advances one fencing counter,
//! `N\x01sem`, while it holds its slot, and then proves its transaction
//! alive: so a permit's token is above that of every permit of the
//! semaphore granted before it was asked for, on any slot (two permits
//! taken at the same moment may come back in either order). **Counts
//! that disagree**: a client that finds its own `K` slots held while a
//! slot beyond them is held too (a client counting more) gets
//! [`lockcore::ErrorKind::InvalidConfig`]; to tell a held slot from a free
//! one it locks the free ones beyond its count shared for a moment. A client
//! counting more than the holders is not told: it admits by its own count,
//! and the permits held stay at most the largest count. Needs `SKIP
//! LOCKED` (MariaDB 10.6, MySQL 8.0); an older server gets an
//! `InvalidConfig` error naming `?semaphore=built`, which lays semaphores
//! out from locks instead (also for a `migrate:` from Redis or etcd; every
//! client of a name must use the same layout).
//!
//! **The lease is the connection.** The holding session's `wait_timeout` is
//! the ttl (whole seconds, rounded up), so the server itself ends a stalled
//! holder's session, and its transaction, after a ttl without a statement.
//! The watchdog's renewal is a `SELECT 1` on the holding connection, which
//! keeps it alive and finds it broken; the lost signal fires then. A killed
//! or closed connection frees the row at once (`KILL <id>` is how an
//! operator ends a lock: see [`MysqlBackend::kill_holder`]).
//!
//! **Fencing (strict, also when a holder dies; `?fencing=none` turns it
//! off).** While holding the row
//! lock, the acquirer runs `INSERT ... ON DUPLICATE KEY UPDATE fence =
//! LAST_INSERT_ID(fence + 1)` on the fence row, on *another* connection, in
//! autocommit: the increment is committed on its own and never rolls back
//! with the holder. The lease is granted only after a round trip on the
//! holding connection that follows the committed increment. So for
//! successive holders A then B of a name: A's increment committed, then A's
//! transaction was still alive, then it ended, then B got the row, then B
//! incremented: B's token is larger. A counter that only goes up through
//! committed statements cannot go backwards (rows are never deleted).
//!
//! **Who holds a lock, and leader election (with fencing).** A lock's
//! holder, once its fencing row names its connection, takes the row's user
//! lock, `GET_LOCK('lockcore:<hash of database, table and row>', …)`, on its
//! holding connection; that round trip is also the proof that its
//! transaction outlived the increment. It lets go of the user lock before
//! its row (`DO RELEASE_LOCK(…); ROLLBACK` in one request), and a dead
//! connection loses both. So [`Backend::inspect`](lockcore::raw::Backend::inspect)
//! reads the fencing row and `IS_USED_LOCK` of the user lock, in one
//! statement; the name is held by the recorded owner, with its token, when
//! the server shows the recorded connection holding the user lock (a read
//! that catches a hand-over between the two reads again, for up to about
//! 300 ms). With the user lock free, one more request asks whether the row
//! is locked at all, without waiting (`SELECT ... FOR SHARE NOWAIT`, `LOCK
//! IN SHARE MODE NOWAIT` on MariaDB, in a transaction of its own, rolled
//! back at once): a free row is a free name; a locked one has a holder
//! that has not published itself yet, which is read again for up to about
//! 300 ms and then shown with no owner, token or value, never as free. No
//! privilege is needed beyond the tables'. This makes [`lockcore::Election`]
//! work on MySQL: a candidate with a value records it in
//! `lockcore_locks_value` with its term before it takes the user lock, and
//! inspection shows a value only beside the term it was recorded with, so
//! [`Election::leader`](lockcore::Election::leader) never names a value
//! with another leader's term. Waiters are not counted (`LockInfo::waiters`
//! is `None`).
//!
//! The row is what excludes; the user lock only names the holder. Any
//! session may take a user lock (`GET_LOCK` needs no privilege), so a
//! holder that finds its user lock taken by another session within a
//! second (the server frees a dead session's row before its user locks)
//! holds the name unpublished, and inspection, seeing a user lock held by
//! a connection the fencing row does not name, answers with an error
//! rather than a holder it cannot name. Such a holder takes the user lock
//! of its term instead (`GET_LOCK('lockcore:<hash of database, table, row
//! and token>', 0)`), which no earlier holder has a reason to hold: once
//! the other session lets go of the row's user lock, inspection finds the
//! term's held by the recorded connection and names the holder, until a
//! renewal takes the row's user lock too; it lets go of both before its
//! row. Only clients with `fencing=strict` take the user lock: a holder
//! with `fencing=none`, a client of an earlier version, or a plain SQL
//! session that locks the row is shown held with no owner (the row lock
//! is seen, not who holds it), and `?fencing=none` has neither inspection
//! nor elections.
//! A deployment that has not created `lockcore_locks_value` (with
//! `ensure_schema=false`, or an account that may not create it) locks and
//! inspects, and has no elections.
//!
//! **Listing and roles.** [`Backend::list`](lockcore::raw::Backend::list)
//! and [`Backend::inspect_role`](lockcore::raw::Backend::inspect_role)
//! ask the server how rows are locked with reads that never wait (`SKIP
//! LOCKED`, in a transaction rolled back in the same request): a page of
//! the lock table locked shared skips the rows held for update, and a
//! read-write lock's row locked for update after that skips it while
//! readers hold it. That tells whether a row is held, not by whom (the
//! server's lock tables, for `PROCESS`, would): a semaphore's permits show
//! one holder per slot held and a read-write lock's readers one holder
//! for them all, with no owner or token, and readers with a writer
//! waiting behind them look like a writer. Rows are never deleted, so a
//! listing reads a bounded number of rows under its prefix. For the moment
//! of a probe the free rows it looked at are locked shared: a try asking
//! for one then is refused once and asks again, and a try for a permit
//! may find that slot taken. Both need `SKIP LOCKED`, and answer `None`
//! without it.
//!
//! **Round trips.** With fencing, an uncontended acquisition is four round
//! trips: the transaction's start (`SET SESSION ...; START TRANSACTION;
//! SELECT CONNECTION_ID()`, one multi-statement request), the locking read,
//! the counter's increment (the one durable commit), and the `GET_LOCK`
//! that proves the transaction outlived it (a `SELECT 1` for a reader or a
//! permit). A candidate's value is one more autocommit insert. A release is
//! one (`ROLLBACK`, after `RELEASE_LOCK` for a lock). An inspection is one
//! read for a held name, two for a free one (the row's lock looked at),
//! and a third when that look finds the row locked (its rollback).
//! `?fencing=none` (tokens `None`, exclusion only) skips the increment and
//! the proof: two round trips to acquire (three after a lock wait longer
//! than a tenth of the ttl, whose `SELECT 1` restarts the validity) and no
//! durable commit at all (the row's first use excepted, which inserts it).
//! Lock connections, and those of the fencing counter, are kept by the
//! backend itself (up to `pool_size` idle of each), not in a sqlx pool,
//! which would ping each one it takes back: a round trip per lock cycle. An
//! idle one is pinged before use only after a second idle, and closed after
//! a minute.
//!
//! **A held lock holds a connection** (see
//! [`LeaseKind::Connection`](lockcore::LeaseKind::Connection)), and so does a
//! waiting one: how many a client can hold at once is bounded by the
//! server's `max_connections` (151 by default), not by `pool_size`.
//!
//! **Connections.** Every waiting or held lock has a connection of its own
//! (the server's lock wait and the open transaction live on it): an idle
//! one (up to `pool_size`, 32 by default, are kept) when there is one, else
//! one opened for it, kept or closed after it. So waiters never take the
//! connections a `try` or a second lock needs, and how many locks can be
//! held or awaited at once is bounded by the server's `max_connections`,
//! not by `pool_size`. The fencing counter runs on idle connections of its
//! own (as many kept), and a small sqlx pool (`aux_pool_size`, 8) runs the
//! other short statements.
//!
//! **Cancel safety.** The transaction is never a sqlx `Transaction` (whose
//! rollback is only queued when dropped): a connection with an open
//! transaction that is dropped (an acquire future dropped midway, a lease
//! dropped without release) is detached from the pool and closed, and its
//! server thread is `KILL`ed in the background, so the row is free after one
//! round trip.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let locker = lockcore_mysql::connect("mysql://app:secret@127.0.0.1:3306/app?pool_size=16").await?;
//! let guard = locker.lock("jobs/nightly").await?; // row 'jobs/nightly' of lockcore_locks
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
pub mod config;
mod core;
mod counter;
mod error;
mod holder;
mod holding;
mod idle;
mod lease;
mod listing;
mod publish;
mod slots;
mod sql;
mod transaction;

pub use config::{MysqlConfig, NAME, SCHEMES};
pub use core::MysqlBackend;
pub use sql::schema_sql;

use lockcore::Locker;

/// Connects to the server that `url` names (`mysql://` or `mariadb://`, see
/// [`config`]) and returns a [`Locker`] over it.
///
/// # Errors
///
/// As [`MysqlConfig::parse`] and [`MysqlBackend::connect`].
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect(url: &str) -> lockcore::Result<Locker> {
    let cfg = MysqlConfig::parse(url)?;
    Ok(Locker::new(MysqlBackend::connect(cfg).await?))
}
