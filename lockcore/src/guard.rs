//! The guard of a held lock, and the lease state it shares with the watchdog.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backend::{BackendLease, Released, Renewal};
use crate::cleanup::spawn_cleanup;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{MAX_TTL, MIN_TTL};
use crate::watchdog::{Timer, Watchdog};

/// The leases one owner holds, by name, for reentrancy.
#[derive(Debug, Default)]
pub(crate) struct Owner {
    pub(crate) held: Mutex<HashMap<String, Arc<Held>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short critical sections cannot leave
    // the data half-written, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Owner {
    /// Takes another hold on a live lease of `name`, if this owner has one.
    pub(crate) fn reenter(&self, name: &str) -> Option<Arc<Held>> {
        let mut map = lock(&self.held);
        let held = map.get(name)?;
        if held.is_held() {
            held.holds.fetch_add(1, Ordering::Relaxed);
            Some(held.clone())
        } else {
            map.remove(name);
            None
        }
    }

    pub(crate) fn insert(&self, held: Arc<Held>) {
        lock(&self.held).insert(held.name.clone(), held);
    }

    /// Drops one hold; true when it was the last one (the lease must go).
    fn drop_hold(&self, held: &Arc<Held>) -> bool {
        let mut map = lock(&self.held);
        if held.holds.fetch_sub(1, Ordering::Relaxed) != 1 {
            return false;
        }
        if map.get(&held.name).is_some_and(|h| Arc::ptr_eq(h, held)) {
            map.remove(&held.name);
        }
        true
    }
}

/// One lease, shared by its guards (one per hold) and its watchdog.
pub(crate) struct Held {
    pub(crate) name: String,
    pub(crate) backend: &'static str,
    pub(crate) fence: Option<u64>,
    pub(crate) lease: Box<dyn BackendLease>,
    pub(crate) lost: CancellationToken,
    pub(crate) renew: bool,
    pub(crate) holds: AtomicUsize,
    pub(crate) timer: Timer,
    scheduler: Weak<Watchdog>,
    ttl: Mutex<Duration>,
    valid_until: Mutex<Instant>,
    released: AtomicBool,
    lost_reason: OnceLock<&'static str>,
    lost_at: OnceLock<Instant>,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("fence", &self.fence)
            .field("lost", &self.lost.is_cancelled())
            .field("released", &self.released.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Held {
    pub(crate) fn new(
        name: String,
        backend: &'static str,
        grant: crate::backend::Grant,
        lost: CancellationToken,
        ttl: Duration,
        renew: bool,
        scheduler: &Arc<Watchdog>,
    ) -> Self {
        Held {
            name,
            backend,
            fence: grant.fence,
            lease: grant.lease,
            lost,
            renew,
            holds: AtomicUsize::new(1),
            timer: Timer::default(),
            scheduler: Arc::downgrade(scheduler),
            ttl: Mutex::new(ttl),
            valid_until: Mutex::new(grant.valid_until),
            released: AtomicBool::new(false),
            lost_reason: OnceLock::new(),
            lost_at: OnceLock::new(),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        *lock(&self.ttl)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    pub(crate) fn set_valid_until(&self, t: Instant) {
        *lock(&self.valid_until) = t;
    }

    fn stop_watchdog(&self) {
        if let Some(wd) = self.scheduler.upgrade() {
            wd.forget(self);
        }
    }

    /// Raises the lost signal (once) with a reason.
    pub(crate) fn mark_lost(&self, reason: &'static str) {
        let _ = self.lost_at.set(Instant::now().min(self.valid_until()));
        if self.lost_reason.set(reason).is_ok() && !self.released.load(Ordering::Relaxed) {
            tracing::warn!(backend = self.backend, name = %self.name, fence = ?self.fence, reason, "lock lease lost");
        }
        self.lost.cancel();
    }

    pub(crate) fn is_held(&self) -> bool {
        if self.released.load(Ordering::Acquire) || self.lost.is_cancelled() {
            return false;
        }
        if Instant::now() >= self.valid_until() {
            self.mark_lost("the validity deadline passed without a successful renewal");
            return false;
        }
        true
    }

    fn lost_error(&self, what: &str) -> Error {
        let reason = self
            .lost_reason
            .get()
            .copied()
            .unwrap_or("the lease is no longer held");
        Error::new(ErrorKind::Lost, self.backend, format!("{what}: {reason}"))
            .with_name(self.name.clone())
    }

    /// Releases the lease on the server (the last hold is gone).
    async fn release_lease(&self) -> Result<()> {
        self.stop_watchdog();
        let was_lost = !self.is_held();
        self.released.store(true, Ordering::Release);
        match self.lease.release().await {
            Ok(Released::Released) if !was_lost => Ok(()),
            Ok(Released::Released) => Err(self.lost_error(
                "released, but the lease had been lost before (the server still had it)",
            )),
            Ok(Released::NotHeld) => {
                self.mark_lost("the server no longer held the lease at release");
                Err(self.lost_error("release found the lease gone"))
            }
            Err(e) => Err(e),
        }
    }

    /// Renews now with `ttl`, for [`LockGuard::extend`] and the watchdog.
    pub(crate) async fn renew_now(&self, ttl: Duration) -> Result<()> {
        if !self.is_held() {
            return Err(self.lost_error("cannot renew"));
        }
        let deadline = self.valid_until();
        match tokio::time::timeout_at(deadline.into(), self.lease.renew(ttl)).await {
            Ok(Ok(Renewal::Renewed { valid_until })) => {
                if !self.lost.is_cancelled() {
                    self.set_valid_until(valid_until);
                }
                Ok(())
            }
            Ok(Ok(Renewal::Lost)) => {
                self.mark_lost(
                    "renewal refused: the server no longer holds this lease for this owner",
                );
                Err(self.lost_error("renewal refused"))
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Lost => {
                self.mark_lost("the backend reported the lease lost during renewal");
                Err(e)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                self.mark_lost("the validity deadline passed while a renewal was in flight");
                Err(self.lost_error("renewal did not answer before the validity deadline"))
            }
        }
    }
}

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
        self.held.lost_reason.get().copied()
    }

    /// The validity deadline on this process's monotonic clock, while held.
    pub fn valid_until(&self) -> Option<Instant> {
        self.held.is_held().then(|| self.held.valid_until())
    }

    /// The end of the lease's trusted validity as of `now`: `now` while held,
    /// else when it was lost.
    pub(crate) fn validity_end(&self, now: Instant) -> Instant {
        if self.held.is_held() {
            return now;
        }
        let lost_at = self.held.lost_at.get().copied().unwrap_or(now);
        now.min(lost_at).min(self.held.valid_until())
    }

    /// The lease's current ttl.
    pub fn ttl(&self) -> Duration {
        self.held.ttl()
    }

    /// How many holds the owner has on this lease (reentrancy).
    pub fn hold_count(&self) -> usize {
        self.held.holds.load(Ordering::Relaxed)
    }

    /// Renews the lease now so that it lives `ttl` from now; the watchdog
    /// uses `ttl` from then on.
    ///
    /// Fails with [`ErrorKind::Lost`] when the lease is gone (and the lost
    /// signal fires), [`ErrorKind::InvalidConfig`] when `ttl` is out of range.
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
        self.held.renew_now(ttl).await?;
        *lock(&self.held.ttl) = ttl;
        if let Some(wd) = self.held.scheduler.upgrade() {
            let next = if self.held.renew {
                Instant::now() + ttl / 3
            } else {
                self.held.valid_until() + Duration::from_millis(1)
            };
            wd.schedule(&self.held, next);
        }
        Ok(())
    }

    /// Releases this hold; the lease itself is released on the server when
    /// the owner's last hold goes (see reentrancy in [`Locker`](crate::Locker)).
    ///
    /// Returns [`ErrorKind::Lost`] when the lease had been lost: the caller
    /// learns that the guarded work may have overlapped another holder's.
    /// Owner-checked: a lease that expired and was taken by another owner is
    /// left alone.
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
