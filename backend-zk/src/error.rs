//! The one place where the client library's errors become lockcore errors.

use lockcore::{Error, ErrorKind};
use zookeeper_client as zk;

use crate::config::NAME;

/// Whether `e` comes from the connection rather than the server: the
/// request may or may not have reached it. The client reports a connection
/// that stopped answering as a custom error ("no response from connection").
pub(crate) fn is_connection_error(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::NoHosts
            | zk::Error::Timeout
            | zk::Error::Custom(_)
            | zk::Error::UnexpectedError(_)
    )
}

/// Maps a client error to the lockcore error kind; `what` says what was
/// tried. `mutating`: the request may have created state, so a connection
/// error or a timeout is `Indeterminate` rather than `Unavailable`.
pub(crate) fn map_err(e: zk::Error, what: impl Into<String>, mutating: bool) -> Error {
    let what = what.into();
    let cut_off = if mutating {
        ErrorKind::Indeterminate
    } else {
        ErrorKind::Unavailable
    };
    let (kind, hint) = match &e {
        e if is_connection_error(e) => (
            cut_off,
            "no ZooKeeper server answered in time; check the hosts and that a quorum is up",
        ),
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved => (
            ErrorKind::Unavailable,
            "the ZooKeeper session ended; the next attempt opens a new one",
        ),
        zk::Error::AuthFailed => (
            ErrorKind::Unauthorized,
            "the server refused the digest credentials",
        ),
        zk::Error::NoAuth => (
            ErrorKind::Unauthorized,
            "not authorized: check the credentials and the ACLs on the lock path",
        ),
        zk::Error::InvalidAcl => (
            ErrorKind::InvalidConfig,
            "the server refused the ACL of the lock nodes",
        ),
        _ => (ErrorKind::Backend, "unexpected ZooKeeper error"),
    };
    Error::new(kind, NAME, format!("{what}: {e} ({hint})")).with_source(e)
}

/// Whether a client error says the session is over for good.
pub(crate) fn is_session_end(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
    )
}
