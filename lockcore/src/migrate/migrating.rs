//! The migrating pair: its construction and the checks of a migration.

use std::sync::Arc;

use super::sides::{holder_of, sides_of, Sides};
use crate::error::{Error, Result};
use crate::raw::Backend;

/// The backend name of a [`Migrating`] pair in errors and logs.
pub const NAME: &str = "migrate";

/// A backend that holds every name on an old and a new backend at once
/// (see the [module docs](crate::migrate)).
#[derive(Debug, Clone)]
pub struct Migrating {
    pub(super) old: Arc<dyn Backend>,
    pub(super) new: Arc<dyn Backend>,
    pub(super) offset: u64,
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
    /// change](crate::migrate#fencing-across-the-change)).
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
    /// ([`ErrorKind::Unavailable`](crate::error::ErrorKind::Unavailable), say).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a probe is a lock like any other, released in the
    /// background if the future is dropped.
    pub async fn one_store(&self) -> Result<bool> {
        let old = crate::locker::Locker::from_arc(self.old.clone());
        let new = crate::locker::Locker::from_arc(self.new.clone());
        let opts = crate::options::LockOptions::new()
            .renew(false)
            .wait(crate::options::Wait::Try);
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
    /// [`ErrorKind::InvalidConfig`](crate::error::ErrorKind::InvalidConfig) for one
    /// store given twice, which would make every migrating client block
    /// each name against itself. A store that cannot be asked now (down,
    /// or an account that may not take locks) gives no verdict: a warning
    /// through `tracing`, and `Ok` (its locks report it when tried).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::error::ErrorKind::InvalidConfig) for
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
    /// [`ErrorKind::InvalidName`](crate::error::ErrorKind::InvalidName);
    /// [`ErrorKind::InvalidConfig`](crate::error::ErrorKind::InvalidConfig) when a
    /// backend cannot inspect; what either backend returns when it cannot
    /// be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn sides(&self, name: &str) -> Result<Sides> {
        crate::name::validate_name(NAME, name)?;
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
