//! Moving a fleet from one backend to another without a moment of double
//! ownership: a backend that holds each name on two backends at once.
//!
//! [`Migrating`] takes a name on the *old* backend first, then on the *new*
//! one (always in that order, so two migrating clients cannot deadlock),
//! renews both through the guard's one watchdog, releases both, and fires
//! the lost signal when either lease is lost. Its fencing token is the new
//! backend's, plus a [fence offset](Migrating::fence_offset). Its
//! [`Capabilities`] are the weaker of the two.
//!
//! ## The procedure
//!
//! 1. Every client locks through the old backend.
//! 2. Rolling restart to *migrating* (`migrate:OLD|NEW` in
//!    `distlock::connect`). While this runs, old-only and migrating clients
//!    exclude each other on the old backend: safe.
//! 3. Once no client uses the old backend alone, rolling restart to the new
//!    backend only. Migrating and new-only clients exclude each other on the
//!    new backend: safe.
//!
//! **Never** run an old-only client beside a new-only one: they share no
//! backend and can both hold a name (the test suite shows it). Before step
//! 3, check that phase 2 is complete: every client's configuration says
//! `migrate:`, and `distlock inspect NAME` on the old backend shows only
//! migrating holders (their owner tokens also appear on the new backend).
//!
//! ## Fencing across the change
//!
//! A resource that checks fencing tokens sees the token source change at
//! step 2: old-only holders carry the old backend's tokens, migrating and
//! new-only holders the new backend's. The new tokens must compare above
//! every old token, or the resource's gate is reset deliberately. Set the
//! offset above any token the old backend has issued or will issue during
//! the migration (for Redis, whose tokens are microseconds since 1970,
//! `1 << 52` lasts until 2112; for etcd or MySQL, above the current
//! revision or counter, with room), and keep the same offset on the
//! new-only clients of step 3 ([`OffsetFences`]). During step 2 an old-only
//! client's write that follows a migrating client's write is refused as
//! stale: safe, and one more reason to finish step 2 before writers resume.
//!
//! ```
//! use std::sync::Arc;
//! use lockcore::{Locker, memory::MemoryBackend, migrate::Migrating};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
//! let old_only = Locker::new(old.clone());
//! let migrating = Locker::new(Migrating::new(Arc::new(old), Arc::new(new)).fence_offset(1 << 40));
//!
//! let g = migrating.lock("jobs/nightly").await?;
//! assert!(g.fence().unwrap() > 1 << 40);
//! assert!(old_only.try_lock("jobs/nightly").await?.is_none()); // excluded on the old backend
//! g.release().await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    now, AcquireRequest, Backend, BackendLease, Grant, HolderInfo, Listing, LockInfo, Released,
    Renewal, Role,
};
use crate::capabilities::{Capabilities, Fencing, Layout, LeaseKind};
use crate::cleanup::CleanupOnDrop;
use crate::error::{Error, Result};
use crate::sync::lock;

/// The backend name of a [`Migrating`] pair in errors and logs.
pub const NAME: &str = "migrate";

/// A backend that holds every name on an old and a new backend at once
/// (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct Migrating {
    old: Arc<dyn Backend>,
    new: Arc<dyn Backend>,
    offset: u64,
}

impl Migrating {
    /// Locks on `old`, then on `new`; tokens are `new`'s (offset 0).
    pub fn new(old: Arc<dyn Backend>, new: Arc<dyn Backend>) -> Self {
        Migrating {
            old,
            new,
            offset: 0,
        }
    }

    /// Adds `offset` to every token of the new backend, so that they compare
    /// above the old backend's (see [Fencing across the
    /// change](self#fencing-across-the-change)).
    #[must_use]
    pub fn fence_offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// Whether the old and the new backend are one store given twice (two
    /// spellings of one server: an IP and a host name, a default written
    /// out), told by behaviour: a probe lock taken on the old backend is
    /// looked up on the new one. Where both can inspect, the new one must
    /// show the probe held by the probe's own owner token (another client's
    /// probe never counts); otherwise a `try` on the new one must find it
    /// held three times, on three names drawn at random. The probes are
    /// parts named `lockcore-migrate-probe␟permit-NNNN` (16 of them, so a
    /// store that keeps a row per name keeps at most 16), held for a moment
    /// with the default ttl.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use lockcore::{memory::MemoryBackend, migrate::Migrating};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// let one = MemoryBackend::new();
    /// assert!(Migrating::new(Arc::new(one.clone()), Arc::new(one.clone())).one_store().await?);
    /// assert!(!Migrating::new(Arc::new(one), Arc::new(MemoryBackend::new())).one_store().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// What either backend returns when it cannot be asked
    /// ([`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable), say).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a probe is a lock like any other, released in the
    /// background if the future is dropped.
    pub async fn one_store(&self) -> Result<bool> {
        let old = crate::Locker::from_arc(self.old.clone());
        let new = crate::Locker::from_arc(self.new.clone());
        let opts = crate::LockOptions::new()
            .renew(false)
            .wait(crate::Wait::Try);
        let identity = old.capabilities().inspect && new.capabilities().inspect;
        let mut seen_held = 0;
        for _ in 0..8 {
            let n = rand::random_range(0..16u32);
            let name = format!(
                "lockcore-migrate-probe{}permit-{n:04}",
                crate::name::PART_SEPARATOR
            );
            // Held by another client's probe: draw another.
            let Some(probe) = old.acquire(&name, &opts).await? else {
                continue;
            };
            let mine = if identity {
                holder_of(&old, &name).await?
            } else {
                None
            };
            let same = match mine {
                // By identity: our own probe, seen from the new backend.
                Some(mine) => Some(holder_of(&new, &name).await?.as_deref() == Some(&*mine)),
                // By occupancy: held there may be another client's probe.
                None => match new.acquire(&name, &opts).await? {
                    Some(g) => {
                        let _ = g.release().await;
                        Some(false)
                    }
                    None => None,
                },
            };
            let _ = probe.release().await;
            match same {
                Some(same) => return Ok(same),
                None => {
                    seen_held += 1;
                    if seen_held == 3 {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    /// [`one_store`](Migrating::one_store) as a check: `Ok` for two stores,
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for one
    /// store given twice, which would make every migrating client block
    /// each name against itself. A store that cannot be asked now (down,
    /// or an account that may not take locks) gives no verdict: a warning
    /// through `tracing`, and `Ok` (its locks report it when tried).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for
    /// one store, and nothing else.
    ///
    /// # Cancel safety
    ///
    /// As [`one_store`](Migrating::one_store).
    pub async fn verify_distinct(&self) -> Result<()> {
        match self.one_store().await {
            Ok(true) => Err(Error::invalid_config(
                NAME,
                "the old and the new backend are the same store: a lock taken on the old one shows on the new one",
            )),
            Ok(false) => Ok(()),
            Err(e) => {
                tracing::warn!(backend = NAME, error = %e, "could not tell whether the old and the new backend are one store: not checked");
                Ok(())
            }
        }
    }

    /// Who holds `name` on each backend, and whether it is one migrating
    /// owner (see [`Sides`]): the check before phase 3. Both backends must
    /// be able to inspect.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use lockcore::{Locker, memory::MemoryBackend, migrate::{Migrating, Sides}};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    /// let pair = Migrating::new(Arc::new(old.clone()), Arc::new(new));
    /// assert_eq!(pair.sides("jobs").await?, Sides::Free);
    /// let g = Locker::new(pair.clone()).lock("jobs").await?;
    /// assert_eq!(pair.sides("jobs").await?.verdict(), "migrating");
    /// g.release().await?;
    /// let g = Locker::new(old).lock("jobs").await?; // an old-only client
    /// assert_eq!(pair.sides("jobs").await?.verdict(), "old_only");
    /// # g.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName);
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) when a
    /// backend cannot inspect; what either backend returns when it cannot
    /// be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn sides(&self, name: &str) -> Result<Sides> {
        crate::validate_name(NAME, name)?;
        let cannot = || {
            Error::invalid_config(
                NAME,
                "a backend of this migration cannot inspect locks, so who holds a name cannot be compared",
            )
            .with_name(name)
        };
        let holder = |b: &Arc<dyn Backend>| {
            let b = b.clone();
            let name = name.to_owned();
            async move {
                match b.inspect(&name).await? {
                    Some(info) => Ok(info.holder.map(|h| h.owner)),
                    None => Err(cannot()),
                }
            }
        };
        // The new backend is read before and after the old one: a
        // hand-over between two reads would otherwise pair one holder's
        // new half with the next holder's old half.
        let mut last = (None, None);
        for _ in 0..5 {
            let before = holder(&self.new).await?;
            let old = holder(&self.old).await?;
            let after = holder(&self.new).await?;
            if before == after {
                return Ok(sides_of(old, after));
            }
            last = (old, after);
        }
        // The name changed hands through every read: no verdict to trust.
        Ok(Sides::Unknown {
            old: last.0.flatten(),
            new: last.1.flatten(),
        })
    }

    /// The old backend.
    pub fn old(&self) -> &Arc<dyn Backend> {
        &self.old
    }

    /// The new backend.
    pub fn new_backend(&self) -> &Arc<dyn Backend> {
        &self.new
    }
}

/// Who holds a name on the two backends of a migration: the check before
/// phase 3 (see the [procedure](self#the-procedure)), from
/// [`Migrating::sides`]. Owners are the holders' owner tokens as the
/// backends report them ([`HolderInfo::owner`](crate::HolderInfo::owner)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sides {
    /// Held on neither backend.
    Free,
    /// Held by one migrating owner on both (the same owner token on each).
    Migrating {
        /// The owner token.
        owner: String,
    },
    /// Held on the old backend only: an old-only client is still running
    /// (or a migrating one is between its two steps): not safe to start
    /// phase 3.
    OldOnly {
        /// The old backend's holder.
        owner: Option<String>,
    },
    /// Held on the new backend only: a new-only client (phase 3 has begun).
    NewOnly {
        /// The new backend's holder.
        owner: Option<String>,
    },
    /// Held on both by two owners of this library: an old-only client and
    /// a new-only one at once (which must never be), or a migrating client
    /// that holds the old half and waits for a new-only client on the new.
    Split {
        /// The old backend's holder.
        old: Option<String>,
        /// The new backend's holder.
        new: Option<String>,
    },
    /// Held on both, by owners that cannot be compared: another client's
    /// layout (Curator, `etcdctl`), or an election's candidate on etcd,
    /// whose key holds its value rather than its owner token; or a name
    /// that changed hands through every read.
    Unknown {
        /// The old backend's holder.
        old: Option<String>,
        /// The new backend's holder.
        new: Option<String>,
    },
}

impl Sides {
    /// A short name: `free`, `migrating`, `old_only`, `new_only`, `split`,
    /// `unknown`.
    pub fn verdict(&self) -> &'static str {
        match self {
            Sides::Free => "free",
            Sides::Migrating { .. } => "migrating",
            Sides::OldOnly { .. } => "old_only",
            Sides::NewOnly { .. } => "new_only",
            Sides::Split { .. } => "split",
            Sides::Unknown { .. } => "unknown",
        }
    }

    /// What the verdict means for phase 3, in a sentence.
    pub fn meaning(&self) -> &'static str {
        match self {
            Sides::Free => "free on both backends",
            Sides::Migrating { .. } => "held by one migrating owner on both backends",
            Sides::OldOnly { .. } => {
                "held on the old backend only: an old-only client is still running (or a migrating one is between its two steps); not safe to start phase 3"
            }
            Sides::NewOnly { .. } => "held on the new backend only: a new-only client (phase 3 has begun)",
            Sides::Split { .. } => {
                "held on both backends by different owners: an old-only and a new-only client at once (which must never be), or a migrating client waiting for a new-only one"
            }
            Sides::Unknown { .. } => {
                "held on both backends by owners that cannot be compared (another client's layout, or an election on etcd)"
            }
        }
    }
}

/// The verdict for the holders seen on the old and the new backend (each
/// `None` when free, `Some(None)` when held by an owner it cannot name).
fn sides_of(old: Option<Option<String>>, new: Option<Option<String>>) -> Sides {
    let token = |o: &Option<String>| o.as_deref().is_some_and(is_owner_token);
    match (old, new) {
        (None, None) => Sides::Free,
        (Some(o), None) => Sides::OldOnly { owner: o },
        (None, Some(n)) => Sides::NewOnly { owner: n },
        (Some(o), Some(n)) if token(&o) && token(&n) => {
            if o == n {
                Sides::Migrating {
                    owner: o.unwrap_or_default(),
                }
            } else {
                Sides::Split { old: o, new: n }
            }
        }
        (Some(o), Some(n)) => Sides::Unknown { old: o, new: n },
    }
}

/// Whether `s` is an owner token as this library's holders report it (32
/// lowercase hex digits).
fn is_owner_token(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The owner a backend reports holding `name`, if any.
async fn holder_of(l: &crate::Locker, name: &str) -> Result<Option<String>> {
    Ok(l.inspect(name)
        .await?
        .and_then(|i| i.holder)
        .and_then(|h| h.owner))
}

/// The weaker of two fencing promises.
fn weaker_fencing(a: Fencing, b: Fencing) -> Fencing {
    match (a, b) {
        (Fencing::None, _) | (_, Fencing::None) => Fencing::None,
        (Fencing::StrictWhileDataKept, _) | (_, Fencing::StrictWhileDataKept) => {
            Fencing::StrictWhileDataKept
        }
        _ => Fencing::Strict,
    }
}

/// The weaker of two lease kinds: a connection-kept lease ends with a
/// connection; a session outlives a broken connection for its timeout; a
/// ttl outlives both.
fn weaker_lease(a: LeaseKind, b: LeaseKind) -> LeaseKind {
    match (a, b) {
        (LeaseKind::Connection, _) | (_, LeaseKind::Connection) => LeaseKind::Connection,
        (LeaseKind::Session, _) | (_, LeaseKind::Session) => LeaseKind::Session,
        _ => LeaseKind::Ttl,
    }
}

fn offset_fence(fence: Option<u64>, offset: u64, fencing: Fencing) -> Result<Option<u64>> {
    if fencing == Fencing::None {
        return Ok(None);
    }
    match fence {
        None => Ok(None),
        Some(f) => f.checked_add(offset).map(Some).ok_or_else(|| {
            Error::invalid_config(
                NAME,
                format!("fence offset {offset} overflows the new backend's token {f}"),
            )
        }),
    }
}

/// The lost signals of a migrating lock: each half's and the guard's.
struct LostSignals {
    old: CancellationToken,
    new: CancellationToken,
    guard: CancellationToken,
}

/// Fires all three lost signals once any of them fires, then releases both
/// halves: the guard learns of a lost half, and the half still held is
/// freed at once for the next holder instead of at the end of its ttl.
/// Ends when `done` fires (the lock was released or abandoned).
fn relay_lost(lost: LostSignals, halves: Arc<Halves>, done: CancellationToken) {
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
async fn keep_alive(
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
            Ok(Err(e)) if e.kind() != crate::ErrorKind::Lost => {
                next = now() + (ttl / 30).max(Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

/// Releases a half, when a migrating acquire is dropped or fails after it.
fn undo_half(lease: &Arc<dyn BackendLease>) -> CleanupOnDrop {
    let lease = lease.clone();
    CleanupOnDrop::new("release a half of a migrating lock", async move {
        let _ = lease.release().await;
    })
}

/// The layout of a primitive on both backends, or
/// [`Layout::Unsupported`] when they differ.
fn same_layout(a: Layout, b: Layout) -> Layout {
    if a == b {
        a
    } else {
        Layout::Unsupported
    }
}

#[async_trait]
impl Backend for Migrating {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let (a, b) = (self.old.capabilities(), self.new.capabilities());
        Capabilities::new(
            weaker_fencing(a.fencing, b.fencing),
            weaker_lease(a.lease, b.lease),
        )
        .fair(a.fair && b.fair)
        .push_wakeup(a.push_wakeup && b.push_wakeup)
        .inspect(a.inspect && b.inspect)
        .cross_process(a.cross_process && b.cross_process)
        .values(a.values && b.values)
        .rw_layout(same_layout(a.rw_layout, b.rw_layout))
        .semaphore_layout(same_layout(a.semaphore_layout, b.semaphore_layout))
    }

    /// Takes `req.name` on the old backend, then on the new one, both by
    /// `req.deadline`. While it waits for the new backend, the old half is
    /// renewed; if the old half is lost meanwhile, it starts again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a drop after the old backend granted the name releases
    /// it there in the background; each backend undoes its own half-done
    /// step.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let mut owner = req.owner;
        let mut again = false;
        loop {
            // Each pass is a new attempt with an owner token of its own: a
            // backend's cleanup of the previous one (a ZooKeeper sweep of
            // its nodes, an etcd revoke of its lease) must not reach it.
            if again {
                owner = crate::OwnerToken::random();
            }
            again = true;
            let old_lost = CancellationToken::new();
            let Some(old) = self
                .old
                .acquire(AcquireRequest {
                    name: req.name,
                    owner,
                    ttl: req.ttl,
                    deadline: req.deadline,
                    lost: &old_lost,
                    value: req.value,
                    mode: req.mode,
                })
                .await?
            else {
                return Ok(None);
            };
            let old_lease: Arc<dyn BackendLease> = Arc::from(old.lease);
            let undo_old = undo_half(&old_lease);
            let old_valid = Mutex::new(old.valid_until);
            let new_lost = CancellationToken::new();
            let acquiring = self.new.acquire(AcquireRequest {
                name: req.name,
                owner,
                ttl: req.ttl,
                deadline: req.deadline,
                lost: &new_lost,
                value: req.value,
                mode: req.mode,
            });
            let keeping = keep_alive(&*old_lease, req.ttl, &old_lost, &old_valid);
            let new = tokio::select! {
                biased;
                new = acquiring => Some(new),
                () = keeping => None,
            };
            let Some(new) = new else {
                // The old half was lost while we waited: start again (the
                // new backend's wait, dropped, undid itself).
                undo_old.run_now().await;
                continue;
            };
            let new = match new {
                Ok(Some(g)) => g,
                Ok(None) => {
                    undo_old.run_now().await;
                    return Ok(None);
                }
                Err(e) => {
                    undo_old.run_now().await;
                    return Err(e);
                }
            };
            let new_lease: Arc<dyn BackendLease> = Arc::from(new.lease);
            let undo_new = undo_half(&new_lease);
            let old_valid = *lock(&old_valid);
            if old_lost.is_cancelled() || now() >= old_valid {
                undo_new.run_now().await;
                undo_old.run_now().await;
                continue;
            }
            let fence = match offset_fence(new.fence, self.offset, self.capabilities().fencing) {
                Ok(f) => f,
                Err(e) => {
                    undo_new.run_now().await;
                    undo_old.run_now().await;
                    return Err(e);
                }
            };
            undo_new.disarm();
            undo_old.disarm();
            let done = CancellationToken::new();
            let halves = Arc::new(Halves {
                old: old_lease,
                new: new_lease,
                turn: tokio::sync::Mutex::new(()),
            });
            relay_lost(
                LostSignals {
                    old: old_lost,
                    new: new_lost,
                    guard: req.lost.clone(),
                },
                halves.clone(),
                done.clone(),
            );
            return Ok(Some(Grant {
                lease: Box::new(MigratingLease { halves, done }),
                fence,
                valid_until: old_valid.min(new.valid_until),
            }));
        }
    }

    /// The holder as the new backend sees it (with the offset applied to
    /// its token), else as the old backend does (an old-only client, or a
    /// migrating one between its two steps) but without a token: an old
    /// token is not comparable with the migrating ones, and reporting it
    /// would show terms going back around every hand-over. The waiters
    /// queued on either backend, where both can count them.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let (old, new) = tokio::join!(self.old.inspect(name), self.new.inspect(name));
        let (old, new) = (old?, new?);
        let fencing = self.capabilities().fencing;
        let new_holder = match new.as_ref().and_then(|i| i.holder.clone()) {
            Some(mut h) => {
                h.fence = offset_fence(h.fence, self.offset, fencing)?;
                Some(h)
            }
            None => None,
        };
        let old_holder = old.as_ref().and_then(|i| i.holder.clone()).map(|mut h| {
            h.fence = None;
            h
        });
        // Counted only where both backends can count.
        let waiters = match (
            old.as_ref().and_then(|i| i.waiters),
            new.as_ref().and_then(|i| i.waiters),
        ) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        if old.is_none() && new.is_none() {
            return Ok(None);
        }
        Ok(Some(LockInfo::new(new_holder.or(old_holder), waiters)))
    }

    /// The names either backend lists (once each); `None` when neither can
    /// list.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let (old, new) = tokio::join!(self.old.list(prefix, limit), self.new.list(prefix, limit));
        let (old, new) = (old?, new?);
        if old.is_none() && new.is_none() {
            return Ok(None);
        }
        let complete = [&old, &new]
            .iter()
            .all(|l| l.as_ref().is_none_or(|l| l.complete));
        let mut names: Vec<String> = new.into_iter().chain(old).flat_map(|l| l.names).collect();
        names.sort();
        names.dedup();
        let mut listing = Listing::bounded(names, limit);
        listing.complete &= complete;
        Ok(Some(listing))
    }

    /// The new backend's holders (tokens offset), else the old one's
    /// (without tokens, as [`inspect`](Backend::inspect) reports them).
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        let fencing = self.capabilities().fencing;
        if let Some(mut holders) = self.new.inspect_role(name, role).await? {
            if !holders.is_empty() {
                for h in &mut holders {
                    h.fence = offset_fence(h.fence, self.offset, fencing)?;
                }
                return Ok(Some(holders));
            }
        }
        Ok(self.old.inspect_role(name, role).await?.map(|mut holders| {
            for h in &mut holders {
                h.fence = None;
            }
            holders
        }))
    }
}

/// The two leases of a migrating lock. Their renewals and releases take
/// turns, so that a release never runs beside a renewal (which could take
/// a lease back on the server after it was released).
#[derive(Debug)]
struct Halves {
    old: Arc<dyn BackendLease>,
    new: Arc<dyn BackendLease>,
    turn: tokio::sync::Mutex<()>,
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
struct MigratingLease {
    halves: Arc<Halves>,
    /// Ends the lost relay once the lease is released or abandoned.
    done: CancellationToken,
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

/// A backend whose fencing tokens are shifted by a fixed offset: the
/// new-only clients of step 3 of a migration keep the offset the migrating
/// clients used (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct OffsetFences {
    inner: Arc<dyn Backend>,
    offset: u64,
}

impl OffsetFences {
    /// `inner` with `offset` added to every token.
    pub fn new(inner: Arc<dyn Backend>, offset: u64) -> Self {
        OffsetFences { inner, offset }
    }
}

#[async_trait]
impl Backend for OffsetFences {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// As the inner backend's, with the token shifted.
    ///
    /// # Cancel safety
    ///
    /// As the inner backend's.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let Some(g) = self.inner.acquire(req).await? else {
            return Ok(None);
        };
        match offset_fence(g.fence, self.offset, self.inner.capabilities().fencing) {
            Ok(fence) => Ok(Some(Grant { fence, ..g })),
            Err(e) => {
                undo_half(&Arc::from(g.lease)).run_now().await;
                Err(e)
            }
        }
    }

    /// As the inner backend's, with the holder's token shifted.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let Some(mut info) = self.inner.inspect(name).await? else {
            return Ok(None);
        };
        if let Some(h) = info.holder.as_mut() {
            h.fence = offset_fence(h.fence, self.offset, self.inner.capabilities().fencing)?;
        }
        Ok(Some(info))
    }

    /// As the inner backend's.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        self.inner.list(prefix, limit).await
    }

    /// As the inner backend's, with the holders' tokens shifted.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        let Some(mut holders) = self.inner.inspect_role(name, role).await? else {
            return Ok(None);
        };
        for h in &mut holders {
            h.fence = offset_fence(h.fence, self.offset, self.inner.capabilities().fencing)?;
        }
        Ok(Some(holders))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;
    use crate::memory::MemoryBackend;
    use crate::{LockOptions, Locker, Wait};

    const BOUND: Duration = Duration::from_secs(5);

    fn pair() -> (MemoryBackend, MemoryBackend, Locker) {
        let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
        let m = Locker::new(Migrating::new(Arc::new(old.clone()), Arc::new(new.clone())));
        (old, new, m)
    }

    /// Records the owner token of every acquisition it passes on.
    #[derive(Debug, Clone)]
    struct Recording {
        inner: MemoryBackend,
        owners: Arc<Mutex<Vec<crate::OwnerToken>>>,
    }

    #[async_trait]
    impl Backend for Recording {
        fn name(&self) -> &'static str {
            "recording"
        }

        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities()
        }

        async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
            lock(&self.owners).push(req.owner);
            self.inner.acquire(req).await
        }
    }

    /// A migrating acquisition that starts again (its old half was lost
    /// while it waited for the new one) is a new attempt with an owner
    /// token of its own on both backends: a backend's cleanup of the first
    /// attempt (a ZooKeeper node sweep by owner, an etcd lease revoked by
    /// id) must not reach the second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_migrating_retry_is_a_new_owner() {
        let old = Recording {
            inner: MemoryBackend::new(),
            owners: Arc::default(),
        };
        let new = Recording {
            inner: MemoryBackend::new(),
            owners: Arc::default(),
        };
        let m = Locker::new(Migrating::new(Arc::new(old.clone()), Arc::new(new.clone())));
        // The new backend is held by someone else: the migrating acquire
        // holds the old half and waits on the new one.
        let blocker = Locker::new(new.inner.clone()).lock("x").await.unwrap();
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Wait::For(Duration::from_secs(20)));
        let waiting = tokio::spawn(async move { m.acquire("x", &opts).await.map(|g| g.is_some()) });
        let until = std::time::Instant::now() + BOUND;
        while lock(&old.owners).is_empty() || lock(&new.owners).is_empty() {
            assert!(
                std::time::Instant::now() < until,
                "never waited on the new half"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The old half is lost while it waits: the acquisition starts again.
        assert!(old.inner.revoke("x"));
        while lock(&old.owners).len() < 2 {
            assert!(std::time::Instant::now() < until, "never started again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(blocker);
        assert!(waiting.await.unwrap().unwrap(), "acquired in the end");
        let (o, n) = (lock(&old.owners).clone(), lock(&new.owners).clone());
        assert_ne!(
            o[0], o[1],
            "the retry reused the first attempt's owner token"
        );
        assert_eq!(o[0], n[0], "one attempt, one owner on both backends");
        assert_eq!(
            o.last(),
            n.last(),
            "one attempt, one owner on both backends"
        );
    }

    /// The same store given as old and new (two spellings of one server)
    /// is refused by behaviour: a probe name held on the old backend shows
    /// held on the new one.
    #[tokio::test]
    async fn one_store_twice_is_refused() {
        let one = MemoryBackend::new();
        let m = Migrating::new(Arc::new(one.clone()), Arc::new(one.clone()));
        let err = m.verify_distinct().await.expect_err("one store twice");
        assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig);
        assert!(err.to_string().contains("same store"), "{err}");
        let distinct = Migrating::new(Arc::new(MemoryBackend::new()), Arc::new(one.clone()));
        distinct.verify_distinct().await.expect("two stores");
        // Another client's probe held on the new store (a stale one, or a
        // client of another migration into it) is no proof of one store.
        let other = Locker::new(one.clone());
        let mut stale = Vec::new();
        for n in 0..16 {
            let name = format!("lockcore-migrate-probe\u{1f}permit-{n:04}");
            stale.push(other.lock(&name).await.unwrap());
        }
        let into_one = Migrating::new(Arc::new(MemoryBackend::new()), Arc::new(one));
        into_one
            .verify_distinct()
            .await
            .expect("two stores, probes held on the new");
    }

    #[tokio::test]
    async fn a_lost_half_fires_lost_and_frees_the_other_half() {
        for old_half in [true, false] {
            let (old, new, m) = pair();
            let opts = LockOptions::new().ttl(Duration::from_secs(30));
            let g = m.acquire("x", &opts).await.unwrap().unwrap();
            let (lost_on, other) = if old_half { (&old, &new) } else { (&new, &old) };
            assert!(lost_on.revoke("x"));
            tokio::time::timeout(BOUND, g.lost())
                .await
                .expect("lost fires when either half is lost");
            // The other half is freed at once, not after its 30 s ttl.
            let other = Locker::new(other.clone());
            let t = other
                .acquire("x", &LockOptions::new().wait(Wait::For(BOUND)))
                .await
                .unwrap();
            assert!(t.is_some(), "the half still held was not released");
        }
    }

    #[tokio::test]
    async fn a_dropped_acquire_leaves_neither_half() {
        let (old, new, m) = pair();
        let new_only = Locker::new(new.clone());
        let blocker = new_only.lock("x").await.unwrap();
        let waiting = tokio::spawn(async move {
            m.acquire(
                "x",
                &LockOptions::new().wait(Wait::For(Duration::from_secs(60))),
            )
            .await
        });
        // Wait until the migrating client holds the old half and queues on
        // the new backend, then drop its acquire there.
        while Locker::new(old.clone())
            .try_lock("x")
            .await
            .unwrap()
            .is_some()
        {
            tokio::task::yield_now().await;
        }
        waiting.abort();
        let _ = waiting.await;
        let old_only = Locker::new(old.clone());
        let got = old_only
            .acquire("x", &LockOptions::new().wait(Wait::For(BOUND)))
            .await
            .unwrap();
        assert!(got.is_some(), "a dropped acquire left the old half held");
        blocker.release().await.unwrap();
        assert_eq!(
            new.active_names(),
            0,
            "a dropped acquire left a waiter behind"
        );
    }

    #[tokio::test]
    async fn capabilities_are_the_weaker_and_tokens_are_offset() {
        let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
        let m = Migrating::new(Arc::new(old), Arc::new(new)).fence_offset(1000);
        let caps = m.capabilities();
        assert_eq!(caps, MemoryBackend::new().capabilities());
        let l = Locker::new(m);
        let g = l.lock("x").await.unwrap();
        assert!(g.fence().unwrap() > 1000);
        let info = l.inspect("x").await.unwrap().unwrap();
        assert_eq!(
            info.holder.unwrap().fence,
            g.fence(),
            "inspect shows the offset token"
        );
        assert_eq!(
            weaker_fencing(Fencing::Strict, Fencing::None),
            Fencing::None
        );
        assert_eq!(
            weaker_lease(LeaseKind::Ttl, LeaseKind::Connection),
            LeaseKind::Connection
        );
    }

    #[tokio::test]
    async fn an_overflowing_offset_is_an_error_and_holds_nothing() {
        let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
        let l = Locker::new(
            Migrating::new(Arc::new(old.clone()), Arc::new(new.clone())).fence_offset(u64::MAX),
        );
        let err = l.try_lock("x").await.expect_err("the token overflows");
        assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig);
        assert!(Locker::new(old).try_lock("x").await.unwrap().is_some());
        assert!(Locker::new(new).try_lock("x").await.unwrap().is_some());
    }

    /// The old half lost while the new one is awaited (and taken by an
    /// old-only client): the migrating client is not granted the name while
    /// the old-only client holds it; it starts again behind it.
    #[tokio::test]
    async fn an_old_half_lost_while_waiting_is_taken_again() {
        let (old, new, m) = pair();
        let blocker = Locker::new(new.clone()).lock("x").await.unwrap();
        let waiting = tokio::spawn(async move {
            m.acquire(
                "x",
                &LockOptions::new().wait(Wait::For(Duration::from_secs(30))),
            )
            .await
            .unwrap()
            .unwrap()
        });
        let old_only = Locker::new(old.clone());
        while old_only.try_lock("x").await.unwrap().is_some() {
            tokio::task::yield_now().await;
        }
        assert!(old.revoke("x"));
        let o = old_only.lock_timeout("x", BOUND).await.unwrap();
        blocker.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "granted while an old-only client holds the name"
        );
        o.release().await.unwrap();
        let g = tokio::time::timeout(BOUND, waiting).await.unwrap().unwrap();
        assert!(g.is_held());
        assert!(
            old_only.try_lock("x").await.unwrap().is_none(),
            "held on the old backend"
        );
    }

    /// A wait on the new backend longer than the ttl: the old half is kept
    /// renewed meanwhile, and the guard is held on both when granted.
    #[tokio::test(start_paused = true)]
    async fn the_old_half_is_renewed_while_the_new_is_awaited() {
        let (old, new, m) = pair();
        let blocker = Locker::new(new.clone()).lock("x").await.unwrap();
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Wait::For(Duration::from_secs(30)));
        let waiting = tokio::spawn(async move { m.acquire("x", &opts).await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        blocker.release().await.unwrap();
        let g = waiting.await.unwrap().unwrap().unwrap();
        assert!(g.is_held(), "granted a guard whose old half had expired");
        assert!(
            Locker::new(old).try_lock("x").await.unwrap().is_none(),
            "the old half expired while the new one was awaited"
        );
    }
}
