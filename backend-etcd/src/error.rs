//! The one place where the client library's errors become lockcore errors.

use lockcore::{Error, ErrorKind};

use crate::config::NAME;

/// "`what` on `servers`", for the error of a request that did not answer
/// in time: written only when that error is made, not at every request.
pub(crate) struct On<'a>(pub(crate) &'a str, pub(crate) &'a str);

impl std::fmt::Display for On<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}", self.0, self.1)
    }
}

/// Maps a client error to the lockcore kind. `mutating`: the request may
/// have created state, so a cut-off one is `Indeterminate`.
pub(crate) fn map_err(e: etcd_client::Error, what: &str, servers: &str, mutating: bool) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    let cut_off = if mutating {
        ErrorKind::Indeterminate
    } else {
        ErrorKind::Unavailable
    };
    let (kind, hint) = match &e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                (cut_off, "is the cluster up and does it have a leader?")
            }
            // tonic reports a broken connection (an h2 or I/O error) as
            // Unknown or Internal, with the transport error as source.
            Code::Unknown | Code::Internal
                if std::error::Error::source(s).is_some()
                    || ["h2 protocol", "transport", "connection", "leader"]
                        .iter()
                        .any(|w| s.message().contains(w)) =>
            {
                (cut_off, "is the cluster up and does it have a leader?")
            }
            Code::Unauthenticated | Code::PermissionDenied => (
                ErrorKind::Unauthorized,
                "check the user, password and the role's permissions on the key prefix",
            ),
            // A wrong password is `InvalidArgument` ("authentication
            // failed"), credentials for a cluster without authentication
            // `FailedPrecondition` ("authentication is not enabled").
            Code::InvalidArgument | Code::FailedPrecondition
                if s.message().contains("authentication") =>
            {
                (
                    ErrorKind::Unauthorized,
                    "check the user and password (and that the cluster has authentication enabled)",
                )
            }
            _ => (ErrorKind::Backend, "see the source error"),
        },
        E::TransportError(_) | E::IoError(_) => (cut_off, "is an etcd member listening there?"),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) | E::EndpointError(_) => {
            (ErrorKind::InvalidConfig, "check the endpoints and options")
        }
        _ => (ErrorKind::Backend, "see the source error"),
    };
    Error::new(kind, NAME, format!("{what} on {servers}: {e} ({hint})")).with_source(e)
}

pub(crate) fn is_transient(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Indeterminate)
}

/// The server refused a request for naming a lease it does not have (the
/// request applied nothing).
pub(crate) fn is_lease_not_found(e: &Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<etcd_client::Error>())
        .is_some_and(
            |e| matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::NotFound),
        )
}

/// Whether a failed first request met a server that does not speak etcd's
/// gRPC over HTTP/2 (an HTTP/2 protocol error, or a connection closed in
/// the handshake), rather than no server at all.
pub(crate) fn is_other_protocol(e: &Error) -> bool {
    let Some(etcd_client::Error::GRpcStatus(s)) =
        std::error::Error::source(e).and_then(|s| s.downcast_ref::<etcd_client::Error>())
    else {
        return false;
    };
    let text = format!("{s:?}");
    matches!(
        s.code(),
        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
    ) && [
        "h2 protocol",
        "BrokenPipe",
        "ConnectionReset",
        "connection closed",
    ]
    .iter()
    .any(|w| text.contains(w))
        && !text.contains("refused")
}
