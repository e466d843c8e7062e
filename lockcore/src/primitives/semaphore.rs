//! A counting semaphore on any backend: at most `permits` holders of a name
//! at once, each permit a lease with the lock's watchdog, lost signal and
//! fencing token.
//!
//! **Layout.** A backend with a semaphore layout of its own
//! ([`Layout::Native`]) takes `S` itself as one of
//! its `permits` holders ([`Mode::Permit`]): on ZooKeeper that is Curator's
//! `InterProcessSemaphoreV2`, where a waiter queues once, in arrival order,
//! and a permit's token is above every permit's granted before it was
//! asked for (across slots, not only within one); on
//! MySQL, slot rows taken with `FOR UPDATE SKIP LOCKED`, one statement per
//! try, with one fencing counter for every permit. There
//! [`Permit::slot`] is `None`. A `migrate:` pair whose backends lay a semaphore
//! out differently has none: [`Semaphore::new`] refuses it.
//!
//! On the others, permit `i` (from 0) of semaphore `S` is the lock named
//! `S␟permit-<i>` (four digits, `S␟permit-0000`; `␟` is
//! [`PART_SEPARATOR`], U+001F, which no user
//! name contains, so a lock named `S/permit-0000` is another name), taken by an owner of its
//! own, on whichever backend the [`Locker`] talks to. So a permit has every
//! promise of that backend's lock: its lease kind, its fencing (a permit's
//! token is its slot lock's: it rises strictly across the holders of one
//! slot, not across slots), cancel safety, and the server check of who holds
//! it ([`Locker::inspect`] on the slot name).
//!
//! **Acquire** (built layout). One `try` on each slot, from a random one (so that clients
//! spread over the slots); if all are held and the options allow waiting,
//! one wait on every slot at once, and the first slot granted is the
//! permit: the other waits are dropped, which the lock's cancel safety turns
//! into nothing left on the server. A waiter therefore queues on each of the
//! `permits` slots (a cost that grows with N; the backend's fairness holds
//! per slot, not across the semaphore). On MySQL (`?semaphore=built`) each
//! of those waits holds a connection: a waiter on N permits uses N
//! connections.
//!
//! **Reentrancy.** None: every acquisition is a new owner, so one task (or
//! one [`Locker`]) can hold several permits of a semaphore, each counted.
//!
//! **Mismatched counts.** Clients that disagree on `permits` for one name
//! never hold more than the largest count together: in the built layout
//! they share the slots they have in common; in Curator's, each admits by
//! its own count. In the built layout a client that finds every one of its
//! slots held looks at the 8 slots past its count ([`Locker::inspect`],
//! once per acquisition, where the backend can inspect): one held means a
//! client counting more, and [`ErrorKind::InvalidConfig`] instead of a
//! refusal or a wait. A client counting more than the holders, or one
//! whose larger-count neighbours hold only slots within its count, is not
//! told. On ZooKeeper each permit's node holds its
//! client's count, and a client that finds the semaphore full by its own
//! count while a client counting otherwise holds gets
//! [`ErrorKind::InvalidConfig`] instead of a wait. On MySQL a client that
//! finds its own slots full while a slot beyond them is held (a client
//! counting more) gets the same error.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! use lockcore::{Locker, Semaphore};
//!
//! let locker = Locker::memory();
//! let sem = Semaphore::new(&locker, "crawlers", 2)?;
//! let a = sem.try_acquire().await?.expect("a permit is free");
//! let b = sem.try_acquire().await?.expect("a second one too");
//! assert!(sem.try_acquire().await?.is_none(), "no third while two are held");
//! a.release().await?;
//! let c = sem.try_acquire().await?.expect("free again");
//! println!("permit in slot {:?} with token {:?}", c.slot(), c.fence());
//! b.release().await?;
//! c.release().await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use rand::RngExt;
use tokio_util::sync::CancellationToken;

use crate::capabilities::Layout;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::name::{validate_compound_name, PART_SEPARATOR};
use crate::options::{LockOptions, Wait};
use crate::raw::Mode;

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1000;

/// How many slots past its count a full semaphore in the built layout
/// looks at for a client counting more.
const BEYOND: u32 = 8;

/// What a slot adds to the semaphore's name.
const LONGEST_SUFFIX: &str = "\u{1f}permit-0000";

/// A counting semaphore: at most `permits` [`Permit`]s of one name at once,
/// across every process using the same backend (see the [module
/// docs](self)).
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Locker,
    name: String,
    permits: u32,
    /// The backend's own layout ([`Layout::Native`]).
    native: bool,
    /// Whether a full semaphore in the built layout looks at the slots
    /// beyond its count (not for a read-write lock's reader slots, which
    /// its writers hold by name).
    check_counts: bool,
}

impl Semaphore {
    /// A semaphore of `permits` on `name`, through `locker`'s backend.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a count outside 1 to
    /// [`MAX_PERMITS`], or on a `migrate:` pair whose backends lay a
    /// semaphore out differently; [`ErrorKind::InvalidName`] for a name the
    /// lock would refuse, or too long to leave room for the slot suffix.
    pub fn new(locker: &Locker, name: &str, permits: u32) -> Result<Self> {
        let backend = locker.backend_name();
        validate_compound_name(backend, name, LONGEST_SUFFIX, "a semaphore")?;
        let native = match locker.capabilities().semaphore_layout {
            Layout::Built => false,
            Layout::Native => true,
            _ => {
                return Err(Error::invalid_config(
                    backend,
                    "the two backends of this migration lay a semaphore out differently (one builds it from locks, the other has its own layout), so a client of both could not exclude the plain clients of either: lay it out from locks on every client of the name (ZooKeeper's URL option semaphore=built, kept for good), or stop the semaphore's users while the migration runs",
                )
                .with_name(name))
            }
        };
        let mut sem = Self::built(locker, name, permits)?;
        sem.native = native;
        sem.check_counts = true;
        Ok(sem)
    }

    /// A semaphore in the layout built from locks, whatever the backend's
    /// own: a read-write lock's reader slots, which its writers take by
    /// name. `name` was checked by the caller (it may be a part's).
    pub(crate) fn built(locker: &Locker, name: &str, permits: u32) -> Result<Self> {
        let backend = locker.backend_name();
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(Error::invalid_config(
                backend,
                format!("a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"),
            ));
        }
        Ok(Semaphore {
            locker: locker.clone(),
            name: name.to_owned(),
            permits,
            native: false,
            check_counts: false,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lock name of slot `i` in the built layout: what
    /// [`Locker::inspect`] asks about (a native layout has no slots).
    pub fn slot_name(&self, i: u32) -> String {
        format!("{}{PART_SEPARATOR}permit-{i:04}", self.name)
    }

    /// One attempt: a permit, or `None` when all are held.
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`]: a dropped attempt leaves no
    /// permit held or queued.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.acquire(&self.locker.defaults().wait(Wait::Try)).await
    }

    /// Waits up to `wait` for a permit.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when none came free in time; otherwise as
    /// [`Locker::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Permit> {
        let opts = self.locker.defaults().wait(Wait::For(wait));
        match self.acquire(&opts).await? {
            Some(p) => Ok(p),
            None => Err(Error::new(
                ErrorKind::Timeout,
                self.locker.backend_name(),
                format!("no permit of {} came free within {wait:?}", self.permits),
            )
            .or_name(&self.name)),
        }
    }

    /// A permit with `opts` (ttl, renewal, how long to wait): `None` only
    /// for [`Wait::Try`] when all are held.
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`]; a wait that ends with no permit is
    /// [`ErrorKind::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each attempt (on a slot in the built layout, on the
    /// name in a native one) is a [`Locker::acquire`], and a dropped one
    /// leaves nothing held or queued on the server after at most one
    /// cleanup round trip. Slots granted beside the one returned are
    /// released at once.
    pub async fn acquire(&self, opts: &LockOptions) -> Result<Option<Permit>> {
        opts.validate(self.locker.backend_name())?;
        if self.native {
            let mode = Mode::Permit {
                permits: self.permits,
            };
            let guard = self
                .locker
                .acquire_with(&self.name, opts, None, mode)
                .await?;
            return Ok(guard.map(|guard| Permit { guard, slot: None }));
        }
        let began = Instant::now();
        let try_opts = opts.wait(Wait::Try);
        let start = start_slot(self.permits);
        for k in 0..self.permits {
            let i = (start + k) % self.permits;
            if let Some(guard) = self
                .locker
                .acquire_with(
                    &self.slot_name(i),
                    &try_opts,
                    None,
                    crate::raw::Mode::Exclusive,
                )
                .await?
            {
                return Ok(Some(Permit {
                    guard,
                    slot: Some(i),
                }));
            }
        }
        self.check_beyond().await?;
        if opts.get_wait() == Wait::Try {
            return Ok(None);
        }
        // The tries counted against the wait.
        let wait_opts = opts.left_since(began);
        self.wait_any(&wait_opts).await
    }

    /// With every slot held (built layout): is one of the [`BEYOND`] slots
    /// past this count held too, by a client counting more? Then the counts
    /// disagree: [`ErrorKind::InvalidConfig`]. One [`Locker::inspect`] per
    /// slot, at once, where the backend can inspect; a slot it cannot look
    /// at counts as free.
    async fn check_beyond(&self) -> Result<()> {
        if !self.check_counts || !self.locker.capabilities().inspect {
            return Ok(());
        }
        let top = self.permits.saturating_add(BEYOND).min(MAX_PERMITS);
        let looks = (self.permits..top).map(|i| {
            let (locker, name) = (self.locker.clone(), self.slot_name(i));
            async move { locker.inspect(&name).await }
        });
        let held = futures_util::future::join_all(looks)
            .await
            .into_iter()
            .position(|info| matches!(info, Ok(Some(info)) if info.holder.is_some()));
        match held {
            Some(k) => Err(Error::invalid_config(
                self.locker.backend_name(),
                format!(
                    "this semaphore counts {} permits, but its slot {} is held, by a client counting more: every client of a semaphore must count the same",
                    self.permits,
                    self.permits as usize + k
                ),
            )
            .with_name(&self.name)),
            None => Ok(()),
        }
    }

    /// One wait on every slot at once; the first granted wins.
    async fn wait_any(&self, opts: &LockOptions) -> Result<Option<Permit>> {
        let mut waits: FuturesUnordered<_> = (0..self.permits)
            .map(|i| {
                let (locker, name) = (self.locker.clone(), self.slot_name(i));
                let opts = *opts;
                async move {
                    (
                        i,
                        locker
                            .acquire_with(&name, &opts, None, crate::raw::Mode::Exclusive)
                            .await,
                    )
                }
            })
            .collect();
        let mut timed_out = None;
        while let Some((i, res)) = waits.next().await {
            match res {
                Ok(Some(guard)) => {
                    // Slots granted in the same turn are given back; the
                    // rest are dropped, which leaves nothing queued.
                    drop(waits);
                    return Ok(Some(Permit {
                        guard,
                        slot: Some(i),
                    }));
                }
                Ok(None) => {}
                Err(e) if e.kind() == ErrorKind::Timeout => timed_out = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(timed_out.map(|e| e.or_name(&self.name)).unwrap_or_else(|| {
            Error::new(
                ErrorKind::Timeout,
                self.locker.backend_name(),
                format!("no permit of {} came free in time", self.permits),
            )
            .or_name(&self.name)
        }))
    }
}

/// A random first slot, so that clients spread over the slots.
fn start_slot(permits: u32) -> u32 {
    rand::rng().random_range(0..permits.max(1))
}

/// One held permit: a lease on the semaphore (on one of its slots in the
/// built layout), with the lock guard's promises (renewal, lost signal,
/// fencing token, release on drop).
#[derive(Debug)]
#[must_use = "the permit is released as soon as it is dropped"]
pub struct Permit {
    guard: LockGuard,
    slot: Option<u32>,
}

impl Permit {
    /// The slot this permit holds (from 0) in the built layout; `None` in
    /// a native one.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// The permit's fencing token, `None` where the backend has none. In
    /// the built layout it is its slot lock's, strictly rising across the
    /// holders of that slot (not across slots); in a native one it is
    /// above the token of every permit of the semaphore granted before this
    /// one was asked for (two permits granted at the same moment may come
    /// back in either order).
    pub fn fence(&self) -> Option<u64> {
        self.guard.fence()
    }

    /// Whether the permit is still held (see [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the permit's lease is lost (see [`LockGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// The lost signal as a token (see [`LockGuard::lost_token`]).
    pub fn lost_token(&self) -> CancellationToken {
        self.guard.lost_token()
    }

    /// The permit's lock guard.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The permit's lock guard, to hold the permit as a lock.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Gives the permit back (see [`LockGuard::release`]).
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::release`]: a dropped release still releases in the
    /// background.
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}
