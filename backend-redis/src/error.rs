//! The one place where the client library's errors become lockcore errors.

use lockcore::{Error, ErrorKind};
use redis::RedisError;

use crate::config::NAME;

/// Maps a client error. `mutating`: the request may have changed server
/// state, so a cut-off request is `Indeterminate` rather than `Unavailable`.
pub(crate) fn map_err(e: RedisError, what: &str, server: &str, mutating: bool) -> Error {
    let kind = if e.is_connection_refusal() {
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
