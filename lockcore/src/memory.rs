//! The in-memory backend: the whole contract for tasks in one process.
//!
//! It is the embedded default (`memory://`) and the reference the other
//! backends are compared to: ttl expiry, owner-checked renewal and release,
//! strict fencing (one counter for all names, so tokens rise strictly per
//! name), FIFO-fair waiting with direct hand-off to the first waiter
//! (push wake-up, no polling), and cancel safety (a dropped waiter leaves the
//! queue, or hands on a lease granted to it at that very moment).
//!
//! Locks exclude the tasks that share one `MemoryBackend` (through clones of
//! it, or of a [`Locker`](crate::locker::Locker) over it), never other processes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::capabilities::{Capabilities, Fencing, LeaseKind};
use crate::error::{Error, Result};
use crate::info::{HolderInfo, Listing, LockInfo};
use crate::raw::{
    AcquireRequest, Backend, BackendLease, Deadline, Grant, OwnerToken, Released, Renewal,
};

const NAME: &str = "memory";

/// An in-process lock server.
///
/// ```
/// use lockcore::{Locker, memory::MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockcore::Result<()> {
/// let backend = MemoryBackend::new();
/// let a = Locker::new(backend.clone());
/// let b = Locker::new(backend.clone());
/// let g = a.lock("x").await?;
/// assert!(b.try_lock("x").await?.is_none());
/// assert!(backend.revoke("x")); // an operator takes it away
/// g.lost().await;
/// assert!(b.try_lock("x").await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    locks: HashMap<String, Entry>,
    last_fence: u64,
}

#[derive(Debug, Default)]
struct Entry {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerToken,
    expires: Instant,
    fence: u64,
    lost: CancellationToken,
    value: Option<String>,
    /// When it was granted.
    since: std::time::SystemTime,
}

#[derive(Debug)]
struct Waiter {
    owner: OwnerToken,
    ttl: Duration,
    lost: CancellationToken,
    value: Option<String>,
    tx: oneshot::Sender<(u64, Instant)>,
}

impl Entry {
    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty()
    }

    /// Expires a stale holder and hands a free lock to the first live waiter.
    fn settle(&mut self, now: Instant, last_fence: &mut u64) {
        if self.holder.as_ref().is_some_and(|h| h.expires <= now) {
            if let Some(h) = self.holder.take() {
                h.lost.cancel();
            }
        }
        while self.holder.is_none() {
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            *last_fence += 1;
            let expires = now + w.ttl;
            if w.tx.send((*last_fence, expires)).is_ok() {
                self.holder = Some(Holder {
                    owner: w.owner,
                    since: std::time::SystemTime::now(),
                    expires,
                    fence: *last_fence,
                    lost: w.lost,
                    value: w.value,
                });
            }
        }
    }

    /// Clears the holder if it is `owner`; true if it was.
    fn release(&mut self, owner: OwnerToken, now: Instant, last_fence: &mut u64) -> bool {
        let mine = self
            .holder
            .as_ref()
            .is_some_and(|h| h.owner == owner && h.expires > now);
        if mine {
            self.holder = None;
        }
        self.settle(now, last_fence);
        mine
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn registry() -> &'static Mutex<HashMap<String, MemoryBackend>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl MemoryBackend {
    /// A new, empty lock server.
    pub fn new() -> Self {
        MemoryBackend::default()
    }

    /// The process-wide instance called `name` (created on first use), so
    /// that separate `connect("memory://name")` calls lock against each other
    /// as separate connections to one server would. `""` is the default one.
    pub fn shared(name: &str) -> Self {
        let mut reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        reg.entry(name.to_owned()).or_default().clone()
    }

    /// Takes the lease on `name` away from its holder, as an operator or a
    /// fault would: the holder's lost signal fires and the next waiter gets
    /// the lock. Returns whether the name was held.
    pub fn revoke(&self, name: &str) -> bool {
        let mut st = lock(&self.state);
        let State { locks, last_fence } = &mut *st;
        let Some(entry) = locks.get_mut(name) else {
            return false;
        };
        let was = entry.holder.take();
        if let Some(h) = &was {
            h.lost.cancel();
        }
        entry.settle(crate::raw::now(), last_fence);
        if entry.is_idle() {
            locks.remove(name);
        }
        was.is_some()
    }

    /// Ends the lease on `name` on the server as if its ttl had run out now,
    /// without telling the holder: its lost signal fires only when it finds
    /// out by itself (its next renewal is refused, or its validity deadline
    /// passes), as with a networked server. The next waiter gets the lock.
    /// Returns whether the name was held.
    pub fn expire(&self, name: &str) -> bool {
        let mut st = lock(&self.state);
        let State { locks, last_fence } = &mut *st;
        let Some(entry) = locks.get_mut(name) else {
            return false;
        };
        let was = entry.holder.take().is_some();
        entry.settle(crate::raw::now(), last_fence);
        if entry.is_idle() {
            locks.remove(name);
        }
        was
    }

    /// How many names have a holder or waiters (idle names take no memory).
    pub fn active_names(&self) -> usize {
        lock(&self.state).locks.len()
    }

    fn lease(&self, name: &str, owner: OwnerToken, fence: u64, valid_until: Instant) -> Grant {
        Grant {
            lease: Box::new(MemoryLease {
                state: self.state.clone(),
                name: name.to_owned(),
                owner,
            }),
            fence: Some(fence),
            valid_until,
        }
    }

    fn holder_expiry(&self, name: &str) -> Option<Instant> {
        let st = lock(&self.state);
        st.locks.get(name)?.holder.as_ref().map(|h| h.expires)
    }
}

/// A queued waiter; dropping it (a cancelled acquire) leaves the queue, or
/// hands on a lease that was granted to it in the meantime.
struct Queued<'a> {
    backend: &'a MemoryBackend,
    name: &'a str,
    owner: OwnerToken,
    rx: oneshot::Receiver<(u64, Instant)>,
    done: bool,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = lock(&self.backend.state);
        let State { locks, last_fence } = &mut *st;
        let Some(entry) = locks.get_mut(self.name) else {
            return;
        };
        entry.waiters.retain(|w| w.owner != self.owner);
        if self.rx.try_recv().is_ok() {
            entry.release(self.owner, crate::raw::now(), last_fence);
        }
        if entry.is_idle() {
            locks.remove(self.name);
        }
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, LeaseKind::Ttl)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
            .cross_process(false)
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        // Take part in tokio's cooperative scheduling as its own resources
        // do: a task that acquires in a loop yields now and then, so timers
        // and other tasks (the watchdog among them) still run.
        tokio::task::consume_budget().await;
        let now = crate::raw::now();
        let rx = {
            let mut st = lock(&self.state);
            let State { locks, last_fence } = &mut *st;
            let entry = if let Some(e) = locks.get_mut(req.name) {
                e
            } else {
                locks.entry(req.name.to_owned()).or_default()
            };
            entry.settle(now, last_fence);
            if entry.holder.is_none() {
                *last_fence += 1;
                let expires = now + req.ttl;
                entry.holder = Some(Holder {
                    since: std::time::SystemTime::now(),
                    owner: req.owner,
                    expires,
                    fence: *last_fence,
                    lost: req.lost.clone(),
                    value: req.value.map(str::to_owned),
                });
                return Ok(Some(self.lease(req.name, req.owner, *last_fence, expires)));
            }
            if req.deadline == Deadline::Now {
                return Ok(None);
            }
            crate::raw::waiting();
            let (tx, rx) = oneshot::channel();
            entry.waiters.push_back(Waiter {
                owner: req.owner,
                ttl: req.ttl,
                lost: req.lost.clone(),
                value: req.value.map(str::to_owned),
                tx,
            });
            rx
        };
        let mut queued = Queued {
            backend: self,
            name: req.name,
            owner: req.owner,
            rx,
            done: false,
        };
        loop {
            // Sleep until the deadline or the holder's expiry, whichever is
            // first; a release hands the lock over through the channel.
            let wake = match (req.deadline.instant(), self.holder_expiry(req.name)) {
                (Some(d), Some(e)) => Some(d.min(e)),
                (d, e) => d.or(e),
            };
            let sleep = async {
                match wake {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            // Biased: a grant that is ready wins over the timer, and a run
            // on a paused clock replays exactly.
            tokio::select! {
                biased;
                granted = &mut queued.rx => {
                    queued.done = true;
                    let (fence, valid_until) = granted.map_err(|_| {
                        Error::backend_error(NAME, "the wait queue was dropped").with_name(req.name)
                    })?;
                    return Ok(Some(self.lease(req.name, req.owner, fence, valid_until)));
                }
                () = sleep => {
                    let now = crate::raw::now();
                    {
                        let mut st = lock(&self.state);
                        let State { locks, last_fence } = &mut *st;
                        if let Some(entry) = locks.get_mut(req.name) {
                            entry.settle(now, last_fence);
                        }
                    }
                    if let Ok((fence, valid_until)) = queued.rx.try_recv() {
                        queued.done = true;
                        return Ok(Some(self.lease(req.name, req.owner, fence, valid_until)));
                    }
                    if req.deadline.passed(now) {
                        return Ok(None);
                    }
                }
            }
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let now = crate::raw::now();
        let st = lock(&self.state);
        let Some(entry) = st.locks.get(name) else {
            return Ok(Some(LockInfo::new(None, Some(0))));
        };
        let holder = entry.holder.as_ref().filter(|h| h.expires > now).map(|h| {
            HolderInfo::new(
                Some(h.owner.to_string()),
                Some(h.fence),
                Some(h.expires.saturating_duration_since(now)),
            )
            .with_value(h.value.clone())
            .with_since(Some(h.since))
        });
        Ok(Some(LockInfo::new(holder, Some(entry.waiters.len()))))
    }

    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let now = crate::raw::now();
        let st = lock(&self.state);
        let names = st
            .locks
            .iter()
            .filter(|(name, e)| {
                name.starts_with(prefix)
                    && (e.holder.as_ref().is_some_and(|h| h.expires > now) || !e.waiters.is_empty())
            })
            .map(|(name, _)| name.clone())
            .take(limit.saturating_add(1))
            .collect();
        Ok(Some(Listing::bounded(names, limit)))
    }
}

#[derive(Debug)]
struct MemoryLease {
    state: Arc<Mutex<State>>,
    name: String,
    owner: OwnerToken,
}

impl MemoryLease {
    /// Renews in the map, at once: the server is in this process.
    fn renew_here(&self, ttl: Duration) -> Renewal {
        let now = crate::raw::now();
        let mut st = lock(&self.state);
        let holder = st
            .locks
            .get_mut(&self.name)
            .and_then(|e| e.holder.as_mut())
            .filter(|h| h.owner == self.owner && h.expires > now);
        match holder {
            Some(h) => {
                h.expires = now + ttl;
                Renewal::Renewed {
                    valid_until: h.expires,
                }
            }
            None => Renewal::Lost,
        }
    }
}

#[async_trait]
impl BackendLease for MemoryLease {
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        Ok(self.renew_here(ttl))
    }

    /// The renewal itself, done at once (the watchdog makes no future).
    fn renew_known(&self, ttl: Duration) -> Option<Renewal> {
        Some(self.renew_here(ttl))
    }

    async fn release(&self) -> Result<Released> {
        let mut st = lock(&self.state);
        let State { locks, last_fence } = &mut *st;
        let Some(entry) = locks.get_mut(&self.name) else {
            return Ok(Released::NotHeld);
        };
        let mine = entry.release(self.owner, crate::raw::now(), last_fence);
        if entry.is_idle() {
            locks.remove(&self.name);
        }
        Ok(if mine {
            Released::Released
        } else {
            Released::NotHeld
        })
    }
}
