//! The one place where the driver's errors become lockcore errors, and the
//! server's SQLSTATE codes this backend reacts to.

use lockcore::{Error, ErrorKind};

use crate::config::NAME;

/// SQLSTATE codes this backend reacts to.
pub(crate) mod code {
    /// `lock_not_available`: `lock_timeout` ran out.
    pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
    /// `admin_shutdown`: the session was terminated, or the server stops.
    pub(crate) const ADMIN_SHUTDOWN: &str = "57P01";
    /// `crash_shutdown`.
    pub(crate) const CRASH_SHUTDOWN: &str = "57P02";
    /// `cannot_connect_now`: the server is starting or stopping.
    pub(crate) const CANNOT_CONNECT_NOW: &str = "57P03";
    /// `idle_session_timeout`: the session was idle past its timeout.
    pub(crate) const IDLE_SESSION_TIMEOUT: &str = "57P05";
    /// `too_many_connections`.
    pub(crate) const TOO_MANY_CONNECTIONS: &str = "53300";
    /// `invalid_password`.
    pub(crate) const INVALID_PASSWORD: &str = "28P01";
    /// `invalid_authorization_specification`.
    pub(crate) const INVALID_AUTHORIZATION: &str = "28000";
    /// `insufficient_privilege`.
    pub(crate) const INSUFFICIENT_PRIVILEGE: &str = "42501";
    /// `invalid_catalog_name`: no such database.
    pub(crate) const INVALID_CATALOG: &str = "3D000";
    /// `invalid_schema_name`: at a CREATE, no schema on the search_path
    /// exists ("no schema has been selected to create in").
    pub(crate) const INVALID_SCHEMA_NAME: &str = "3F000";
    /// `undefined_column`.
    pub(crate) const UNDEFINED_COLUMN: &str = "42703";
    /// `invalid_column_reference`: among others, no unique key matches an
    /// `ON CONFLICT` target.
    pub(crate) const INVALID_COLUMN_REFERENCE: &str = "42P10";
    /// `datatype_mismatch`: a column of another type than a statement
    /// writes.
    pub(crate) const DATATYPE_MISMATCH: &str = "42804";
    /// `wrong_object_type`: a relation of the name that cannot be
    /// written as a table (a view that is not updatable, a sequence).
    pub(crate) const WRONG_OBJECT_TYPE: &str = "42809";
    /// `undefined_function`: e.g. a column of another type than a
    /// statement computes with (`text + integer`).
    pub(crate) const UNDEFINED_FUNCTION: &str = "42883";
    /// `ambiguous_function`.
    pub(crate) const AMBIGUOUS_FUNCTION: &str = "42725";
    /// `generated_always`: a generated or identity column written.
    pub(crate) const GENERATED_ALWAYS: &str = "428C9";
    /// `feature_not_supported`: e.g. an upsert on a view or table it
    /// cannot apply to.
    pub(crate) const FEATURE_NOT_SUPPORTED: &str = "0A000";
    /// `object_not_in_prerequisite_state`: e.g. a view that cannot be
    /// written.
    pub(crate) const NOT_IN_PREREQUISITE_STATE: &str = "55000";
    /// `undefined_table`.
    pub(crate) const UNDEFINED_TABLE: &str = "42P01";
    /// `undefined_object`: at connecting, a setting this server does not
    /// know (PostgreSQL before 14 has no `client_connection_check_interval`).
    pub(crate) const UNDEFINED_OBJECT: &str = "42704";
}

/// The SQLSTATE of `e`, if the server sent one.
pub(crate) fn sqlstate(e: &sqlx::Error) -> Option<String> {
    Some(e.as_database_error()?.code()?.into_owned())
}

/// Whether `e` says the connection, and with it the server session and
/// every advisory lock it held, is gone.
pub(crate) fn session_gone(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => matches!(
            sqlstate(e).as_deref(),
            Some(
                code::ADMIN_SHUTDOWN
                    | code::CRASH_SHUTDOWN
                    | code::IDLE_SESSION_TIMEOUT
                    | code::CANNOT_CONNECT_NOW
            )
        ),
        _ => false,
    }
}

/// Maps an error of connecting to `server`: a server that answered, but
/// not as PostgreSQL, is said to be one.
pub(crate) fn connect_err(e: sqlx::Error, server: &str) -> Error {
    let refused =
        matches!(&e, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused);
    let foreign = !refused
        && matches!(
            &e,
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Decode(_)
        );
    if foreign {
        return Error::unavailable(
            NAME,
            format!("connecting to {server}: the server did not answer as PostgreSQL ({e}); is another service listening on that port?"),
        )
        .with_source(e);
    }
    if sqlstate(&e).as_deref() == Some(code::UNDEFINED_OBJECT) {
        return Error::new(
            ErrorKind::InvalidConfig,
            NAME,
            format!("connecting to {server}: {e}; this backend needs PostgreSQL 14 or later (it sets the session's client_connection_check_interval and idle_session_timeout)"),
        )
        .with_source(e);
    }
    map_err(e, "connecting", server)
}

/// Maps a driver error to a lockcore error; `what` says what was tried.
pub(crate) fn map_err(e: sqlx::Error, what: &str, server: &str) -> Error {
    let state = sqlstate(&e);
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        sqlx::Error::Configuration(_) => ErrorKind::InvalidConfig,
        sqlx::Error::Database(_) => match state.as_deref() {
            Some(
                code::INVALID_PASSWORD | code::INVALID_AUTHORIZATION | code::INSUFFICIENT_PRIVILEGE,
            ) => ErrorKind::Unauthorized,
            Some(code::INVALID_CATALOG | code::UNDEFINED_TABLE | code::INVALID_SCHEMA_NAME) => {
                ErrorKind::InvalidConfig
            }
            Some(
                code::ADMIN_SHUTDOWN
                | code::CRASH_SHUTDOWN
                | code::CANNOT_CONNECT_NOW
                | code::IDLE_SESSION_TIMEOUT
                | code::TOO_MANY_CONNECTIONS,
            ) => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        _ => ErrorKind::Backend,
    };
    let hint = match kind {
        ErrorKind::Unavailable if state.as_deref() == Some(code::TOO_MANY_CONNECTIONS) => {
            "; the server lets this client open no more connections (its max_connections, or the role's CONNECTION LIMIT): every lock held or awaited keeps a connection of its own, so that limit bounds how many locks one client holds at once"
        }
        ErrorKind::Unavailable => "; is the server up and reachable?",
        ErrorKind::InvalidConfig if state.as_deref() == Some(code::INVALID_SCHEMA_NAME) => {
            "; the user's search_path names no schema it may make the lock table in (none there, or none it may use): create one, set the role's search_path (ALTER ROLE ... SET search_path), or create the table in advance (lockcore_postgres::schema_sql)"
        }
        ErrorKind::InvalidConfig => "; check the database and the table (ensure_schema creates it)",
        ErrorKind::Unauthorized => "; check the user, the password and the user's grants on the database",
        _ => "",
    };
    Error::new(kind, NAME, format!("{what} on {server}: {e}{hint}")).with_source(e)
}
