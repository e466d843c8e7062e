//! A granted lease: the grant, and the handle that renews and releases it.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::Result;
use crate::raw::{Renewal, Renewing};

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

    /// Answers a renewal with `ttl` at once, without waiting: from what
    /// the backend already knows (a keepalive and a read of the key, sent
    /// recently enough, that serve many leases: etcd's shared lease), or
    /// by a renewal it can make in place (the memory backend's map, in
    /// this process). `Some` only with the answer [`renew`](Self::renew)
    /// would give now, its validity counted from when that knowledge was
    /// asked for (or from now, for a renewal made in place); `None` when
    /// the server must be asked (the watchdog then calls `renew`). The
    /// default knows nothing.
    ///
    /// A `Some` answer is a renewal made: the watchdog calls this only
    /// where it would call `renew`, one at a time under the lease's
    /// renewal turn, and applies the answer.
    fn renew_known(&self, ttl: Duration) -> Option<Renewal> {
        let _ = ttl;
        None
    }

    /// Starts a renewal with `ttl` whose answer goes to `done` rather than
    /// to a future: for a backend that sends many leases' renewals
    /// together, whose task answers each from its part of the reply (with
    /// no future, timer or wake-up of the watchdog for each lease).
    /// `Err(done)` hands the renewal back unstarted when the backend
    /// cannot (the default): the watchdog then renews this lease by
    /// [`renew`](Self::renew) from then on.
    ///
    /// The answer is what [`renew`](Self::renew) would return, counted
    /// from when the renewal was sent or earlier ([`Renewing::sent`], when
    /// it was asked, will do); it may be given at once, inside this call, or later from any
    /// thread. The renewals one reply answers are best answered together
    /// ([`Renewing::answer_with`] in one [`Answers`](crate::raw::Answers)).
    /// Dropping `done` answers that the renewal failed. A renewal not yet sent when
    /// [`Renewing::is_stale`] turns true should not be sent: the lease is
    /// lost by then. The lease's next renewal, its `extend` and its
    /// release wait for the answer until the lease's validity deadline,
    /// where the watchdog raises the lost signal if none came (off a tokio
    /// runtime, with no timer, they wait for the answer or the drop of
    /// `done`); an answer that comes later counts as none.
    ///
    /// # Errors
    ///
    /// `Err(done)`: the backend cannot answer this way; nothing was sent.
    fn renew_then(&self, ttl: Duration, done: Renewing) -> std::result::Result<(), Renewing> {
        let _ = ttl;
        Err(done)
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
