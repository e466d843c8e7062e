//! The guard of a held lock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::cleanup::spawn_cleanup;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{MAX_TTL, MIN_TTL};
use crate::raw::held::Held;

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
/// Every acquisition is its own owner: a second `lock` of the name, through
/// the same [`Locker`](crate::locker::Locker) or another, waits for this guard's
/// release. A holder that needs another hold on its own lease (a recursive
/// call, say) proves it holds with [`reenter`](LockGuard::reenter).
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
    pub(crate) fn new(held: Arc<Held>) -> Self {
        LockGuard { held, active: true }
    }

    /// Takes another hold on this guard's lease: explicit reentrancy. The
    /// new guard has the same lease and fencing token, at once and without
    /// asking the server; the lease is released on the server when the last
    /// of its holds is released or dropped, in any order.
    ///
    /// An acquisition through a [`Locker`](crate::locker::Locker) never re-enters:
    /// it is a new owner, whatever handle it went through.
    ///
    /// ```
    /// use lockcore::Locker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// let locker = Locker::memory();
    /// let outer = locker.lock("ledger").await?;
    /// let inner = outer.reenter()?; // the same lease, the same token
    /// assert_eq!(inner.fence(), outer.fence());
    /// assert_eq!(outer.hold_count(), 2);
    /// // A new acquisition is another owner, even through the same handle.
    /// assert!(locker.try_lock("ledger").await?.is_none());
    /// inner.release().await?; // `outer` still holds the lease
    /// assert!(locker.try_lock("ledger").await?.is_none());
    /// outer.release().await?; // the last hold: released on the server
    /// assert!(locker.try_lock("ledger").await?.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Lost`] when the lease is no longer held.
    pub fn reenter(&self) -> Result<LockGuard> {
        if !self.held.is_held() {
            return Err(self.held.lost_error("cannot re-enter a lost lease"));
        }
        // This guard's own hold keeps the count above zero meanwhile.
        self.held
            .holds
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(LockGuard::new(self.held.clone()))
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.held.name
    }

    /// The fencing token: strictly larger for each successive holder of this
    /// name, or `None` when the backend has no safe token (see
    /// [`Capabilities::fencing`](crate::capabilities::Capabilities::fencing)). Pass it to
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
        self.held.lost_or_lapsed()
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
    /// [`history`](crate::testing::history)).
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

    /// How many holds there are on this lease: 1, plus one for each
    /// [`reenter`](LockGuard::reenter) not yet released or dropped.
    pub fn hold_count(&self) -> usize {
        self.held.holds.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Renews now with the current ttl (the acquisition's top-up of a
    /// grant with a lock-delay).
    pub(crate) async fn extend_now(&self) -> Result<()> {
        self.held.renew_now(None).await.map(drop)
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
            .with_name(self.held.name.clone())
            .or_operation("extend"));
        }
        let renewed = self.held.renew_now(Some(ttl)).await;
        self.held.rescheduled();
        renewed.map(drop).map_err(|e| e.or_operation("extend"))
    }

    /// Releases this hold; the lease itself is released on the server when
    /// its last hold goes (see [`reenter`](LockGuard::reenter)).
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
        if !self.held.drop_hold() {
            return if self.held.is_held() {
                Ok(())
            } else {
                Err(self
                    .held
                    .lost_error("released a hold on a lost lease")
                    .or_operation("release"))
            };
        }
        let held = self.held.clone();
        // If this future is dropped midway, finish the release in the background.
        let mut finish = ReleaseOnDrop(Some(held.clone()));
        let res = held.release_lease().await;
        finish.0 = None;
        res.map_err(|e| e.or_operation("release"))
    }

    /// Stops renewing and leaves the lease on the server to end by its ttl,
    /// session or connection, as if this process had died. Other holds on the
    /// same lease see it lost.
    pub fn abandon(mut self) {
        self.active = false;
        self.held
            .abandoned
            .store(true, std::sync::atomic::Ordering::Release);
        self.held.stop_watchdog();
        self.held.lease.abandon();
        self.held.mark_lost("the holder abandoned the lease");
        self.held.drop_hold();
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
        if self.active && self.held.drop_hold() {
            drop(ReleaseOnDrop(Some(self.held.clone())));
        }
    }
}
