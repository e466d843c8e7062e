//! The one place where the driver's errors become lockcore errors, and the
//! server's error numbers this backend reacts to.

use std::time::Duration;

use lockcore::{Error, ErrorKind};
use sqlx::mysql::MySqlDatabaseError;

use crate::config::NAME;

/// MySQL/MariaDB error numbers this backend reacts to.
pub(crate) mod code {
    /// `ER_LOCK_WAIT_TIMEOUT`: the lock wait ran out (also MariaDB's `NOWAIT`).
    pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// `ER_LOCK_NOWAIT` (MySQL 8): the row is locked and `NOWAIT` was given.
    pub(crate) const LOCK_NOWAIT: u16 = 3572;
    /// `ER_QUERY_INTERRUPTED`: `KILL QUERY` ended the statement.
    pub(crate) const QUERY_INTERRUPTED: u16 = 1317;
    /// `ER_DUP_ENTRY`.
    pub(crate) const DUP_ENTRY: u16 = 1062;
    /// `ER_ACCESS_DENIED_ERROR`.
    pub(crate) const ACCESS_DENIED: u16 = 1045;
    /// `ER_DBACCESS_DENIED_ERROR`.
    pub(crate) const DB_ACCESS_DENIED: u16 = 1044;
    /// `ER_BAD_DB_ERROR`.
    pub(crate) const BAD_DB: u16 = 1049;
    /// `ER_NO_SUCH_TABLE`.
    pub(crate) const NO_SUCH_TABLE: u16 = 1146;
    /// `ER_CONNECTION_KILLED` (MariaDB): this session was killed.
    pub(crate) const CONNECTION_KILLED: u16 = 1927;
    /// `ER_SERVER_SHUTDOWN`: the server is shutting down.
    pub(crate) const SERVER_SHUTDOWN: u16 = 1053;
    /// `ER_CON_COUNT_ERROR`: too many connections.
    pub(crate) const TOO_MANY_CONNECTIONS: u16 = 1040;
    /// `ER_USER_LIMIT_REACHED`: the account's `max_user_connections` (or
    /// another resource limit) is reached.
    pub(crate) const USER_LIMIT_REACHED: u16 = 1226;
    /// `ER_TOO_MANY_USER_CONNECTIONS`: the server-wide
    /// `max_user_connections` is reached.
    pub(crate) const TOO_MANY_USER_CONNECTIONS: u16 = 1203;
    /// `ER_PARSE_ERROR`: a statement the server does not know.
    pub(crate) const PARSE_ERROR: u16 = 1064;
    /// `ER_NO_SUCH_THREAD`: `KILL` of a session that is already gone.
    pub(crate) const NO_SUCH_THREAD: u16 = 1094;
}

/// The MySQL error number of `e`, if the server sent one.
pub(crate) fn db_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}

/// Maps a driver error to a lockcore error; `what` says what was tried.
pub(crate) fn map_err(e: sqlx::Error, what: &str, server: &str) -> Error {
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        sqlx::Error::Configuration(_) => ErrorKind::InvalidConfig,
        sqlx::Error::Database(_) => match db_number(&e) {
            Some(code::ACCESS_DENIED | code::DB_ACCESS_DENIED) => ErrorKind::Unauthorized,
            Some(code::BAD_DB | code::NO_SUCH_TABLE) => ErrorKind::InvalidConfig,
            Some(
                code::CONNECTION_KILLED
                | code::SERVER_SHUTDOWN
                | code::TOO_MANY_CONNECTIONS
                | code::TOO_MANY_USER_CONNECTIONS
                | code::USER_LIMIT_REACHED,
            ) => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        _ => ErrorKind::Backend,
    };
    // 1226 also reports an account's hourly limits: only its
    // max_user_connections is about connections.
    let limit = match db_number(&e) {
        Some(code::TOO_MANY_CONNECTIONS | code::TOO_MANY_USER_CONNECTIONS) => true,
        Some(code::USER_LIMIT_REACHED) => e.to_string().contains("max_user_connections"),
        _ => false,
    };
    let hint = match kind {
        ErrorKind::Unavailable if limit => {
            "; the server lets this client open no more connections (its max_connections, or the account's max_user_connections): every lock held or awaited keeps a connection of its own, so that limit bounds how many locks one client holds at once"
        }
        ErrorKind::Unavailable => "; is the server up and reachable?",
        ErrorKind::InvalidConfig => "; check the database and the table (ensure_schema creates it)",
        ErrorKind::Unauthorized => {
            "; check the user, the password and the user's grants on the database"
        }
        _ => "",
    };
    Error::new(kind, NAME, format!("{what} on {server}: {e}{hint}")).with_source(e)
}

/// No greeting within `after` while connecting: a MySQL server greets as
/// soon as the connection opens, so the one there is stopped or speaks
/// another protocol.
pub(crate) fn no_greeting(server: &str, after: Duration) -> Error {
    Error::unavailable(
        NAME,
        format!("connecting to {server}: the server did not answer as MySQL within {after:?} (a MySQL server greets at once: is it stopped, or is another service listening on that port?)"),
    )
}
