//! A granted lease: the grant, and the handle that renews and releases it.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::Result;

/// A lease granted by the backend.
#[derive(Debug)]
pub struct Grant {
    /// The backend's handle on the lease, used to renew and release it.
    pub lease: Box<dyn BackendLease>,
    /// The fencing token, `None` when the backend has no safe one.
    pub fence: Option<u64>,
    /// Until when the lease is valid on the client's monotonic clock: the
    /// instant the granting request was sent, plus the ttl, minus any drift
    /// allowance. The guard reports the lease lost when this passes without
    /// a successful renewal.
    pub valid_until: Instant,
}

/// The outcome of [`Backend::try_acquire_all`](crate::raw::Backend::try_acquire_all).
#[derive(Debug)]
#[non_exhaustive]
pub enum AllOrNone {
    /// Every name taken: one grant per request, in their order.
    Granted(Vec<Grant>),
    /// Some name is held: none was taken.
    Held,
    /// The backend cannot take these names in one request (the default):
    /// nothing was sent.
    Unsupported,
}

/// The outcome of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed; the lease is now valid until this instant.
    Renewed {
        /// The new validity deadline (send time of the request + ttl − drift).
        valid_until: Instant,
    },
    /// The server no longer holds this lease for this owner.
    Lost,
}

/// The outcome of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The lease was held and is now released.
    Released,
    /// The server no longer held this lease for this owner (it expired, or
    /// another owner has the name now, which was left alone).
    NotHeld,
}

/// The backend's handle on one granted lease.
///
/// `renew` may be called concurrently with `release` (the watchdog and the
/// guard's owner run independently); implementations must stay correct when
/// that happens, which owner-checked operations do by construction. The
/// `Locker` runs one renewal of a lease at a time.
///
/// What the results mean, also on a broken connection:
///
/// | outcome | `renew` | `release` |
/// |---|---|---|
/// | the server confirmed | `Ok(Renewed { valid_until })`, counted from the request's send time | `Ok(Released)` |
/// | the server said the lease is not this owner's, or what carries it (session, connection) is known to be gone | `Ok(Lost)` | `Ok(NotHeld)` |
/// | the server could not be asked, or did not answer in time | `Err` with [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) or [`ErrorKind::Indeterminate`](crate::ErrorKind::Indeterminate): the watchdog retries while the lease is valid | `Err` likewise: the lease then ends by its ttl, session or connection |
///
/// A backend whose lease is a connection ([`LeaseKind::Connection`](crate::capabilities::LeaseKind))
/// must still free the name within the ttl without a renewal, also while the
/// connection stays open (MySQL sets the session's `wait_timeout` from the
/// ttl): a stalled holder must not keep a name forever.
#[async_trait]
pub trait BackendLease: Send + Sync + fmt::Debug + 'static {
    /// Extends the lease to `ttl` from now, only if this owner still holds it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease.
    async fn renew(&self, ttl: Duration) -> Result<Renewal>;

    /// Checks, without asking the server, that the lease can be renewed
    /// with `ttl` (for [`LockGuard::extend`](crate::guard::LockGuard::extend)): a
    /// backend whose server keeps the ttl it granted (an etcd lease, a
    /// ZooKeeper session) refuses another with
    /// [`ErrorKind::InvalidConfig`](crate::error::ErrorKind::InvalidConfig), and the
    /// lease is left exactly as it was. The default accepts any ttl.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::error::ErrorKind::InvalidConfig) for a
    /// ttl this lease cannot be renewed with.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        let _ = ttl;
        Ok(())
    }

    /// Answers a renewal with `ttl` at once from what the backend already
    /// knows, with no request of its own and without waiting: a keepalive
    /// and a read of the key, sent recently enough, that serve many leases
    /// (etcd's shared lease). `Some` only with the answer
    /// [`renew`](Self::renew) would give now, its validity counted from
    /// when that knowledge was asked for; `None` when the server must be
    /// asked (the watchdog then calls `renew`). The default knows nothing.
    fn renew_known(&self, ttl: Duration) -> Option<Renewal> {
        let _ = ttl;
        None
    }

    /// Releases the lease, only if this owner still holds it.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have released; the lease then ends
    /// by its ttl, session or connection as if the holder had died.
    async fn release(&self) -> Result<Released>;

    /// Stops whatever keeps the lease alive without releasing it, as if the
    /// holding process had died (a ttl lease then expires, a session or
    /// connection is dropped without a goodbye). Used by
    /// [`LockGuard::abandon`](crate::guard::LockGuard::abandon).
    fn abandon(&self) {}
}
