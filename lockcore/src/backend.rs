//! The traits a backend implements.
//!
//! A backend maps acquire, renew and release onto its server and nothing
//! more: name and option validation, reentrancy, the watchdog, the lost
//! signal and the guard live in [`Locker`](crate::Locker), once for all
//! backends.

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::capabilities::Capabilities;
use crate::error::Result;

/// A lease's owner token: 128 random bits, unique per lease.
///
/// Only the holder of this token can renew or release the lease on the server.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// A new random token.
    pub fn random() -> Self {
        OwnerToken(rand::random())
    }

    /// The token as a number.
    pub const fn as_u128(&self) -> u128 {
        self.0
    }

    /// The token from a number (for backends that read it back).
    pub const fn from_u128(v: u128) -> Self {
        OwnerToken(v)
    }
}

impl fmt::Display for OwnerToken {
    /// 32 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

/// Until when an acquisition may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// One attempt, no waiting.
    Now,
    /// Wait until this instant, then give up with `Ok(None)`.
    At(Instant),
    /// Wait until acquired.
    Never,
}

impl Deadline {
    /// The instant, if there is one.
    pub fn instant(&self) -> Option<Instant> {
        match self {
            Deadline::At(t) => Some(*t),
            Deadline::Now | Deadline::Never => None,
        }
    }

    /// Whether waiting is over at `now`.
    pub fn passed(&self, now: Instant) -> bool {
        match self {
            Deadline::Now => true,
            Deadline::At(t) => now >= *t,
            Deadline::Never => false,
        }
    }
}

/// The validity deadline of a lease proven by a request sent at `sent`:
/// `sent + ttl`, less a clock-drift allowance of ttl·1% + 2 ms (the server
/// may time the lease out by a clock that runs a little fast). Every backend
/// computes [`Grant::valid_until`] and [`Renewal::Renewed`] this way.
///
/// ```
/// use std::time::{Duration, Instant};
///
/// let sent = Instant::now();
/// let until = lockcore::backend::validity_deadline(sent, Duration::from_secs(10));
/// assert_eq!(until, sent + Duration::from_millis(9_898));
/// ```
pub fn validity_deadline(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

/// One acquisition, as [`Locker`](crate::Locker) hands it to the backend.
/// The name and options are already validated.
#[derive(Debug)]
pub struct AcquireRequest<'a> {
    /// The lock name.
    pub name: &'a str,
    /// The new lease's owner token.
    pub owner: OwnerToken,
    /// The lease's ttl.
    pub ttl: Duration,
    /// How long to wait when the name is held.
    pub deadline: Deadline,
    /// The lease's lost signal. A backend that learns by its own means that
    /// the lease is gone (session expired, connection broke, revoked) cancels
    /// it; it may keep a clone for as long as the lease lives.
    pub lost: &'a CancellationToken,
}

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

/// What a backend can tell about a name's holder and waiters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The current holder, if the name is held.
    pub holder: Option<HolderInfo>,
    /// The number of waiters, where the backend can tell.
    pub waiters: Option<usize>,
}

/// The holder of a name, as far as the backend can tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's owner token or node, as the backend stores it.
    pub owner: Option<String>,
    /// The holder's fencing token.
    pub fence: Option<u64>,
    /// How long the lease lives without renewal.
    pub ttl_remaining: Option<Duration>,
}

impl HolderInfo {
    /// Holder information from its parts.
    pub fn new(owner: Option<String>, fence: Option<u64>, ttl_remaining: Option<Duration>) -> Self {
        HolderInfo {
            owner,
            fence,
            ttl_remaining,
        }
    }
}

impl LockInfo {
    /// Lock information from its parts.
    pub fn new(holder: Option<HolderInfo>, waiters: Option<usize>) -> Self {
        LockInfo { holder, waiters }
    }
}

/// A lock server, as the library sees it.
///
/// Implementations are object-safe so a [`Locker`](crate::Locker) holds an
/// `Arc<dyn Backend>`. A backend needs only map its server: every
/// backend-neutral rule (validation, reentrancy, renewal, lost signal) is
/// applied by the `Locker` before and after these calls.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// A short name for errors and logs, e.g. `"redis"`.
    fn name(&self) -> &'static str;

    /// What this backend can promise.
    fn capabilities(&self) -> Capabilities;

    /// Acquires `req.name` for `req.owner`, waiting until `req.deadline`.
    ///
    /// Returns `Ok(None)` when the name is still held at the deadline
    /// (at once for [`Deadline::Now`]).
    ///
    /// # Cancel safety
    ///
    /// Implementations must be cancel safe: when the returned future is
    /// dropped at any await point, nothing stays behind on the server (no
    /// lease, no queue entry, no open transaction) after at most one cleanup
    /// round trip, which may run in the background
    /// (see [`crate::cleanup`]).
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>>;

    /// What the server can tell about `name`, or `Ok(None)` when the backend
    /// cannot inspect.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let _ = name;
        Ok(None)
    }
}

/// The backend's handle on one granted lease.
///
/// `renew` may be called concurrently with `release` (the watchdog and the
/// guard's owner run independently); implementations must stay correct when
/// that happens, which owner-checked operations do by construction.
#[async_trait]
pub trait BackendLease: Send + Sync + fmt::Debug + 'static {
    /// Extends the lease to `ttl` from now, only if this owner still holds it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease.
    async fn renew(&self, ttl: Duration) -> Result<Renewal>;

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
    /// [`LockGuard::abandon`](crate::LockGuard::abandon).
    fn abandon(&self) {}
}
