//! PostgreSQL backend for [`lockcore`]: session-level advisory locks,
//! through sqlx.
//!
//! A lock on a name is the advisory lock on the key
//! `hashtextextended(name, 0)`, held by a connection of its own, so any
//! client shares the name:
//!
//! ```sql
//! SELECT pg_advisory_lock(hashtextextended('jobs/nightly', 0));
//! ```
//!
//! Two names whose 64-bit hashes collide only contend with each other: they
//! never both hold. The lease is the connection
//! ([`LeaseKind::Connection`](lockcore::LeaseKind::Connection)): a holder
//! whose connection closes frees the name at once, and each renewal sets the
//! session's `idle_session_timeout` to the ttl, so a holder that stalls
//! loses the name within its ttl. A waiter waits in the server's own queue
//! (fair, woken by the server), bounded by `lock_timeout`; a dropped wait
//! closes its connection and ends its server session
//! (`pg_terminate_backend`), and the server also ends a wait whose client
//! went away (`client_connection_check_interval`).
//!
//! Fencing tokens come from a counter row per name in `lockcore_locks`,
//! advanced and committed by the statement that takes the lock, to at
//! least the server's clock in microseconds: strict across holders, a
//! crashed holder (its increment was committed before it was told) and a
//! server restart. The same row names the holder (owner, server process,
//! since, value) for [`inspect`](lockcore::Locker::inspect) and elections.
//! A read-write lock's readers take the shared advisory lock on
//! `hashtextextended(name, 1)` and its writer the exclusive one (readers
//! advance the writer's counter row, `name || chr(1) || 'rw'`, so their
//! tokens sit between writers'); semaphores are built from locks.
//!
//! How many locks one client can hold or await at once is bounded by the
//! server's `max_connections` (100 by default), less its other clients:
//! the acquisition that finds no connection left fails with `Unavailable`,
//! naming the limit. The settings are in [`PostgresConfig`].
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let locker = lockcore_postgres::connect("postgres://app:secret@127.0.0.1:5432/app").await?;
//! let guard = locker.lock("jobs/nightly").await?;
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
pub mod config;
mod conn;
mod core;
mod error;
mod holder;
mod lease;
mod sql;

pub use config::{PostgresConfig, SslMode, NAME, SCHEMES};
pub use core::PostgresBackend;
pub use sql::{lock_statements, schema_sql};

use lockcore::Locker;

/// Connects to the server that `url` names (`postgres://` or
/// `postgresql://`, see [`config`]) and returns a [`Locker`] over it.
///
/// # Errors
///
/// As [`PostgresConfig::parse`] and [`PostgresBackend::connect`].
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect(url: &str) -> lockcore::Result<Locker> {
    let cfg = PostgresConfig::parse(url)?;
    Ok(Locker::new(PostgresBackend::connect(cfg).await?))
}
