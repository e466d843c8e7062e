//! MySQL 8 and MariaDB backend for [`lockcore`]: row locks with
//! `SELECT ... FOR UPDATE`, through sqlx.
//!
//! A lock name is a row of `lockcore_locks` (created on first use, compared
//! byte for byte), held by an open transaction on a connection of its own:
//! the lease is the connection ([`LeaseKind::Connection`](lockcore::LeaseKind::Connection)),
//! and the session's `wait_timeout` follows the ttl, so a holder that dies
//! or stalls frees the row. A lock's fencing token is the server's clock in
//! microseconds, set in its counter row by the holding transaction (no
//! commit of its own; see `counter.rs`); read-write locks and semaphores lock rows of their own; a
//! holder names itself with a user lock (`GET_LOCK`) for inspection; a
//! lock-delay is a record beside the lock that every client of ours honours
//! ([`LockDelay::Recorded`](lockcore::LockDelay::Recorded)).
//!
//! How many locks one client can hold or await at once is bounded by the
//! server's `max_connections` (151 by default) and the account's
//! `max_user_connections`, not by `pool_size`: the acquisition that finds
//! no connection left fails at once with `Unavailable`, naming the limit. The
//! settings are in [`MysqlConfig`]; the tables, the statements, the round
//! trips and the cancel safety are described in `docs/mysql.md` of the
//! repository.
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
mod conn;
mod core;
mod counter;
mod delay;
mod error;
mod holder;
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
