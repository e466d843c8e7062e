//! A read-write lock on any backend: many readers or one writer, and a
//! waiting writer is not starved by a stream of readers.
//!
//! **Layout.** Read-write lock `L` is made of the lock `L/write` (the
//! writers' gate) and a [`Semaphore`] of `max_readers` slots named
//! `L/read/permit-<i>`, all ordinary locks of the backend the [`Locker`]
//! talks to, each taken by an owner of its own.
//!
//! - A **reader** passes the gate (takes `L/write` and lets it go at once),
//!   then takes one reader slot.
//! - A **writer** takes the gate and keeps it, then takes every reader slot
//!   in order, so it waits for the readers inside to leave.
//!
//! **Policy: writers first.** While a writer holds the gate (waiting for the
//! readers inside, or writing), new readers wait at the gate, so a stream
//! of readers cannot starve it; writers are served in the gate lock's order
//! (arrival order on ZooKeeper and etcd). At most `max_readers` (16 by
//! default) read at once; more wait for a slot.
//!
//! **Tokens.** A writer's token is the gate's fencing token: it rises
//! strictly across writers. A reader's token is its slot's: it rises across
//! the readers of one slot, and says nothing about writers.
//!
//! **Reentrancy.** None: every acquisition is a new owner. A task that holds
//! a read lock and asks for another while a writer waits deadlocks with that
//! writer (as with any writers-first lock).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! use lockcore::{Locker, RwLock};
//!
//! let locker = Locker::memory();
//! let config = RwLock::new(&locker, "config")?;
//! let r1 = config.try_read().await?.expect("no writer");
//! let r2 = config.try_read().await?.expect("readers share");
//! assert!(config.try_write().await?.is_none(), "a writer waits for readers");
//! r1.release().await?;
//! r2.release().await?;
//! let w = config.try_write().await?.expect("no readers left");
//! assert!(config.try_read().await?.is_none(), "readers wait for the writer");
//! println!("writing with token {:?}", w.fence());
//! w.release().await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Instant;

use futures_util::future::select_all;

use crate::name::{validate_name, MAX_NAME_BYTES};
use crate::semaphore::{Permit, Semaphore};
use crate::{Error, ErrorKind, LockGuard, LockOptions, Locker, Result, Wait};

/// The readers that may read at once, by default.
pub const DEFAULT_MAX_READERS: u32 = 16;

/// The bytes the longest part name adds (`/read/permit-0000`).
const SUFFIX_BYTES: usize = "/read/permit-0000".len();

/// A read-write lock (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct RwLock {
    locker: Locker,
    name: String,
    readers: Semaphore,
}

impl RwLock {
    /// A read-write lock on `name` with [`DEFAULT_MAX_READERS`].
    ///
    /// # Errors
    ///
    /// As [`RwLock::with_max_readers`].
    pub fn new(locker: &Locker, name: &str) -> Result<Self> {
        Self::with_max_readers(locker, name, DEFAULT_MAX_READERS)
    }

    /// A read-write lock on `name` where at most `max_readers` read at once.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] for a name the lock refuses or too long
    /// for its parts; [`ErrorKind::InvalidConfig`] for a reader count the
    /// [`Semaphore`] refuses.
    pub fn with_max_readers(locker: &Locker, name: &str, max_readers: u32) -> Result<Self> {
        let backend = locker.backend_name();
        validate_name(backend, name)?;
        if name.len() + SUFFIX_BYTES > MAX_NAME_BYTES {
            return Err(Error::new(
                ErrorKind::InvalidName,
                backend,
                format!(
                    "a read-write lock name has at most {} bytes",
                    MAX_NAME_BYTES - SUFFIX_BYTES
                ),
            )
            .or_name(name));
        }
        Ok(RwLock {
            locker: locker.clone(),
            name: name.to_owned(),
            readers: Semaphore::new(locker, &format!("{name}/read"), max_readers)?,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the writers' gate lock.
    pub fn gate_name(&self) -> String {
        format!("{}/write", self.name)
    }

    /// The semaphore of the reader slots.
    pub fn readers(&self) -> &Semaphore {
        &self.readers
    }

    /// A read lock at once, or `None` while a writer holds or waits.
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`].
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        self.read(&self.locker.defaults().wait(Wait::Try)).await
    }

    /// A write lock at once, or `None` while anyone reads or writes.
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`RwLock::write`].
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        self.write(&self.locker.defaults().wait(Wait::Try)).await
    }

    /// A read lock with `opts`: `None` only for [`Wait::Try`].
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`]; [`ErrorKind::Timeout`] when the wait ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the gate and the slot are taken with
    /// [`Locker::acquire`], and a gate taken is let go at once (or, if the
    /// future is dropped then, released in the background by its guard).
    pub async fn read(&self, opts: &LockOptions) -> Result<Option<ReadGuard>> {
        let began = Instant::now();
        let Some(gate) = self.locker.clone().acquire(&self.gate_name(), opts).await? else {
            return Ok(None);
        };
        gate.release().await?;
        let permit = self.readers.acquire(&left(opts, began)).await?;
        Ok(permit.map(|permit| ReadGuard { permit }))
    }

    /// A write lock with `opts`: `None` only for [`Wait::Try`].
    ///
    /// # Errors
    ///
    /// As [`Locker::acquire`]; [`ErrorKind::Timeout`] when the wait ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: every part is taken with [`Locker::acquire`], and the
    /// parts taken so far are guards, released (in the background) when the
    /// future is dropped or a later part cannot be had.
    pub async fn write(&self, opts: &LockOptions) -> Result<Option<WriteGuard>> {
        let began = Instant::now();
        let Some(gate) = self.locker.clone().acquire(&self.gate_name(), opts).await? else {
            return Ok(None);
        };
        let mut slots = Vec::with_capacity(self.readers.permits() as usize);
        for i in 0..self.readers.permits() {
            let name = self.readers.slot_name(i);
            match self
                .locker
                .clone()
                .acquire(&name, &left(opts, began))
                .await?
            {
                Some(g) => slots.push(g),
                None => {
                    // A try found a reader inside: give everything back.
                    for g in slots {
                        g.release().await?;
                    }
                    gate.release().await?;
                    return Ok(None);
                }
            }
        }
        Ok(Some(WriteGuard { gate, slots }))
    }
}

/// `opts` with what is left of its wait since `began`.
fn left(opts: &LockOptions, began: Instant) -> LockOptions {
    match opts.get_wait() {
        Wait::For(d) => opts.wait(Wait::For(
            (began + d).saturating_duration_since(Instant::now()),
        )),
        _ => *opts,
    }
}

/// A held read lock: one reader slot.
#[derive(Debug)]
pub struct ReadGuard {
    permit: Permit,
}

impl ReadGuard {
    /// The reader slot's fencing token (see the [module docs](self)).
    pub fn fence(&self) -> Option<u64> {
        self.permit.fence()
    }

    /// Whether the read lock is still held.
    pub fn is_held(&self) -> bool {
        self.permit.is_held()
    }

    /// Resolves when the read lock's lease is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.permit.lost()
    }

    /// The reader slot's lock guard, to hold the read lock as a lock.
    pub fn into_guard(self) -> LockGuard {
        self.permit.into_guard()
    }

    /// Lets the read lock go.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<()> {
        self.permit.release().await
    }
}

/// A held write lock: the writers' gate and every reader slot.
#[derive(Debug)]
pub struct WriteGuard {
    gate: LockGuard,
    slots: Vec<LockGuard>,
}

impl WriteGuard {
    /// The writer's fencing token: the gate's, strictly rising across
    /// writers (`None` where the backend has none).
    pub fn fence(&self) -> Option<u64> {
        self.gate.fence()
    }

    /// Whether every part of the write lock is still held.
    pub fn is_held(&self) -> bool {
        self.gate.is_held() && self.slots.iter().all(LockGuard::is_held)
    }

    /// Resolves when the lease of any part is lost: the write lock can no
    /// longer be trusted then.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let all: Vec<_> = std::iter::once(&self.gate)
            .chain(&self.slots)
            .map(|g| Box::pin(g.lost()))
            .collect();
        async move {
            select_all(all).await;
        }
    }

    /// Lets the write lock go: the reader slots, then the gate.
    ///
    /// # Errors
    ///
    /// The first error of the parts' releases (every part is released).
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::release`]: parts whose release is dropped are
    /// released in the background.
    pub async fn release(self) -> Result<()> {
        let mut first = Ok(());
        for g in self.slots {
            if let Err(e) = g.release().await {
                first = first.and(Err(e));
            }
        }
        let gate = self.gate.release().await;
        first.and(gate)
    }
}
