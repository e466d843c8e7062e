//! The guard of a held lock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::cleanup::spawn_cleanup;
use crate::error::{Error, ErrorKind, Result};
use crate::held::Held;
use crate::options::{MAX_TTL, MIN_TTL};
use crate::owner::Owner;

/// A held lock. Dropping it releases the lock in the background.
///
/// It gives the fencing token, tells whether the lease is still held, and
/// carries a lost signal that fires when the lease is gone or can no longer be
/// trusted. While it lives, a watchdog renews the lease at about ttl/3
/// (unless renewal was turned off).
///
/// Guards are `Send + Sync + 'static`: move them into the task doing the
/// guarded work.
///
/// ```
/// use lockcore::Locker;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockcore::Result<()> {
/// let locker = Locker::memory();
/// let guard = locker.lock("reports/daily").await?;
/// assert!(guard.is_held());
/// let fence = guard.fence().expect("the memory backend fences");
/// println!("writing with fencing token {fence}");
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    held: Arc<Held>,
    owner: Arc<Owner>,
    active: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.held.name)
            .field("backend", &self.held.backend)
            .field("fence", &self.held.fence)
            .field("held", &self.held.is_held())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(held: Arc<Held>, owner: Arc<Owner>) -> Self {
        LockGuard {
            held,
            owner,
            active: true,
        }
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.held.name
    }

    /// The fencing token: strictly larger for each successive holder of this
    /// name, or `None` when the backend has no safe token (see
    /// [`Capabilities::fencing`](crate::Capabilities::fencing)). Pass it to
    /// the guarded resource (see [`crate::fencing`]).
    pub fn fence(&self) -> Option<u64> {
        self.held.fence
    }

    /// Whether the lease is still held and trusted: not released, not lost,
    /// and within its validity deadline. Once false, it stays false.
    pub fn is_held(&self) -> bool {
        self.held.is_held()
    }

    /// Resolves when the lease is lost: renewal was refused, the session or
    /// connection ended, or the validity deadline passed without a successful
    /// renewal. Work guarded by the lock should stop when it fires.
    ///
    /// The future is `'static` and does not borrow the guard. It does not
    /// resolve on a normal release.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockcore::{Locker, LockOptions, Wait};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// let locker = Locker::memory();
    /// let opts = LockOptions::new().ttl(Duration::from_secs(1)).renew(false);
    /// let guard = locker.acquire("short", &opts).await?.expect("free");
    /// tokio::select! {
    ///     _ = guard.lost() => println!("lease ran out: stop writing"),
    ///     _ = tokio::time::sleep(Duration::from_secs(30)) => unreachable!(),
    /// }
    /// assert!(!guard.is_held());
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.held.lost.clone().cancelled_owned()
    }

    /// The lost signal as a cancellation token (a child token: cancelling it
    /// does not affect the lease).
    pub fn lost_token(&self) -> CancellationToken {
        self.held.lost.child_token()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<&'static str> {
        self.held.lost_reason()
    }

    /// The validity deadline on this process's monotonic clock, while held.
    pub fn valid_until(&self) -> Option<Instant> {
        self.held.is_held().then(|| self.held.valid_until())
    }

    /// The end of the lease's trusted validity as of `now`: `now` while
    /// held, else when it was lost (at the latest its validity deadline).
    /// What a history of leases records as a lease's end (see
    /// [`history`](crate::history)).
    pub fn validity_end(&self, now: Instant) -> Instant {
        if self.held.is_held() {
            return now;
        }
        let lost_at = self.held.lost_at().unwrap_or(now);
        now.min(lost_at).min(self.held.valid_until())
    }

    /// The lease's current ttl.
    pub fn ttl(&self) -> Duration {
        self.held.ttl()
    }

    /// How many holds the owner has on this lease (reentrancy).
    pub fn hold_count(&self) -> usize {
        self.held.holds.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Renews the lease now so that it lives `ttl` from now; the watchdog
    /// uses `ttl` from then on.
    ///
    /// Fails with [`ErrorKind::Lost`] when the lease is gone (and the lost
    /// signal fires), [`ErrorKind::InvalidConfig`] when `ttl` is out of range.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Lost`] when the lease is gone, [`ErrorKind::InvalidConfig`]
    /// for a ttl out of range or above what the backend can keep, and the
    /// backend's [`ErrorKind::Unavailable`] / [`ErrorKind::Indeterminate`]
    /// when the server could not be asked (the lease may still be valid).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call at most extended the lease.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(Error::invalid_config(
                self.held.backend,
                format!("ttl {ttl:?} is out of range: it must be from {MIN_TTL:?} to {MAX_TTL:?}"),
            )
            .with_name(self.held.name.clone()));
        }
        let renewed = self.held.renew_now(Some(ttl)).await;
        self.held.rescheduled();
        renewed
    }

    /// Releases this hold; the lease itself is released on the server when
    /// the owner's last hold goes (see reentrancy in [`Locker`](crate::Locker)).
    ///
    /// Returns [`ErrorKind::Lost`] when the lease had been lost: the caller
    /// learns that the guarded work may have overlapped another holder's.
    /// Owner-checked: a lease that expired and was taken by another owner is
    /// left alone.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Lost`] when the lease had been lost; the backend's
    /// [`ErrorKind::Unavailable`] / [`ErrorKind::Indeterminate`] when the
    /// server could not be asked (the lease then ends by its ttl, session or
    /// connection).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before it completes, the release goes on in
    /// the background, as on drop.
    pub async fn release(mut self) -> Result<()> {
        self.active = false;
        if !self.owner.drop_hold(&self.held) {
            return if self.held.is_held() {
                Ok(())
            } else {
                Err(self.held.lost_error("released a hold on a lost lease"))
            };
        }
        let held = self.held.clone();
        // If this future is dropped midway, finish the release in the background.
        let mut finish = ReleaseOnDrop(Some(held.clone()));
        let res = held.release_lease().await;
        finish.0 = None;
        res
    }

    /// Stops renewing and leaves the lease on the server to end by its ttl,
    /// session or connection, as if this process had died. Other holds on the
    /// same lease see it lost.
    pub fn abandon(mut self) {
        self.active = false;
        self.held.stop_watchdog();
        self.held.lease.abandon();
        self.held.mark_lost("the holder abandoned the lease");
        self.owner.drop_hold(&self.held);
    }
}

struct ReleaseOnDrop(Option<Arc<Held>>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.stop_watchdog();
            spawn_cleanup("release a dropped lock guard", async move {
                if let Err(e) = held.release_lease().await {
                    if e.kind() != ErrorKind::Lost {
                        tracing::warn!(error = %e, "background release failed; the lease ends by its ttl");
                    }
                }
            });
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.active && self.owner.drop_hold(&self.held) {
            drop(ReleaseOnDrop(Some(self.held.clone())));
        }
    }
}
