//! The one place where the client library's errors become lockcore errors.

use lockcore::{Error, ErrorKind};
use redis::RedisError;

use crate::config::{SyncReplicas, NAME};

/// Maps a client error. `mutating`: the request may have changed server
/// state, so a cut-off request is `Indeterminate` rather than `Unavailable`.
pub(crate) fn map_err(e: RedisError, what: &str, server: &str, mutating: bool) -> Error {
    let kind = if refused_credentials(&e) {
        ErrorKind::Unauthorized
    } else if e.is_connection_refusal() || failing_over(&e) {
        ErrorKind::Unavailable
    } else if e.is_timeout() || e.is_connection_dropped() || e.is_io_error() {
        if mutating {
            ErrorKind::Indeterminate
        } else {
            ErrorKind::Unavailable
        }
    } else {
        ErrorKind::Backend
    };
    Error::new(kind, NAME, format!("{what} on {server}: {e}")).with_source(e)
}

/// Whether the server refused the credentials or their absence (`NOAUTH`,
/// `WRONGPASS`, `NOPERM`, or a refused `AUTH` at the handshake).
///
/// A cluster's first connections report a refused `AUTH` inside an I/O
/// error: its text tells.
pub(crate) fn refused_credentials(e: &RedisError) -> bool {
    let text = e.to_string();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        || ["AuthenticationFailed", "NOAUTH", "WRONGPASS"]
            .iter()
            .any(|w| text.contains(w))
}

/// Maps an error of connecting to `server`: one that is neither a refused
/// connection, nor refused credentials, nor silence came from a server
/// that does not speak Redis (a reset or a reply that does not parse).
pub(crate) fn map_connect_err(e: RedisError, server: &str) -> Error {
    if refused_credentials(&e) || e.is_connection_refusal() || e.is_timeout() {
        return map_err(e, "connect", server, false);
    }
    let shown = e
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    Error::new(
        ErrorKind::Unavailable,
        NAME,
        format!(
            "connect to {server}: the server did not answer as Redis ({shown}); is another service listening on that port?"
        ),
    )
    .with_source(e)
}

/// The error of a write on `server` that fewer replicas confirmed than the
/// replica-sync guard `sync` asks for (`acked` of them); `None` when enough
/// did, or without a guard. `then` says what that leaves.
pub(crate) fn unconfirmed(
    sync: Option<SyncReplicas>,
    server: &str,
    what: &str,
    acked: u32,
    then: &str,
) -> Option<Error> {
    let sync = sync?;
    (acked < sync.count).then(|| {
        Error::unavailable(
            NAME,
            format!(
                "only {acked} of {} replicas confirmed the {what} within {:?} on {server}; {then}",
                sync.count, sync.timeout
            ),
        )
    })
}

/// Whether `e` says the server is not (or not yet) a master that takes
/// writes: a failover under way or just done (`READONLY`, `LOADING`,
/// `MASTERDOWN`, `UNBLOCKED`, or `WAIT` refused on a replica).
pub(crate) fn failing_over(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || matches!(
            e.code(),
            Some("READONLY" | "LOADING" | "MASTERDOWN" | "UNBLOCKED")
        )
        || e.to_string().contains("cannot be used with replica")
}
