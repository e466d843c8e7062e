//! The guard of a lock held through a blocking [`Locker`](super::Locker).

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use super::{not_in_async, Rt, BLOCKING};
use crate::raw::prelude::CancellationToken;
use crate::{Error, ErrorKind, Result};

/// A held lock of a blocking [`Locker`](super::Locker). Renewals run on the handle's
/// runtime while it lives; dropping it releases the lock before `drop`
/// returns (in the background when dropped inside a tokio runtime).
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    /// `None` once released or abandoned (which consume the guard).
    inner: Option<crate::LockGuard>,
    name: String,
    rt: Arc<Rt>,
    /// Cancelled when the guard goes: ends its lost callbacks' waits.
    done: CancellationToken,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("blocking::LockGuard")
            .field(&self.inner)
            .finish()
    }
}

impl LockGuard {
    /// The blocking guard of `g`, on `rt`.
    pub(super) fn new(g: crate::LockGuard, rt: Arc<Rt>) -> Self {
        LockGuard {
            name: g.name().to_owned(),
            inner: Some(g),
            rt,
            done: CancellationToken::new(),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token, where the backend gives one.
    pub fn fence(&self) -> Option<u64> {
        self.inner.as_ref().and_then(crate::LockGuard::fence)
    }

    /// Whether the lease is still held and trusted (this process's view;
    /// see [`LockGuard::is_held`](crate::LockGuard::is_held)).
    pub fn is_held(&self) -> bool {
        self.inner.as_ref().is_some_and(crate::LockGuard::is_held)
    }

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<&'static str> {
        self.inner.as_ref().and_then(crate::LockGuard::lost_reason)
    }

    /// The lease's current ttl.
    pub fn ttl(&self) -> Duration {
        self.inner
            .as_ref()
            .map_or(Duration::ZERO, crate::LockGuard::ttl)
    }

    /// Blocks until the lease is lost or `within` has passed; returns
    /// whether it was lost. A normal release is not a loss. Inside a tokio
    /// runtime it does not block: it answers as [`is_held`](Self::is_held)
    /// does now.
    pub fn wait_lost(&self, within: Duration) -> bool {
        let Some(lost) = self.inner.as_ref().map(crate::LockGuard::lost) else {
            return true;
        };
        // The timer is made inside the runtime, which drives it.
        let waiting = async move { tokio::time::timeout(within, lost).await };
        match self.rt.run("wait_lost", waiting) {
            Ok(waited) => waited.is_ok(),
            Err(_) => !self.is_held(),
        }
    }

    /// Calls `f` once, on a thread of the handle's runtime, if the lease
    /// is lost while this guard lives: not for a loss after a release, an
    /// abandon or a drop (a loss just before a release may still be told
    /// while the release runs). Work guarded by the lock should stop when
    /// it is called.
    pub fn on_lost<F: FnOnce() + Send + 'static>(&self, f: F) {
        let (Some(lost), Some(handle)) = (
            self.inner.as_ref().map(crate::LockGuard::lost),
            self.rt.handle(),
        ) else {
            return;
        };
        let done = self.done.clone();
        handle.spawn(async move {
            tokio::select! {
                biased;
                () = done.cancelled() => {}
                () = lost => {
                    let _ = tokio::task::spawn_blocking(f).await;
                }
            }
        });
    }

    /// Renews the lease now so that it lives `ttl` from now, as
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    ///
    /// As [`LockGuard::extend`](crate::LockGuard::extend), and
    /// [`ErrorKind::InvalidConfig`] inside a tokio runtime.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        match self.inner.as_ref() {
            Some(g) => self.rt.run("extend", g.extend(ttl))?,
            None => Err(
                Error::new(ErrorKind::Lost, BLOCKING, "the guard was released")
                    .with_name(self.name.clone()),
            ),
        }
    }

    /// Releases the lock on the server, as
    /// [`LockGuard::release`](crate::LockGuard::release).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Lost`] when the lease had been lost (the guarded work
    /// may have overlapped another holder's); the backend's errors when the
    /// server could not be asked. Inside a tokio runtime,
    /// [`ErrorKind::InvalidConfig`], and the lock is released in the
    /// background.
    pub fn release(mut self) -> Result<()> {
        self.done.cancel();
        let Some(g) = self.inner.take() else {
            return Ok(());
        };
        if let Err(e) = not_in_async("release") {
            self.drop_in_background(g);
            return Err(e);
        }
        self.rt.run("release", g.release())?
    }

    /// Stops renewing and leaves the lease to end by its ttl, session or
    /// connection, as [`LockGuard::abandon`](crate::LockGuard::abandon).
    pub fn abandon(mut self) {
        self.done.cancel();
        if let Some(g) = self.inner.take() {
            let ending = matches!(Handle::try_current(), Err(e) if e.is_thread_local_destroyed());
            let _in = self.rt.handle().filter(|_| !ending).map(Handle::enter);
            g.abandon();
        }
    }

    /// Drops `g` with the handle's runtime entered, so that its release
    /// runs there in the background (on a thread that is ending, where no
    /// runtime can be entered, the lease ends by its ttl).
    fn drop_in_background(&self, g: crate::LockGuard) {
        let ending = matches!(Handle::try_current(), Err(e) if e.is_thread_local_destroyed());
        let _in = self.rt.handle().filter(|_| !ending).map(Handle::enter);
        drop(g);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.done.cancel();
        let Some(g) = self.inner.take() else {
            return;
        };
        if not_in_async("drop").is_ok() {
            match self.rt.run("drop", g.release()) {
                Ok(Err(e)) if e.kind() != ErrorKind::Lost => {
                    tracing::warn!(error = %e, "release of a dropped guard failed; the lease ends by its ttl");
                }
                _ => {}
            }
        } else {
            self.drop_in_background(g);
        }
    }
}
