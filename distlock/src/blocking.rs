//! A blocking [`Locker`] for synchronous programs (batch jobs, command-line
//! tools, build scripts), as `reqwest::blocking` is for HTTP. Behind the
//! `blocking` cargo feature.
//!
//! The handle runs one tokio runtime of its own, on one worker thread:
//! the guards' renewals run there while the caller works, and each method
//! blocks the calling thread until the async call it wraps returns. The
//! guards are the async crate's, with the same renewal, fencing token and
//! lost signal; dropping one releases it before `drop` returns (not in the
//! background: a program that exits right after leaves nothing held).
//!
//! ```
//! use std::time::Duration;
//!
//! # fn main() -> distlock::Result<()> {
//! let locker = distlock::blocking::connect("memory://")?;
//! let guard = locker.lock("nightly-report")?;
//! println!("fencing token {:?}", guard.fence());
//! assert!(locker.try_lock("nightly-report")?.is_none());
//! // ... the guarded work; renewals run meanwhile ...
//! assert!(!guard.wait_lost(Duration::from_millis(10)));
//! guard.release()?;
//! # Ok(()) }
//! ```
//!
//! A call that would block, from inside a tokio runtime (a task,
//! `block_on`, or `spawn_blocking`), fails with
//! [`ErrorKind::InvalidConfig`] saying so: there, use
//! [`connect`](crate::connect) and `.await`. What does not block works
//! there: the guard's getters, [`LockGuard::on_lost`],
//! [`LockGuard::abandon`], and [`LockGuard::wait_lost`] (which answers at
//! once). Dropping a guard or a handle there does not fail: the guard is
//! released in the background, as an async guard is, and the runtime
//! ends in a thread of its own once those releases are done.

use std::sync::Arc;
use std::time::Duration;

use lockcore::cleanup;
use tokio::runtime::{Handle, Runtime};

use crate::raw::prelude::CancellationToken;
use crate::{Error, ErrorKind, HolderInfo, LockInfo, LockOptions, Result};

const BLOCKING: &str = "blocking";

/// How long a handle's end waits for releases still running in the
/// background (of guards dropped inside an async context, or of
/// acquisitions cut off) before its runtime stops.
const FLUSH_AT_END: Duration = Duration::from_secs(5);

/// The runtime of a handle and its guards; stopped when the last of them
/// goes.
struct Rt(Option<Runtime>);

impl Rt {
    /// Runs `fut` to its end on this runtime, blocking the calling thread;
    /// refused inside a runtime (where blocking would stall its tasks, and
    /// tokio would panic).
    fn run<F: std::future::Future>(&self, what: &str, fut: F) -> Result<F::Output> {
        not_in_async(what)?;
        let Some(rt) = self.0.as_ref() else {
            return Err(Error::backend_error(BLOCKING, "the runtime has stopped"));
        };
        Ok(rt.block_on(fut))
    }

    /// The runtime's handle, for entering it.
    fn handle(&self) -> Option<&Handle> {
        self.0.as_ref().map(Runtime::handle)
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        let Some(rt) = self.0.take() else {
            return;
        };
        // Background releases still running (a guard dropped inside a
        // runtime just now, say) get their chance first.
        let end = move || {
            rt.block_on(cleanup::flush(FLUSH_AT_END));
            rt.shutdown_background();
        };
        match Handle::try_current() {
            Err(e) if !e.is_thread_local_destroyed() => end(),
            // Blocking is not allowed here (inside a runtime) or not
            // possible (the thread is ending): a thread of its own ends it.
            _ => {
                let ending = std::thread::Builder::new()
                    .name("distlock-blocking-end".into())
                    .spawn(end);
                if let Err(e) = ending {
                    tracing::warn!(error = %e, "cannot end the blocking runtime in a thread; background releases are dropped");
                }
            }
        }
    }
}

/// Fails when the calling thread is inside a tokio runtime (or ending,
/// its thread-locals gone: blocking there is not possible either).
fn not_in_async(what: &str) -> Result<()> {
    let inside = match Handle::try_current() {
        Ok(_) => true,
        Err(e) => e.is_thread_local_destroyed(),
    };
    if inside {
        return Err(Error::invalid_config(
            BLOCKING,
            format!(
                "distlock::blocking {what} called inside a tokio runtime, where it would block \
                 the runtime's thread: use distlock::connect and .await there"
            ),
        ));
    }
    Ok(())
}

/// Connects to the backend of `url` as [`connect`](crate::connect) does,
/// and returns a blocking handle on a runtime of its own.
///
/// # Errors
///
/// [`ErrorKind::InvalidConfig`] when called inside a tokio runtime, or for
/// a URL that [`connect`](crate::connect) refuses; the backend's errors
/// otherwise (for example [`ErrorKind::Unavailable`]).
pub fn connect(url: &str) -> Result<Locker> {
    not_in_async("connect")?;
    let rt = Rt(Some(runtime()?));
    let locker = rt.run("connect", crate::connect(url))??;
    Ok(Locker {
        inner: locker,
        rt: Arc::new(rt),
    })
}

/// A multi-threaded runtime of one worker: renewals and wake-ups run on it
/// while the caller's thread is busy or blocked.
fn runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("distlock-blocking")
        .enable_all()
        .build()
        .map_err(|e| Error::backend_error(BLOCKING, format!("cannot start a runtime: {e}")))
}

/// A blocking handle on one backend: the methods of the async
/// [`Locker`](crate::Locker), each blocking until it returns. Cheap to
/// clone; clones share the backend and the runtime.
#[derive(Clone)]
pub struct Locker {
    inner: crate::Locker,
    rt: Arc<Rt>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("blocking::Locker")
            .field("backend", &self.inner.backend_name())
            .finish()
    }
}

impl Locker {
    /// A blocking handle on an async [`Locker`](crate::Locker) made
    /// elsewhere (say [`Locker::memory`](crate::Locker::memory)), on a
    /// runtime of its own.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] when called inside a tokio runtime.
    pub fn new(locker: crate::Locker) -> Result<Self> {
        not_in_async("Locker::new")?;
        Ok(Locker {
            inner: locker,
            rt: Arc::new(Rt(Some(runtime()?))),
        })
    }

    /// The async handle this one wraps (its methods need a runtime of the
    /// caller's).
    pub fn as_async(&self) -> &crate::Locker {
        &self.inner
    }

    /// The backend's name, as in errors.
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    /// Waits for `name` as long as it takes, as
    /// [`Locker::lock`](crate::Locker::lock).
    ///
    /// # Errors
    ///
    /// As [`Locker::lock`](crate::Locker::lock), and
    /// [`ErrorKind::InvalidConfig`] inside a tokio runtime.
    pub fn lock(&self, name: &str) -> Result<LockGuard> {
        let g = self.rt.run("lock", self.inner.lock(name))??;
        Ok(self.guard(g))
    }

    /// One attempt: the guard, or `Ok(None)` when `name` is held.
    ///
    /// # Errors
    ///
    /// As [`Locker::try_lock`](crate::Locker::try_lock), and
    /// [`ErrorKind::InvalidConfig`] inside a tokio runtime.
    pub fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        let g = self.rt.run("try_lock", self.inner.try_lock(name))??;
        Ok(g.map(|g| self.guard(g)))
    }

    /// One attempt that, when `name` is held, says who holds it, as
    /// [`Locker::try_lock_or_holder`](crate::Locker::try_lock_or_holder).
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock).
    pub fn try_lock_or_holder(&self, name: &str) -> Result<Attempt> {
        let got = self
            .rt
            .run("try_lock_or_holder", self.inner.try_lock_or_holder(name))??;
        Ok(match got {
            crate::Attempt::Acquired(g) => Attempt::Acquired(self.guard(g)),
            crate::Attempt::Held(h) => Attempt::Held(h),
        })
    }

    /// Waits up to `wait` for `name`, then fails with [`ErrorKind::Timeout`].
    ///
    /// # Errors
    ///
    /// As [`Locker::lock_timeout`](crate::Locker::lock_timeout), and
    /// [`ErrorKind::InvalidConfig`] inside a tokio runtime.
    pub fn lock_timeout(&self, name: &str, wait: Duration) -> Result<LockGuard> {
        let g = self
            .rt
            .run("lock_timeout", self.inner.lock_timeout(name, wait))??;
        Ok(self.guard(g))
    }

    /// Acquires `name` with `opts`, as
    /// [`Locker::acquire`](crate::Locker::acquire).
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`](crate::Locker::acquire), and
    /// [`ErrorKind::InvalidConfig`] inside a tokio runtime.
    pub fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let g = self.rt.run("acquire", self.inner.acquire(name, opts))??;
        Ok(g.map(|g| self.guard(g)))
    }

    /// Who holds `name` now, as the server says, as
    /// [`Locker::inspect`](crate::Locker::inspect).
    ///
    /// # Errors
    ///
    /// As [`Locker::inspect`](crate::Locker::inspect), and
    /// [`ErrorKind::InvalidConfig`] inside a tokio runtime.
    pub fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.rt.run("inspect", self.inner.inspect(name))?
    }

    fn guard(&self, g: crate::LockGuard) -> LockGuard {
        LockGuard {
            name: g.name().to_owned(),
            inner: Some(g),
            rt: self.rt.clone(),
            done: CancellationToken::new(),
        }
    }
}

/// The outcome of [`Locker::try_lock_or_holder`].
#[derive(Debug)]
#[must_use = "an acquired lock is released as soon as the guard is dropped"]
pub enum Attempt {
    /// The name was free: it is held now.
    Acquired(LockGuard),
    /// Another owner held it: its holder where the backend tells (see
    /// [`crate::Attempt::Held`]).
    Held(Option<HolderInfo>),
}

/// A held lock of a blocking [`Locker`]. Renewals run on the handle's
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
