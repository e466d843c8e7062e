//! A read-write lock on any backend: many readers or one writer, and a
//! waiting writer is not starved by a stream of readers.
//!
//! **Layout.** A backend with a read-write lock layout of its own
//! ([`Layout::Native`]) takes `L` itself as a reader or a writer
//! ([`Mode::Read`], [`Mode::Write`]): on ZooKeeper that is Curator's
//! `InterProcessReadWriteLock`, one queue of reader and writer nodes where
//! a reader waits only for the writers queued before it, so it is writers
//! first and served in arrival order, with no reader limit; on MySQL,
//! readers lock a row of the lock's own shared and writers for update,
//! and the server queues readers behind a waiting writer.
//!
//! On the others, read-write lock `L` is made of the lock `L␟write` (the
//! writers' gate) and a [`Semaphore`] of reader slots named
//! `L␟read␟permit-<i>` ([`MAX_READERS`] of them; `␟` is
//! [`PART_SEPARATOR`], U+001F, which no user
//! name contains, so a lock named `L/write` is another name), all ordinary
//! locks of the backend the [`Locker`] talks to, each taken by an owner of
//! its own.
//!
//! - A **reader** passes the gate (takes `L␟write` and lets it go at once),
//!   then takes one reader slot.
//! - A **writer** takes the gate and keeps it, then takes every reader slot
//!   in order, so it waits for the readers inside to leave.
//!
//! **Policy: writers first.** While a writer holds the gate (waiting for the
//! readers inside, or writing), new readers wait at the gate, so a stream
//! of readers cannot starve it; writers are served in the gate lock's order
//! (arrival order on ZooKeeper and etcd). At most [`MAX_READERS`] read at
//! once; more wait for a slot. A reader's `try` waits up to [`TRY_GATE`]
//! (2 s) at the gate, which other readers hold for a moment as they pass:
//! beside a writer it returns `None` after that, not at once.
//!
//! A `migrate:` pair whose backends lay it out differently has no
//! read-write lock ([`Layout::Unsupported`]): [`RwLock::new`] refuses it.
//!
//! **Tokens.** A writer's token rises strictly across writers: it is the
//! gate's in the built layout, the writer node's in a native one. A
//! reader's token, in a native layout, is above every writer's before it
//! and below every writer's after it; in the built layout it is its
//! slot's, rising across the readers of one slot and saying nothing about
//! writers.
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

use std::time::{Duration, Instant};

use crate::capabilities::Layout;
use crate::error::{Error, ErrorKind, Result};
use crate::locker::Locker;
use crate::name::{validate_compound_name, PART_SEPARATOR};
use crate::options::{LockOptions, Wait};
use crate::primitives::semaphore::Semaphore;
use crate::raw::{Mode, OwnerToken};

mod guards;

use guards::ReadHold;
pub use guards::{ReadGuard, WriteGuard};

/// The readers that may read at once in the built layout (a native one has
/// no limit). Fixed: a reader and a writer that
/// disagreed on it could hold at once (the writer would not take the slots
/// it does not know).
pub const MAX_READERS: u32 = 16;

/// How long a reader's `try` waits, in the built layout, at the gate for
/// other readers passing
/// it: each holds it for two writes, and readers arriving together pass
/// one after another (eight on a loaded etcd cluster took over 250 ms). A
/// writer holds it longer, so a `try_read` beside a writer returns `None`
/// after this long, not at once.
pub const TRY_GATE: Duration = Duration::from_secs(2);

/// What the longest part name adds to the lock's name.
const LONGEST_SUFFIX: &str = "\u{1f}read\u{1f}permit-0000";

/// A read-write lock (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct RwLock {
    locker: Locker,
    name: String,
    readers: Semaphore,
    /// The backend's own layout ([`Layout::Native`]).
    native: bool,
}

impl RwLock {
    /// A read-write lock on `name`. In the built layout at most
    /// [`MAX_READERS`] read at once; the count is fixed, so that every
    /// client of a name agrees on the slots a writer must take.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] for a name the lock refuses or too long
    /// for its parts; [`ErrorKind::InvalidConfig`] on a `migrate:` pair
    /// whose backends lay a read-write lock out differently.
    pub fn new(locker: &Locker, name: &str) -> Result<Self> {
        let backend = locker.backend_name();
        validate_compound_name(backend, name, LONGEST_SUFFIX, "a read-write lock")?;
        let native = match locker.capabilities().rw_layout {
            Layout::Built => false,
            Layout::Native => true,
            _ => {
                return Err(Error::invalid_config(
                    backend,
                    "the two backends of this migration lay a read-write lock out differently (one builds it from locks, the other has its own layout), so a client of both could not exclude the plain clients of either: lay it out from locks on every client of the name (the URL option rwlock=built of ZooKeeper and MySQL, kept for good), or stop the read-write lock's users while the migration runs",
                )
                .with_name(name))
            }
        };
        Ok(RwLock {
            locker: locker.clone(),
            name: name.to_owned(),
            readers: Semaphore::built(locker, &format!("{name}{PART_SEPARATOR}read"), MAX_READERS)?,
            native,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name of the writers' gate lock of the built layout (a native
    /// layout has none).
    pub fn gate_name(&self) -> String {
        format!("{}{PART_SEPARATOR}write", self.name)
    }

    /// The semaphore of the reader slots of the built layout (unused in a
    /// native one).
    pub fn readers(&self) -> &Semaphore {
        &self.readers
    }

    /// A read lock, or `None` while a writer holds or waits (in the built
    /// layout after waiting up to [`TRY_GATE`] at the gate for readers
    /// passing it; at once in a native one).
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
        opts.validate(self.locker.backend_name())?;
        if self.native {
            let node = self
                .locker
                .acquire_with(&self.name, opts, None, Mode::Read)
                .await?;
            return Ok(node.map(|g| ReadGuard {
                hold: ReadHold::Node(g),
            }));
        }
        let began = Instant::now();
        let at_gate = match opts.get_wait() {
            Wait::Try => opts.wait(Wait::For(TRY_GATE)),
            _ => *opts,
        };
        let gate = match self
            .locker
            .acquire_with(
                &self.gate_name(),
                &at_gate,
                None,
                crate::raw::Mode::Exclusive,
            )
            .await
        {
            Ok(Some(gate)) => gate,
            Ok(None) => return Ok(None),
            Err(e) if opts.get_wait() == Wait::Try && e.kind() == ErrorKind::Timeout => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        gate.release().await?;
        let permit = self.readers.acquire(&opts.left_since(began)).await?;
        Ok(permit.map(|permit| ReadGuard {
            hold: ReadHold::Slot(permit),
        }))
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
        opts.validate(self.locker.backend_name())?;
        if self.native {
            let node = self
                .locker
                .acquire_with(&self.name, opts, None, Mode::Write)
                .await?;
            return Ok(node.map(|gate| WriteGuard {
                gate,
                slots: Vec::new(),
            }));
        }
        let began = Instant::now();
        let gate_owner = OwnerToken::random();
        let gate = self
            .locker
            .acquire_as(&self.gate_name(), opts, None, Mode::Exclusive, gate_owner)
            .await?;
        let Some(gate) = gate else {
            return Ok(None);
        };
        let mut slots = Vec::with_capacity(self.readers.permits() as usize);
        for i in 0..self.readers.permits() {
            let name = self.readers.slot_name(i);
            let owner = writer_slot_owner(gate_owner, i);
            let slot = self
                .locker
                .acquire_as(&name, &opts.left_since(began), None, Mode::Exclusive, owner)
                .await?;
            match slot {
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
        let guard = WriteGuard { gate, slots };
        if !guard.is_held() {
            // The gate (or a slot) was lost while the readers left: another
            // writer may have written since, with a larger token.
            let _ = guard.release().await;
            return Err(Error::lost(
                self.locker.backend_name(),
                "the write lock's gate was lost while waiting for the readers",
            )
            .or_name(&self.name));
        }
        Ok(Some(guard))
    }
}

/// The owner of a writer's reader slot `slot` in the built layout, derived
/// from the owner of its gate, so that an inspection tells the writer's
/// slots from readers' ([`crate::holdings`]). Distinct per slot and
/// random-looking (etcd derives a lease id from an owner).
pub(crate) fn writer_slot_owner(gate: OwnerToken, slot: u32) -> OwnerToken {
    // splitmix64's finalizer.
    let mix = |z: u64| {
        let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let v = gate.as_u128();
    let (hi, lo) = ((v >> 64) as u64, v as u64);
    let s = u64::from(slot).wrapping_add(1);
    let h = mix(hi ^ mix(lo ^ s));
    let l = mix(lo ^ mix(hi.rotate_left(17) ^ s.wrapping_mul(0xD6E8_FEB8_6659_FD93)));
    OwnerToken::from_u128((u128::from(h) << 64) | u128::from(l))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_whose_gate_ran_out_while_waiting_is_not_granted() {
        let locker = Locker::memory();
        let rw = RwLock::new(&locker, "gate-lost").unwrap();
        let reader = rw.try_read().await.unwrap().expect("reader");
        // The writer's parts live 1 s without renewal; the reader stays 1.5 s.
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .renew(false)
            .wait(Wait::For(Duration::from_secs(10)));
        let writer = {
            let rw = rw.clone();
            tokio::spawn(async move { rw.write(&opts).await })
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        reader.release().await.unwrap();
        let got = writer.await.unwrap();
        assert_eq!(
            got.expect_err("granted on a gate that had run out").kind(),
            ErrorKind::Lost
        );
    }

    #[tokio::test]
    async fn a_wait_too_long_is_refused_not_a_panic() {
        let locker = Locker::memory();
        let rw = RwLock::new(&locker, "long").unwrap();
        let r = rw.try_read().await.unwrap().expect("reader");
        let opts = LockOptions::new().wait(Wait::For(Duration::MAX));
        assert_eq!(
            rw.write(&opts).await.expect_err("refused").kind(),
            ErrorKind::InvalidConfig
        );
        let sem = Semaphore::new(&locker, "long-sem", 1).unwrap();
        let p = sem.try_acquire().await.unwrap().expect("permit");
        assert_eq!(
            sem.acquire(&opts).await.expect_err("refused").kind(),
            ErrorKind::InvalidConfig
        );
        p.release().await.unwrap();
        r.release().await.unwrap();
    }
}
