//! What the server holds on a name, whichever primitive holds it (a lock or
//! an election's leadership, a semaphore's permits, a read-write lock's
//! readers and writer), and the names held under a prefix: what `distlock
//! inspect` and `distlock ls` show.
//!
//! In the built layout a primitive is made of ordinary locks with part
//! names (see [`crate::primitives::semaphore`] and [`crate::primitives::rwlock`]): they are found by
//! listing the name's parts ([`Backend::list`](crate::raw::Backend::list)) and inspected one by one.
//! In a backend's own layout ([`Layout::Native`]) the backend tells the
//! holders itself ([`Backend::inspect_role`](crate::raw::Backend::inspect_role)). Each part is read at its own
//! instant: a report of several parts is not one snapshot.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! use lockcore::{Locker, Semaphore};
//!
//! let locker = Locker::memory();
//! let sem = Semaphore::new(&locker, "crawlers", 4)?;
//! let p = sem.try_acquire().await?.expect("free");
//! let h = locker.holdings("crawlers").await?;
//! assert_eq!(h.permits.len(), 1);
//! assert!(h.lock.is_none() && h.readers.is_empty() && h.writer.is_none());
//! let held = locker.held("craw", 10).await?.expect("memory lists");
//! assert_eq!(held.names[0].name, "crawlers");
//! p.release().await?;
//! # Ok(()) }
//! ```

use futures_util::future::try_join_all;

use crate::capabilities::Layout;
use crate::error::Result;
use crate::info::{HolderInfo, Role};
use crate::locker::Locker;
use crate::name::{validate_name, PART_SEPARATOR};
use crate::primitives::rwlock::{writer_slot_owner, MAX_READERS};
use crate::raw::OwnerToken;

/// How many part names [`Locker::holdings`] lists for one name at most.
const MAX_PARTS: usize = 4096;

/// A permit held of a semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The permit's slot in the built layout; `None` in a native one.
    pub slot: Option<u32>,
    /// Its holder.
    pub holder: HolderInfo,
}

/// The writer of a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriterHolder {
    /// Its holder (in the built layout, the holder of the writers' gate).
    pub holder: HolderInfo,
    /// Whether it writes now; `false` while it waits for the readers inside
    /// to leave (built layout: it holds the gate but not yet every reader
    /// slot; a reader passing the gate shows so for a moment).
    pub writing: bool,
}

/// What the server holds on one name, in every primitive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holdings {
    /// The name.
    pub name: String,
    /// The holder of the lock NAME: a plain lock's, or an election's leader
    /// (its [`value`](HolderInfo::value) is the leader's, its fence the
    /// term).
    pub lock: Option<HolderInfo>,
    /// Waiters for the lock NAME, where the backend can count them.
    pub waiters: Option<usize>,
    /// The permits held of the semaphore NAME.
    pub permits: Vec<PermitHolder>,
    /// The writer of the read-write lock NAME.
    pub writer: Option<WriterHolder>,
    /// The readers of the read-write lock NAME (in the built layout, the
    /// holders of its reader slots other than the writer, whose slots'
    /// owners derive from its gate's; a writer of an earlier version's
    /// slots show here).
    pub readers: Vec<HolderInfo>,
}

impl Holdings {
    /// Whether nothing is held on the name.
    pub fn is_free(&self) -> bool {
        self.lock.is_none()
            && self.permits.is_empty()
            && self.writer.is_none()
            && self.readers.is_empty()
    }
}

/// The name a part name belongs to (the name itself for a whole name).
fn base_of(name: &str) -> &str {
    name.split(PART_SEPARATOR).next().unwrap_or(name)
}

/// What [`Locker::held`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldNames {
    /// The names held, by name, each with what is held on it.
    pub names: Vec<Holdings>,
    /// Whether more names may be held than listed (the limit, or a bound
    /// of the backend's listing, ended it first).
    pub truncated: bool,
}

impl Locker {
    /// What the server holds on `name`: the lock (or election), the
    /// semaphore's permits and the read-write lock's readers and writer.
    ///
    /// On a backend that can neither list nor inspect, everything is
    /// reported free; [`Locker::capabilities`] and [`Locker::inspect`] tell.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`](crate::error::ErrorKind::InvalidName); the
    /// backend's [`ErrorKind::Unavailable`](crate::error::ErrorKind::Unavailable).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn holdings(&self, name: &str) -> Result<Holdings> {
        validate_name(self.backend_name(), name)?;
        self.read_holdings(name).await
    }

    /// The names held under `prefix` (at most `limit`), each with what
    /// [`Locker::holdings`] says of it, by name, and whether more may be
    /// held; `Ok(None)` when the backend cannot list. A name released
    /// between the listing and its inspection is left out.
    ///
    /// # Errors
    ///
    /// The backend's [`ErrorKind::Unavailable`](crate::error::ErrorKind::Unavailable).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn held(&self, prefix: &str, limit: usize) -> Result<Option<HeldNames>> {
        // A built primitive's parts are listed one by one: ask for room for
        // a read-write lock's per name.
        let per_name = MAX_READERS as usize + 2;
        let asked = limit.saturating_mul(per_name).min(MAX_PARTS.max(limit));
        let Some(listing) = self.backend().list(prefix, asked).await? else {
            return Ok(None);
        };
        let bases: std::collections::BTreeSet<&str> =
            listing.names.iter().map(|n| base_of(n)).collect();
        let truncated = !listing.complete || bases.len() > limit;
        let mut names = Vec::new();
        for name in bases.into_iter().take(limit) {
            // Each name's parts are listed again, whole.
            let h = self.read_holdings(name).await?;
            if !h.is_free() {
                names.push(h);
            }
        }
        Ok(Some(HeldNames { names, truncated }))
    }

    /// The holdings of `name` (not validated: a listed name of another
    /// client may be one this library would not take).
    async fn read_holdings(&self, name: &str) -> Result<Holdings> {
        let parts = self
            .backend()
            .list(&format!("{name}{PART_SEPARATOR}"), MAX_PARTS)
            .await
            .map_err(|e| e.or_name(name))?
            .map(|l| l.names)
            .unwrap_or_default()
            .into_iter()
            .filter(|n| base_of(n) == name && n != name)
            .collect::<Vec<_>>();
        self.holdings_of(name, &parts).await
    }

    /// The holdings of `name` whose built-layout parts are `parts`.
    async fn holdings_of(&self, name: &str, parts: &[String]) -> Result<Holdings> {
        let backend = self.backend();
        let caps = backend.capabilities();
        let in_part = |e: crate::error::Error| e.or_name(name);
        let info = backend.inspect(name).await.map_err(in_part)?;
        let mut h = Holdings {
            name: name.to_owned(),
            lock: info.as_ref().and_then(|i| i.holder.clone()),
            waiters: info.and_then(|i| i.waiters),
            ..Holdings::default()
        };
        // Every listed part, inspected: (part, holder).
        let read = try_join_all(parts.iter().map(|p| async move {
            let holder = backend.inspect(p).await?.and_then(|i| i.holder);
            Ok::<_, crate::error::Error>((p.as_str(), holder))
        }))
        .await
        .map_err(in_part)?;
        let suffix = |p: &str, tail: &str| {
            p.strip_prefix(name)
                .and_then(|r| r.strip_prefix(PART_SEPARATOR))
                .and_then(|r| r.strip_prefix(tail))
                .and_then(|n| n.parse::<u32>().ok())
        };
        let read_slot = format!("read{PART_SEPARATOR}permit-");
        let gate = format!("{name}{PART_SEPARATOR}write");
        let mut gate_holder = None;
        let mut slots = Vec::new();
        for (part, holder) in read {
            let Some(holder) = holder else { continue };
            if let Some(slot) = suffix(part, "permit-") {
                h.permits.push(PermitHolder {
                    slot: Some(slot),
                    holder,
                });
            } else if let Some(slot) = suffix(part, &read_slot) {
                slots.push((slot, holder));
            } else if part == gate {
                gate_holder = Some(holder);
            }
        }
        h.permits.sort_by_key(|p| p.slot);
        // A writer's slots are held by owners derived from its gate's.
        let gate_owner = gate_holder
            .as_ref()
            .and_then(|g| g.owner.as_deref())
            .filter(|o| o.len() == 32)
            .and_then(|o| u128::from_str_radix(o, 16).ok())
            .map(OwnerToken::from_u128);
        let mut writers_slots = 0;
        for (slot, holder) in slots {
            let writers = gate_owner.is_some_and(|g| {
                holder.owner.as_deref() == Some(&writer_slot_owner(g, slot).to_string())
            });
            if writers {
                writers_slots += 1;
            } else {
                h.readers.push(holder);
            }
        }
        if let Some(holder) = gate_holder {
            h.writer = Some(WriterHolder {
                holder,
                writing: writers_slots >= MAX_READERS,
            });
        }
        if caps.semaphore_layout == Layout::Native {
            if let Some(permits) = backend
                .inspect_role(name, Role::Permit)
                .await
                .map_err(in_part)?
            {
                h.permits.extend(
                    permits
                        .into_iter()
                        .map(|holder| PermitHolder { slot: None, holder }),
                );
            }
        }
        if caps.rw_layout == Layout::Native {
            if let Some(readers) = backend
                .inspect_role(name, Role::Reader)
                .await
                .map_err(in_part)?
            {
                h.readers.extend(readers);
            }
            if let Some(writer) = backend
                .inspect_role(name, Role::Writer)
                .await
                .map_err(in_part)?
                .and_then(|w| w.into_iter().next())
            {
                h.writer = Some(WriterHolder {
                    holder: writer,
                    writing: true,
                });
            }
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::primitives::rwlock::RwLock;
    use crate::primitives::semaphore::Semaphore;

    #[tokio::test]
    async fn every_primitive_on_a_name_is_reported() {
        let locker = Locker::memory();
        assert!(locker.holdings("h").await.unwrap().is_free());
        let g = locker.try_lock("h").await.unwrap().unwrap();
        let sem = Semaphore::new(&locker, "h", 3).unwrap();
        let (p1, p2) = (
            sem.try_acquire().await.unwrap().unwrap(),
            sem.try_acquire().await.unwrap().unwrap(),
        );
        let rw = RwLock::new(&locker, "h").unwrap();
        let r = rw.try_read().await.unwrap().unwrap();
        let h = locker.holdings("h").await.unwrap();
        assert_eq!(h.lock.as_ref().and_then(|l| l.fence), g.fence());
        assert_eq!(h.permits.len(), 2);
        assert_eq!(h.readers.len(), 1);
        assert!(h.writer.is_none());
        r.release().await.unwrap();
        let w = rw.try_write().await.unwrap().unwrap();
        let h = locker.holdings("h").await.unwrap();
        let writer = h.writer.expect("a writer");
        assert!(writer.writing && h.readers.is_empty());
        assert_eq!(writer.holder.fence, w.fence());
        assert!(h.lock.unwrap().since.is_some());
        let listed = locker.held("", 10).await.unwrap().unwrap();
        assert_eq!(listed.names.len(), 1, "{listed:?}");
        assert!(!listed.truncated);
        for x in [p1, p2] {
            x.release().await.unwrap();
        }
        w.release().await.unwrap();
        g.release().await.unwrap();
        assert!(locker.holdings("h").await.unwrap().is_free());
        assert!(locker
            .held("h", 10)
            .await
            .unwrap()
            .unwrap()
            .names
            .is_empty());
    }
}

#[cfg(test)]
mod writer_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use crate::locker::Locker;
    use crate::options::{LockOptions, Wait};
    use crate::primitives::rwlock::RwLock;

    /// A writer that waits for a reader inside holds the slots it took:
    /// they are its, not readers', and it is not writing yet.
    #[tokio::test]
    async fn a_waiting_writer_is_told_from_the_reader_inside() {
        let locker = Locker::memory();
        let rw = RwLock::new(&locker, "w").unwrap();
        let reader = rw.try_read().await.unwrap().unwrap();
        let writer = {
            let rw = rw.clone();
            tokio::spawn(async move {
                rw.write(&LockOptions::new().wait(Wait::For(Duration::from_secs(20))))
                    .await
            })
        };
        // The writer holds the gate once it waits.
        let h = loop {
            let h = locker.holdings("w").await.unwrap();
            if h.writer.is_some() {
                break h;
            }
            tokio::task::yield_now().await;
        };
        assert!(!h.writer.unwrap().writing, "writing beside a reader");
        assert_eq!(h.readers.len(), 1, "the writer's slots shown as readers");
        reader.release().await.unwrap();
        let w = writer.await.unwrap().unwrap().unwrap();
        let h = locker.holdings("w").await.unwrap();
        assert!(
            h.writer.as_ref().unwrap().writing && h.readers.is_empty(),
            "{h:?}"
        );
        w.release().await.unwrap();
    }
}
