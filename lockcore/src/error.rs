//! The one error type every backend returns, and the kinds callers match on.

use std::fmt;
use std::time::Duration;

use crate::info::HolderInfo;

/// A boxed error from a backend's native client, kept as [`std::error::Error::source`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as a caller can match on it.
///
/// Contention is not an error: a `try` acquisition that finds the name held
/// returns `Ok(None)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Waiting for the lock (or for the server) ran out of time.
    Timeout,
    /// The lease is gone or can no longer be trusted: it expired, renewal was
    /// refused, the session or connection that kept it ended.
    Lost,
    /// The lock name is not acceptable (empty, too long, NUL or control
    /// characters). No server was asked.
    InvalidName,
    /// An option or a connection setting is out of range or malformed.
    InvalidConfig,
    /// The server refused the credentials, or their absence (a wrong
    /// password, a user without the rights on the lock's keys or table).
    Unauthorized,
    /// The server is down or unreachable.
    Unavailable,
    /// The request may or may not have applied on the server (a timed-out
    /// `SET NX`, a lock RPC that was cut off). The library has already started
    /// cleaning up what it may have created.
    Indeterminate,
    /// Any other error reported by the backend; see the source error.
    Backend,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timed out",
            ErrorKind::Lost => "lease lost",
            ErrorKind::InvalidName => "invalid lock name",
            ErrorKind::InvalidConfig => "invalid configuration",
            ErrorKind::Unauthorized => "authentication refused",
            ErrorKind::Unavailable => "server unavailable",
            ErrorKind::Indeterminate => "outcome unknown (the request may have applied)",
            ErrorKind::Backend => "backend error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The error of every lock operation, whatever the backend.
///
/// It carries a [`kind`](Error::kind) to match on, the backend's name, the
/// lock name where there is one, a message that says what was tried, and the
/// backend's native error as [`source`](std::error::Error::source) (which a
/// caller can downcast).
///
/// ```
/// use lockcore::{Error, ErrorKind};
///
/// let err = Error::new(ErrorKind::Unavailable, "redis", "connect to 127.0.0.1:6379 refused")
///     .with_name("jobs/nightly");
/// assert_eq!(err.kind(), ErrorKind::Unavailable);
/// assert_eq!(err.name(), Some("jobs/nightly"));
/// assert!(err.to_string().contains("jobs/nightly"));
/// ```
#[derive(thiserror::Error)]
#[error("{backend}: {kind}{}{}: {message}{}", fmt_name(.name), fmt_op(.operation), fmt_holder(.holder.as_deref()))]
pub struct Error {
    kind: ErrorKind,
    backend: &'static str,
    name: Option<String>,
    operation: Option<&'static str>,
    message: String,
    holder: Option<Box<HolderInfo>>,
    #[source]
    source: Option<BoxError>,
}

fn fmt_op(op: &Option<&'static str>) -> String {
    match op {
        Some(op) => format!(" in {op}"),
        None => String::new(),
    }
}

fn fmt_holder(holder: Option<&HolderInfo>) -> String {
    let Some(h) = holder else {
        return String::new();
    };
    let mut out = String::from(" (held by ");
    match h.owner.as_deref() {
        Some(owner) => out.push_str(&crate::info::short_owner(owner)),
        None => out.push_str("an owner it does not name"),
    }
    if let Some(f) = h.fence {
        out.push_str(&format!(", fencing token {f}"));
    }
    if let Some(since) = h.since.and_then(|t| t.elapsed().ok()) {
        let ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        out.push_str(&format!(", for {:?}", Duration::from_millis(ms)));
    }
    out.push(')');
    out
}

fn fmt_name(name: &Option<String>) -> String {
    match name {
        Some(n) => format!(" on lock {n:?}"),
        None => String::new(),
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("backend", &self.backend)
            .field("name", &self.name)
            .field("operation", &self.operation)
            .field("message", &self.message)
            // The holder's owner and token, not its value (another
            // process's data).
            .field(
                "holder",
                &self
                    .holder
                    .as_ref()
                    .map(|h| (h.owner.as_deref().map(crate::info::short_owner), h.fence)),
            );
        if let Some(s) = &self.source {
            d.field("source", &format_args!("{s}"));
        }
        d.finish()
    }
}

impl Error {
    /// A new error of `kind` from `backend` (its short name, e.g. `"redis"`).
    pub fn new(kind: ErrorKind, backend: &'static str, message: impl Into<String>) -> Self {
        Error {
            kind,
            backend,
            name: None,
            operation: None,
            message: message.into(),
            holder: None,
            source: None,
        }
    }

    /// Names the lock the operation was about.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Names the lock, unless a name is set already. The `Locker` and the
    /// guard put the lock name on every backend error this way, so a backend
    /// need not.
    #[must_use]
    pub fn or_name(mut self, name: &str) -> Self {
        if self.name.is_none() {
            self.name = Some(name.to_owned());
        }
        self
    }

    /// Names the operation (`"acquire"`, `"release"`, ...), unless one is
    /// named already. The `Locker` and the guards name theirs this way.
    #[must_use]
    pub fn or_operation(mut self, operation: &'static str) -> Self {
        if self.operation.is_none() {
            self.operation = Some(operation);
        }
        self
    }

    /// The operation that failed, where it was named.
    pub fn operation(&self) -> Option<&'static str> {
        self.operation
    }

    /// Attaches who held the name (to a timeout or a contention).
    #[must_use]
    pub fn with_holder(mut self, holder: HolderInfo) -> Self {
        self.holder = Some(Box::new(holder));
        self
    }

    /// Who held the name when an acquisition timed out
    /// ([`ErrorKind::Timeout`]), as the backend told right after, where it
    /// can tell (see [`Locker::inspect`](crate::Locker::inspect)).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// let locker = lockcore::Locker::memory();
    /// let held = locker.lock("reports").await?;
    /// let err = locker.lock_timeout("reports", Duration::from_millis(50)).await.unwrap_err();
    /// let holder = err.holder().expect("the memory backend tells");
    /// assert_eq!(holder.fence, held.fence());
    /// # Ok(()) }
    /// ```
    pub fn holder(&self) -> Option<&HolderInfo> {
        self.holder.as_deref()
    }

    /// Attaches the backend's native error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The short name of the backend that reported it.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The lock name the operation was about, if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The message, without backend, kind and name.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Shorthand for `Error::new(ErrorKind::InvalidConfig, ..)`.
    pub fn invalid_config(backend: &'static str, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidConfig, backend, message)
    }

    /// Shorthand for `Error::new(ErrorKind::Unavailable, ..)`.
    pub fn unavailable(backend: &'static str, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unavailable, backend, message)
    }

    /// Shorthand for `Error::new(ErrorKind::Lost, ..)`.
    pub fn lost(backend: &'static str, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Lost, backend, message)
    }

    /// Shorthand for `Error::new(ErrorKind::Backend, ..)`.
    pub fn backend_error(backend: &'static str, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Backend, backend, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn display_names_backend_kind_and_lock() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::new(ErrorKind::Unavailable, "redis", "connecting to 127.0.0.1:1")
            .with_name("a/b")
            .with_source(io);
        assert_eq!(
            e.to_string(),
            "redis: server unavailable on lock \"a/b\": connecting to 127.0.0.1:1"
        );
        let src = e.source().expect("source kept");
        assert!(src.downcast_ref::<std::io::Error>().is_some());
    }
}
