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
use crate::error::{Error, ErrorKind, Result};

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

    /// Sleeps until the deadline: at once for [`Deadline::Now`], never for
    /// [`Deadline::Never`]. For the arm of a `select!` that ends a wait.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only sleeps.
    pub async fn sleep(&self) {
        match self {
            Deadline::Now => {}
            Deadline::At(t) => tokio::time::sleep_until((*t).into()).await,
            Deadline::Never => std::future::pending().await,
        }
    }
}

/// Now, by the clock leases are measured with: tokio's, which is the
/// system's monotonic clock except on a runtime whose clock is paused (a
/// test or a simulation), where it moves only as the runtime advances it.
/// `lockcore` reads time only through this; a backend may too.
///
/// ```
/// let t = lockcore::backend::now();
/// assert!(lockcore::backend::now() >= t);
/// ```
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
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

/// `ttl` in whole seconds, rounded up, at least 1: for servers whose leases
/// and timeouts count seconds (an etcd lease, a MySQL `wait_timeout`, a
/// ZooKeeper session), so the server keeps a lease at least `ttl`.
///
/// ```
/// use std::time::Duration;
///
/// assert_eq!(lockcore::backend::whole_seconds(Duration::from_millis(1500)), 2);
/// assert_eq!(lockcore::backend::whole_seconds(Duration::from_secs(3)), 3);
/// assert_eq!(lockcore::backend::whole_seconds(Duration::ZERO), 1);
/// ```
pub fn whole_seconds(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

/// Runs one request within `limit`: its own result, or, when the server
/// did not answer in time, [`ErrorKind::Indeterminate`] for a request that
/// may have changed server state (`mutating`) and
/// [`ErrorKind::Unavailable`] for one that only reads. `what` says what was
/// asked of which server ("creating the lock key on 127.0.0.1:2379").
///
/// ```
/// use std::time::Duration;
/// use lockcore::{backend::within, ErrorKind};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let slow = async {
///     tokio::time::sleep(Duration::from_secs(5)).await;
///     Ok::<_, lockcore::Error>(1)
/// };
/// let err = within("mine", "reading the lock", Duration::from_millis(10), false, slow)
///     .await
///     .unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Unavailable);
/// # }
/// ```
///
/// # Errors
///
/// The request's own error, or [`ErrorKind::Indeterminate`] /
/// [`ErrorKind::Unavailable`] when it did not answer within `limit`.
///
/// # Cancel safety
///
/// As the request it runs.
pub async fn within<T>(
    backend: &'static str,
    what: impl fmt::Display,
    limit: Duration,
    mutating: bool,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, request).await {
        Ok(r) => r,
        Err(_) => {
            let kind = if mutating {
                ErrorKind::Indeterminate
            } else {
                ErrorKind::Unavailable
            };
            Err(Error::new(
                kind,
                backend,
                format!("{what}: no answer within {limit:?}"),
            ))
        }
    }
}

/// What a backend crate needs, in one import:
/// `use lockcore::backend::prelude::*;`.
pub mod prelude {
    pub use async_trait::async_trait;
    pub use tokio_util::sync::CancellationToken;

    pub use super::{
        now, validity_deadline, whole_seconds, within, AcquireRequest, Backend, BackendLease,
        Deadline, Grant, HolderInfo, Listing, LockInfo, Mode, OwnerToken, Released, Renewal, Role,
    };
    pub use crate::capabilities::{Capabilities, Fencing, Layout, LeaseKind};
    pub use crate::cleanup::{spawn_cleanup, CleanupOnDrop};
    pub use crate::error::{Error, ErrorKind, Result};
}

/// How an acquisition takes its name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// Alone: a lock, or an election's candidate.
    #[default]
    Exclusive,
    /// As a reader of a read-write lock in the backend's own layout:
    /// beside other readers, not beside a writer or an exclusive holder,
    /// and behind any of those queued before it (writers first). Asked
    /// only of a backend whose [`rw_layout`](crate::Capabilities::rw_layout)
    /// is [`Layout::Native`](crate::Layout::Native).
    Read,
    /// As a writer of a read-write lock in the backend's own layout: alone,
    /// like [`Mode::Exclusive`], in the layout's writer form. Asked only of
    /// a backend whose [`rw_layout`](crate::Capabilities::rw_layout) is
    /// [`Layout::Native`](crate::Layout::Native).
    Write,
    /// As one of at most `permits` holders of a semaphore in the backend's
    /// own layout. Asked only of a backend whose
    /// [`semaphore_layout`](crate::Capabilities::semaphore_layout) is
    /// [`Layout::Native`](crate::Layout::Native).
    Permit {
        /// How many may hold at once.
        permits: u32,
    },
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
    /// A value stored beside the lease while it lives (a leader's value in
    /// an [`Election`](crate::Election)), read back by
    /// [`Backend::inspect`] as [`HolderInfo::value`]; `None` for a plain
    /// lock. A backend whose capabilities do not declare
    /// [`values`](Capabilities::values) ignores it.
    pub value: Option<&'a str>,
    /// How the name is taken: [`Mode::Exclusive`] but for a read-write
    /// lock or a semaphore on a backend with a
    /// [native layout](crate::Layout::Native) for it.
    pub mode: Mode,
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
    /// The holder's owner token: for a holder of this library, its
    /// [`OwnerToken`] (32 lowercase hex digits) on every backend, the same
    /// for the two halves of a migrating lock; for another client (Curator,
    /// kazoo, `etcdctl`), the node or key as the backend stores it.
    pub owner: Option<String>,
    /// The holder's fencing token.
    pub fence: Option<u64>,
    /// How long the lease lives without renewal.
    pub ttl_remaining: Option<Duration>,
    /// The value stored beside the lease ([`AcquireRequest::value`]), where
    /// the backend keeps one.
    pub value: Option<String>,
    /// When the holder was granted the name, by the server's clock, where
    /// the backend can tell (ZooKeeper: the node's creation time; Redis:
    /// the time in the fencing token; memory: the grant).
    pub since: Option<std::time::SystemTime>,
}

impl HolderInfo {
    /// Holder information from its parts.
    pub fn new(owner: Option<String>, fence: Option<u64>, ttl_remaining: Option<Duration>) -> Self {
        HolderInfo {
            owner,
            fence,
            ttl_remaining,
            value: None,
            since: None,
        }
    }

    /// Sets [`since`](HolderInfo::since).
    #[must_use]
    pub fn with_since(mut self, since: Option<std::time::SystemTime>) -> Self {
        self.since = since;
        self
    }

    /// Sets [`value`](HolderInfo::value).
    #[must_use]
    pub fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }
}

impl LockInfo {
    /// Lock information from its parts.
    pub fn new(holder: Option<HolderInfo>, waiters: Option<usize>) -> Self {
        LockInfo { holder, waiters }
    }
}

/// What [`Backend::list`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// The names held (at most the limit asked for).
    pub names: Vec<String>,
    /// Whether every name held under the prefix is in
    /// [`names`](Listing::names): false when the limit, or a bound of the
    /// backend's own, ended the listing first.
    pub complete: bool,
}

impl Listing {
    /// A listing from its parts.
    pub fn new(names: Vec<String>, complete: bool) -> Self {
        Listing { names, complete }
    }

    /// `names` (at most `limit` of them, the rest cut), complete unless
    /// there were more.
    pub fn bounded(mut names: Vec<String>, limit: usize) -> Self {
        let complete = names.len() <= limit;
        names.truncate(limit);
        Listing { names, complete }
    }
}

/// A holder's place in a semaphore or read-write lock in a backend's own
/// layout, for [`Backend::inspect_role`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// A permit of a semaphore ([`Mode::Permit`]).
    Permit,
    /// A reader of a read-write lock ([`Mode::Read`]).
    Reader,
    /// The writer of a read-write lock ([`Mode::Write`]).
    Writer,
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

    /// The names held on the server that start with `prefix`, at most
    /// `limit` of them, in no particular order, and whether that is all of
    /// them; `Ok(None)` when the backend cannot list.
    ///
    /// Names are as [`Backend::acquire`] took them: a lock's or an
    /// election's name, each part of a primitive in the built layout by its
    /// part name (`S␟permit-0003`, `L␟write`, see
    /// [`crate::name::is_part_name`]), and once the name of a semaphore or
    /// read-write lock in the backend's own layout ([`Layout::Native`](crate::Layout)).
    /// A name may be listed that is free by the time it is inspected (a
    /// release in between), or that only waiters queue on.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let _ = (prefix, limit);
        Ok(None)
    }

    /// Every holder of `name` in `role` of this backend's own layout of a
    /// semaphore or read-write lock ([`Layout::Native`](crate::Layout)),
    /// in their queue order where there is one, or `Ok(None)` where the
    /// backend has no such layout or cannot tell.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        let _ = (name, role);
        Ok(None)
    }
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
/// | the server could not be asked, or did not answer in time | `Err` with [`ErrorKind::Unavailable`] or [`ErrorKind::Indeterminate`]: the watchdog retries while the lease is valid | `Err` likewise: the lease then ends by its ttl, session or connection |
///
/// A backend whose lease is a connection ([`LeaseKind::Connection`](crate::LeaseKind))
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
    /// with `ttl` (for [`LockGuard::extend`](crate::LockGuard::extend)): a
    /// backend whose server keeps the ttl it granted (an etcd lease, a
    /// ZooKeeper session) refuses another with
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig), and the
    /// lease is left exactly as it was. The default accepts any ttl.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for a
    /// ttl this lease cannot be renewed with.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        let _ = ttl;
        Ok(())
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
    /// [`LockGuard::abandon`](crate::LockGuard::abandon).
    fn abandon(&self) {}
}
