//! A lease held on both backends of a migration.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::cleanup::CleanupOnDrop;
use crate::error::Result;
use crate::raw::sync::lock;
use crate::raw::{now, BackendLease, Released, Renewal};

/// The lost signals of a migrating lock: each half's and the guard's.
pub(super) struct LostSignals {
    pub(super) old: CancellationToken,
    pub(super) new: CancellationToken,
    pub(super) guard: CancellationToken,
}

/// Fires all three lost signals once any of them fires, then releases both
/// halves: the guard learns of a lost half, and the half still held is
/// freed at once for the next holder instead of at the end of its ttl.
/// Ends when `done` fires (the lock was released or abandoned).
pub(super) fn relay_lost(lost: LostSignals, halves: Arc<Halves>, done: CancellationToken) {
    let relay = async move {
        tokio::select! {
            biased;
            () = done.cancelled() => return,
            () = lost.old.cancelled() => {}
            () = lost.new.cancelled() => {}
            () = lost.guard.cancelled() => {}
        }
        lost.guard.cancel();
        lost.old.cancel();
        lost.new.cancel();
        crate::cleanup::spawn_cleanup("release the halves of a lost migrating lock", async move {
            // Owner-checked on the server: a half already gone is left alone.
            let _ = halves.release().await;
        });
    };
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(relay);
    }
}

/// Keeps the old half renewed while the new one is awaited, as the guard's
/// watchdog will once both are held; returns once the old half is lost (or
/// its validity passed without a renewal). `valid` is the old half's
/// validity deadline, moved on by each renewal.
pub(super) async fn keep_alive(
    lease: &dyn BackendLease,
    ttl: Duration,
    lost: &CancellationToken,
    valid: &Mutex<Instant>,
) {
    let mut next = now() + ttl / 3;
    loop {
        let until = *lock(valid);
        tokio::select! {
            () = lost.cancelled() => return,
            () = tokio::time::sleep_until(next.min(until).into()) => {}
        }
        if now() >= until {
            return;
        }
        let renewed = tokio::time::timeout_at(until.into(), lease.renew(ttl)).await;
        match renewed {
            Ok(Ok(Renewal::Renewed { valid_until })) => {
                *lock(valid) = valid_until;
                next = now() + ttl / 3;
            }
            Ok(Err(e)) if e.kind() != crate::error::ErrorKind::Lost => {
                next = now() + (ttl / 30).max(Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

/// Releases a half, when a migrating acquire is dropped or fails after it.
pub(super) fn undo_half(lease: &Arc<dyn BackendLease>) -> CleanupOnDrop {
    let lease = lease.clone();
    CleanupOnDrop::new("release a half of a migrating lock", async move {
        let _ = lease.release().await;
    })
}

/// The two leases of a migrating lock. Their renewals and releases take
/// turns, so that a release never runs beside a renewal (which could take
/// a lease back on the server after it was released).
#[derive(Debug)]
pub(super) struct Halves {
    pub(super) old: Arc<dyn BackendLease>,
    pub(super) new: Arc<dyn BackendLease>,
    pub(super) turn: tokio::sync::Mutex<()>,
}

impl Halves {
    /// Releases the new half, then the old one (the reverse of
    /// acquisition), trying both whatever the first one answers.
    async fn release(&self) -> Result<Released> {
        let _turn = self.turn.lock().await;
        let new = self.new.release().await;
        let old = self.old.release().await;
        match (new, old) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(Released::Released), Ok(Released::Released)) => Ok(Released::Released),
            _ => Ok(Released::NotHeld),
        }
    }
}

/// Both halves of a migrating lock.
pub(super) struct MigratingLease {
    pub(super) halves: Arc<Halves>,
    /// Ends the lost relay once the lease is released or abandoned.
    pub(super) done: CancellationToken,
}

impl fmt::Debug for MigratingLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigratingLease")
            .field("old", &self.halves.old)
            .field("new", &self.halves.new)
            .finish()
    }
}

impl Drop for MigratingLease {
    fn drop(&mut self) {
        self.done.cancel();
    }
}

#[async_trait]
impl BackendLease for MigratingLease {
    /// A ttl both halves can take.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        self.halves.old.check_ttl(ttl)?;
        self.halves.new.check_ttl(ttl)
    }

    /// Renews both at once: renewed only when both are, lost when either
    /// is.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended a lease.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let _turn = self.halves.turn.lock().await;
        let (a, b) = tokio::join!(self.halves.old.renew(ttl), self.halves.new.renew(ttl));
        match (a, b) {
            (Ok(Renewal::Lost), _) | (_, Ok(Renewal::Lost)) => Ok(Renewal::Lost),
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(Renewal::Renewed { valid_until: x }), Ok(Renewal::Renewed { valid_until: y })) => {
                Ok(Renewal::Renewed {
                    valid_until: x.min(y),
                })
            }
        }
    }

    /// Releases the new backend's half, then the old one's (the reverse of
    /// acquisition), trying both whatever the first one answers.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may have released one half; the other ends by its
    /// ttl, session or connection.
    async fn release(&self) -> Result<Released> {
        self.done.cancel();
        self.halves.release().await
    }

    fn abandon(&self) {
        self.done.cancel();
        self.halves.new.abandon();
        self.halves.old.abandon();
    }
}
