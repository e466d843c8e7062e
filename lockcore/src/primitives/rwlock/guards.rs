//! The guards of a held read or write lock.

use std::future::Future;
use std::time::Instant;

use futures_util::future::select_all;

use crate::error::Result;
use crate::guard::LockGuard;
use crate::primitives::semaphore::Permit;

/// A held read lock: a reader node of a native layout, or one reader slot
/// of the built one.
#[derive(Debug)]
#[must_use = "the read lock is released as soon as the guard is dropped"]
pub struct ReadGuard {
    pub(super) hold: ReadHold,
}

/// What a reader holds.
#[derive(Debug)]
pub(super) enum ReadHold {
    /// A reader slot of the built layout.
    Slot(Permit),
    /// A reader's hold on the name in the backend's own layout.
    Node(LockGuard),
}

impl ReadGuard {
    /// The reader's fencing token (see the [module docs](crate::rwlock)).
    pub fn fence(&self) -> Option<u64> {
        match &self.hold {
            ReadHold::Slot(p) => p.fence(),
            ReadHold::Node(g) => g.fence(),
        }
    }

    /// Whether the read lock is still held.
    pub fn is_held(&self) -> bool {
        match &self.hold {
            ReadHold::Slot(p) => p.is_held(),
            ReadHold::Node(g) => g.is_held(),
        }
    }

    /// Resolves when the read lock's lease is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        use futures_util::future::Either;
        match &self.hold {
            ReadHold::Slot(p) => Either::Left(p.lost()),
            ReadHold::Node(g) => Either::Right(g.lost()),
        }
    }

    /// The reader's lock guard, to hold the read lock as a lock.
    pub fn into_guard(self) -> LockGuard {
        match self.hold {
            ReadHold::Slot(p) => p.into_guard(),
            ReadHold::Node(g) => g,
        }
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
        match self.hold {
            ReadHold::Slot(p) => p.release().await,
            ReadHold::Node(g) => g.release().await,
        }
    }
}

/// A held write lock: the writer's hold on the name in a native layout, or
/// the writers' gate and every reader slot in the built one.
#[derive(Debug)]
#[must_use = "the write lock is released as soon as the guard is dropped"]
pub struct WriteGuard {
    pub(super) gate: LockGuard,
    pub(super) slots: Vec<LockGuard>,
}

impl WriteGuard {
    /// The writer's fencing token, strictly rising across writers (the
    /// gate's in the built layout; `None` where the backend has none).
    pub fn fence(&self) -> Option<u64> {
        self.gate.fence()
    }

    /// Whether every part of the write lock is still held.
    pub fn is_held(&self) -> bool {
        self.gate.is_held() && self.slots.iter().all(LockGuard::is_held)
    }

    /// The validity deadline of the write lock on this process's monotonic
    /// clock (the earliest of its parts'), while every part is held.
    pub fn valid_until(&self) -> Option<std::time::Instant> {
        std::iter::once(&self.gate)
            .chain(&self.slots)
            .map(LockGuard::valid_until)
            .try_fold(None, |soonest: Option<Instant>, v| {
                v.map(|v| Some(soonest.map_or(v, |s| s.min(v))))
            })
            .flatten()
    }

    /// Why the write lock was lost (the first lost part's reason), once it
    /// was.
    pub fn lost_reason(&self) -> Option<&'static str> {
        std::iter::once(&self.gate)
            .chain(&self.slots)
            .find_map(LockGuard::lost_reason)
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

    /// Lets the write lock go: the reader slots, then the gate (in a native
    /// layout, the one hold).
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
