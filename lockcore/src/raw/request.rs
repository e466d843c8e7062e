//! What one acquisition asks of a backend: its owner, deadline, mode.

use std::fmt;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

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
    /// only of a backend whose [`rw_layout`](crate::capabilities::Capabilities::rw_layout)
    /// is [`Layout::Native`](crate::capabilities::Layout::Native).
    Read,
    /// As a writer of a read-write lock in the backend's own layout: alone,
    /// like [`Mode::Exclusive`], in the layout's writer form. Asked only of
    /// a backend whose [`rw_layout`](crate::capabilities::Capabilities::rw_layout) is
    /// [`Layout::Native`](crate::capabilities::Layout::Native).
    Write,
    /// As one of at most `permits` holders of a semaphore in the backend's
    /// own layout. Asked only of a backend whose
    /// [`semaphore_layout`](crate::capabilities::Capabilities::semaphore_layout) is
    /// [`Layout::Native`](crate::capabilities::Layout::Native).
    Permit {
        /// How many may hold at once.
        permits: u32,
    },
}

/// One acquisition, as [`Locker`](crate::locker::Locker) hands it to the backend.
/// The name and options are already validated.
#[derive(Debug)]
pub struct AcquireRequest<'a> {
    /// The lock name.
    pub name: &'a str,
    /// The new lease's owner token.
    pub owner: OwnerToken,
    /// The lease's ttl on the server: the holder's ttl plus the
    /// lock-delay.
    pub ttl: Duration,
    /// The lock-delay ([`LockOptions::lock_delay`](crate::LockOptions::lock_delay)),
    /// already counted in `ttl`: zero without one. A backend that enforces
    /// a lock-delay by a [record](crate::LockDelay::Recorded) writes one
    /// only when it is set.
    pub lock_delay: Duration,
    /// How long to wait when the name is held.
    pub deadline: Deadline,
    /// The lease's lost signal. A backend that learns by its own means that
    /// the lease is gone (session expired, connection broke, revoked) cancels
    /// it; it may keep a clone for as long as the lease lives.
    pub lost: &'a CancellationToken,
    /// A value stored beside the lease while it lives (a leader's value in
    /// an [`Election`](crate::Election)), read back by
    /// [`Backend::inspect`](crate::raw::Backend::inspect) as [`HolderInfo::value`](crate::HolderInfo::value); `None` for a plain
    /// lock. A backend whose capabilities do not declare
    /// [`values`](crate::Capabilities::values) ignores it.
    pub value: Option<&'a str>,
    /// How the name is taken: [`Mode::Exclusive`] but for a read-write
    /// lock or a semaphore on a backend with a
    /// [native layout](crate::capabilities::Layout::Native) for it.
    pub mode: Mode,
    /// Whether the guard's watchdog renews the lease
    /// ([`LockOptions::renew`](crate::LockOptions::renew)). A lease renewed
    /// only by hand ([`LockGuard::extend`](crate::LockGuard::extend)) must
    /// end by its own ttl once its holder stops renewing it, so a backend
    /// may attach a renewed lock to a lease it shares with others (etcd's
    /// shared lease), never one that is not.
    pub renew: bool,
}
