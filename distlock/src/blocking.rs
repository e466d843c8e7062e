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
//! [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) saying so: there, use
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

use crate::{Error, HolderInfo, LockInfo, LockOptions, Result};

mod guard;

pub use guard::LockGuard;

pub(crate) const BLOCKING: &str = "blocking";

/// How long a handle's end waits for releases still running in the
/// background (of guards dropped inside an async context, or of
/// acquisitions cut off) before its runtime stops.
const FLUSH_AT_END: Duration = Duration::from_secs(5);

/// The runtime of a handle and its guards; stopped when the last of them
/// goes.
pub(crate) struct Rt(Option<Runtime>);

impl Rt {
    /// Runs `fut` to its end on this runtime, blocking the calling thread;
    /// refused inside a runtime (where blocking would stall its tasks, and
    /// tokio would panic).
    pub(crate) fn run<F: std::future::Future>(&self, what: &str, fut: F) -> Result<F::Output> {
        not_in_async(what)?;
        let Some(rt) = self.0.as_ref() else {
            return Err(Error::backend_error(BLOCKING, "the runtime has stopped"));
        };
        Ok(rt.block_on(fut))
    }

    /// The runtime's handle, for entering it.
    pub(crate) fn handle(&self) -> Option<&Handle> {
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
pub(crate) fn not_in_async(what: &str) -> Result<()> {
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
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) when called inside a tokio runtime, or for
/// a URL that [`connect`](crate::connect) refuses; the backend's errors
/// otherwise (for example [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable)).
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
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) when called inside a tokio runtime.
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
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) inside a tokio runtime.
    pub fn lock(&self, name: &str) -> Result<LockGuard> {
        let g = self.rt.run("lock", self.inner.lock(name))??;
        Ok(self.guard(g))
    }

    /// One attempt: the guard, or `Ok(None)` when `name` is held.
    ///
    /// # Errors
    ///
    /// As [`Locker::try_lock`](crate::Locker::try_lock), and
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) inside a tokio runtime.
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

    /// Waits up to `wait` for `name`, then fails with [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// # Errors
    ///
    /// As [`Locker::lock_timeout`](crate::Locker::lock_timeout), and
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) inside a tokio runtime.
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
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) inside a tokio runtime.
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
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) inside a tokio runtime.
    pub fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.rt.run("inspect", self.inner.inspect(name))?
    }

    fn guard(&self, g: crate::LockGuard) -> LockGuard {
        LockGuard::new(g, self.rt.clone())
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
