//! The user's handle: acquire locks on any backend.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::capabilities::{Capabilities, Layout};
use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::info::LockInfo;
use crate::memory::MemoryBackend;
use crate::name::validate_name;
use crate::observe::{self, Labels};
use crate::options::{LockOptions, Wait};
use crate::raw::held::Held;
use crate::raw::watchdog::Watchdog;
use crate::raw::{AcquireRequest, Backend, Deadline, Grant, Mode, OwnerToken};

/// How long past its wait deadline a backend's acquire may run before it is
/// dropped (and cleans up after itself). A backend gives up by the deadline
/// itself (`Ok(None)`); one still busy this much later is stuck on a server
/// that does not answer, which is [`ErrorKind::Unavailable`], not a name
/// that is held.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// A handle to a lock backend, cheap to clone.
///
/// **Owners.** Every acquisition is its own owner, whatever handle it went
/// through: two `lock` calls through one `Locker` value (from one task or
/// many, through `&`, an `Arc`, a `static` or a clone) exclude each other as
/// two processes do. Share one `Locker` however suits the application. A
/// clone shares the backend connection.
///
/// **Runtimes.** A handle may serve several tokio runtimes, one after
/// another or side by side (a `static` shared by `#[tokio::test]`s, each
/// on its own runtime). Its leases are renewed by one task, on the runtime
/// of the first acquire. When that runtime ends, the task starts again on
/// the runtime of the latest acquire made from another one, else on the
/// runtime of the next acquire; a lease that nothing renews meanwhile
/// raises its [`lost`](crate::LockGuard::lost) signal at its validity
/// deadline (in a `lost()` being awaited, or at the next
/// [`is_held`](crate::LockGuard::is_held)). A connection made on an ended
/// runtime may fail its requests; leases renewed through it are then lost
/// at their deadline.
///
/// **Reentrancy is explicit**: a holder proves it holds by its guard, and
/// [`LockGuard::reenter`] takes another hold on the same lease (same
/// fencing token); the lease is released when its last hold goes.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lockcore::{Locker, LockOptions, Wait};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockcore::Result<()> {
/// let locker = Arc::new(Locker::memory());
///
/// let held = locker.lock("invoices").await?;
/// // Another acquisition, even through the same handle, is another owner.
/// assert!(locker.try_lock("invoices").await?.is_none()); // contention is Ok(None)
///
/// let again = held.reenter()?; // explicit reentrancy: the same lease
/// assert_eq!(again.hold_count(), 2);
/// assert_eq!(again.fence(), held.fence());
/// drop(again);
/// held.release().await?;
///
/// let opts = LockOptions::new().wait(Wait::For(Duration::from_millis(100)));
/// let g = locker.acquire("invoices", &opts).await?.expect("free again");
/// # drop(g);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    backend: Arc<dyn Backend>,
    defaults: LockOptions,
    watchdog: Arc<Watchdog>,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.backend)
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

impl Locker {
    /// A handle over `backend`, with default options ([`LockOptions::new`]).
    pub fn new(backend: impl Backend) -> Self {
        Locker::from_arc(Arc::new(backend))
    }

    /// A handle over a shared backend.
    pub fn from_arc(backend: Arc<dyn Backend>) -> Self {
        Locker {
            backend,
            defaults: LockOptions::new(),
            watchdog: Arc::default(),
        }
    }

    /// A handle over a new, private in-memory backend (locks between the
    /// tasks of this process that share it through clones).
    pub fn memory() -> Self {
        Locker::new(MemoryBackend::new())
    }

    /// Sets the options used by [`lock`](Locker::lock),
    /// [`try_lock`](Locker::try_lock) and [`lock_timeout`](Locker::lock_timeout)
    /// (their wait is their own).
    #[must_use]
    pub fn with_defaults(mut self, defaults: LockOptions) -> Self {
        self.defaults = defaults;
        self
    }

    /// The default options.
    pub fn defaults(&self) -> &LockOptions {
        &self.defaults
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The backend as its own type, if it is a `T`: the way back from a
    /// `Locker` to a backend's own methods (its counters, its settings), for
    /// a backend's tests and tools.
    ///
    /// ```
    /// use lockcore::{memory::MemoryBackend, Locker};
    ///
    /// let locker = Locker::memory();
    /// assert!(locker.backend_as::<MemoryBackend>().is_some());
    /// ```
    pub fn backend_as<T: Backend>(&self) -> Option<&T> {
        let any: &dyn std::any::Any = &*self.backend;
        any.downcast_ref::<T>()
    }

    /// The backend's short name.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// What the backend can promise.
    pub fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    /// Waits until `name` is acquired (default ttl and renewal).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Locker::acquire) with [`Wait::Forever`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves nothing held or queued on the
    /// server after at most one cleanup round trip.
    pub async fn lock(&self, name: &str) -> Result<LockGuard> {
        let opts = self.defaults.wait(Wait::Forever);
        self.acquire(name, &opts).await?.ok_or_else(|| {
            Error::backend_error(
                self.backend.name(),
                "the backend gave up waiting forever without an error",
            )
            .with_name(name)
        })
    }

    /// One attempt: the guard, or `Ok(None)` when `name` is held.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Locker::acquire) with [`Wait::Try`] (contention is
    /// `Ok(None)`, not an error).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Locker::lock).
    pub async fn try_lock(&self, name: &str) -> Result<Option<LockGuard>> {
        self.acquire(name, &self.defaults.wait(Wait::Try)).await
    }

    /// Waits up to `wait` for `name`, then fails with [`ErrorKind::Timeout`]
    /// carrying the holder where the backend tells ([`Error::holder`],
    /// asked within [`HOLDER_LOOKUP`](crate::HOLDER_LOOKUP) more).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when the name is still held after `wait`; otherwise
    /// as [`acquire`](Locker::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Locker::lock).
    pub async fn lock_timeout(&self, name: &str, wait: Duration) -> Result<LockGuard> {
        let opts = self.defaults.wait(Wait::For(wait));
        self.acquire(name, &opts).await?.ok_or_else(|| {
            Error::new(ErrorKind::Timeout, self.backend.name(), "no lease").with_name(name)
        })
    }

    /// Acquires `name` with `opts`.
    ///
    /// - [`Wait::Try`]: `Ok(None)` when the name is held.
    /// - [`Wait::For`]: [`ErrorKind::Timeout`] when still held at the deadline,
    ///   with its holder ([`Error::holder`]) where the backend tells.
    /// - [`Wait::Forever`]: waits until acquired or an error.
    ///
    /// Invalid names fail with [`ErrorKind::InvalidName`] and out-of-range
    /// options with [`ErrorKind::InvalidConfig`], before any server is asked.
    /// Every call is a new owner: it never re-enters a lease it or another
    /// task of this process holds (see [`LockGuard::reenter`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`], [`ErrorKind::InvalidConfig`] before any
    /// server is asked; [`ErrorKind::Timeout`] for [`Wait::For`] at its
    /// deadline; [`ErrorKind::Unavailable`] when the server does not answer
    /// (within its timeouts, or a grace after the wait's deadline);
    /// [`ErrorKind::Indeterminate`] when a request that may have applied was
    /// cut off (its effect is being undone); [`ErrorKind::Backend`] otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point leaves nothing held or
    /// queued on the server after at most one cleanup round trip.
    pub async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<LockGuard>> {
        let got = self.acquire_with(name, opts, None, Mode::Exclusive).await;
        self.told_who_holds(name, got).await
    }

    /// [`acquire`](Locker::acquire), with a value stored beside the lease
    /// where the backend keeps one (see [`AcquireRequest::value`]), in
    /// `mode` (see [`AcquireRequest::mode`]).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Locker::acquire).
    pub(crate) async fn acquire_with(
        &self,
        name: &str,
        opts: &LockOptions,
        value: Option<&str>,
        mode: Mode,
    ) -> Result<Option<LockGuard>> {
        self.acquire_as(name, opts, value, mode, OwnerToken::random())
            .await
    }

    /// [`acquire_with`](Locker::acquire_with) for `owner`, a token no
    /// other acquisition uses (a built read-write lock's writer derives
    /// its slots' owners from its gate's).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Locker::acquire).
    pub(crate) async fn acquire_as(
        &self,
        name: &str,
        opts: &LockOptions,
        value: Option<&str>,
        mode: Mode,
        owner: OwnerToken,
    ) -> Result<Option<LockGuard>> {
        let (backend, fence) = (self.backend.name(), LockGuard::fence);
        let acquiring = self.acquire_owned(name, opts, value, mode, owner);
        observe::acquisition(backend, name, (mode, owner), opts, acquiring, fence).await
    }

    /// [`acquire_as`](Locker::acquire_as), its errors not yet named.
    async fn acquire_owned(
        &self,
        name: &str,
        opts: &LockOptions,
        value: Option<&str>,
        mode: Mode,
        owner: OwnerToken,
    ) -> Result<Option<LockGuard>> {
        let backend = self.backend.name();
        validate_name(backend, name)?;
        opts.validate(backend)?;
        let caps = self.capabilities();
        let native = match mode {
            Mode::Read | Mode::Write => caps.rw_layout == Layout::Native,
            Mode::Permit { .. } => caps.semaphore_layout == Layout::Native,
            _ => true,
        };
        if !native {
            return Err(Error::invalid_config(
                backend,
                format!("this backend has no layout of its own for {mode:?}"),
            )
            .with_name(name));
        }
        self.check_delay(name, opts)?;
        let delay = opts.get_lock_delay();
        let wait = opts.get_wait();
        let deadline = match wait {
            Wait::Try => Deadline::Now,
            Wait::For(d) => Deadline::At(crate::raw::now() + d),
            Wait::Forever => Deadline::Never,
        };
        let timed_out = |d: Duration| {
            Error::new(
                ErrorKind::Timeout,
                backend,
                format!("still held by another owner after waiting {d:?}"),
            )
            .with_name(name)
        };
        let lost = CancellationToken::new();
        let req = AcquireRequest {
            name,
            owner,
            // The server keeps the lease for the delay beyond its validity.
            ttl: opts.get_ttl() + delay,
            lock_delay: delay,
            deadline,
            lost: &lost,
            value,
            mode,
            renew: opts.get_renew(),
        };
        let (at, call) = (Labels::of(backend, name, opts), crate::raw::now());
        let attempt = { self.backend.acquire(req) }
            .inspect(|_| observe::server_call(at, "acquire", call.elapsed()));
        let grant = match deadline.instant() {
            Some(at) => tokio::time::timeout_at((at + DEADLINE_GRACE).into(), attempt)
                .await
                .map_err(|_| {
                    Error::unavailable(
                        backend,
                        format!(
                            "the server did not answer by the wait's deadline and {DEADLINE_GRACE:?} more; the attempt was dropped and cleans up after itself"
                        ),
                    )
                    .with_name(name)
                })?,
            None => attempt.await,
        }
        .map_err(|e| e.or_name(name))?;
        let Some(grant) = grant else {
            return match wait {
                Wait::Try => Ok(None),
                Wait::For(d) => Err(timed_out(d)),
                Wait::Forever => Err(Error::backend_error(
                    backend,
                    "the backend gave up waiting forever without an error",
                )
                .with_name(name)),
            };
        };
        self.guard(name, grant, lost, opts).await.map(Some)
    }

    /// Refuses a lock-delay the backend cannot enforce.
    pub(crate) fn check_delay(&self, name: &str, opts: &LockOptions) -> Result<()> {
        let caps = self.capabilities();
        if !opts.get_lock_delay().is_zero()
            && caps.lock_delay == crate::capabilities::LockDelay::Unsupported
        {
            return Err(Error::invalid_config(
                self.backend.name(),
                format!(
                    "this backend cannot enforce a lock-delay ({:?} leases end on the server at once)",
                    caps.lease
                ),
            )
            .with_name(name));
        }
        Ok(())
    }

    /// The guard of `grant`, the lease of `name` acquired with `opts` and
    /// `lost` as its lost signal: watched from now on.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant with a lock-delay that arrived with little
    /// validity is renewed first; if this future is dropped then (or the
    /// renewal fails) the guard is dropped, which releases the lease.
    pub(crate) async fn guard(
        &self,
        name: &str,
        grant: Grant,
        lost: CancellationToken,
        opts: &LockOptions,
    ) -> Result<LockGuard> {
        let (guard, top_up) = self.watch(name, grant, lost, opts);
        if top_up {
            // Renewed now, so that the guard counts a full ttl and nothing
            // of the delay.
            guard.extend_now().await?;
        }
        Ok(guard)
    }

    /// [`guard`](Locker::guard) without the renewal: the guard, and
    /// whether it must be renewed before it is handed out.
    pub(crate) fn watch(
        &self,
        name: &str,
        grant: Grant,
        lost: CancellationToken,
        opts: &LockOptions,
    ) -> (LockGuard, bool) {
        let top_up = Held::needs_top_up(&grant, opts.get_ttl(), opts.get_lock_delay());
        let guard = LockGuard::new(Held::start(
            name.to_owned(),
            self.backend.name(),
            grant,
            lost,
            opts,
            self.watchdog.clone(),
        ));
        (guard, top_up)
    }

    /// What the backend can tell about `name`: holder and waiters, or
    /// `Ok(None)` when it cannot inspect.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`]; the backend's [`ErrorKind::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let backend = self.backend.name();
        validate_name(backend, name).map_err(|e| e.or_operation("inspect"))?;
        let (at, call) = (Labels::of(backend, name, &self.defaults), crate::raw::now());
        let info = self.backend.inspect(name).await;
        observe::server_call(at, "inspect", call.elapsed());
        info.map_err(|e| e.or_name(name).or_operation("inspect"))
    }
}
