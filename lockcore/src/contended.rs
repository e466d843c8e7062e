//! Who holds a name, told to the caller who could not take it: the holder
//! on a timed-out acquisition's error, and a try that says who holds.

use std::time::Duration;

use crate::error::{ErrorKind, Result};
use crate::guard::LockGuard;
use crate::info::HolderInfo;
use crate::locker::Locker;

/// How long a timed-out acquisition asks who holds the name before it
/// returns without saying.
pub const HOLDER_LOOKUP: Duration = Duration::from_millis(500);

/// The outcome of [`Locker::try_lock_or_holder`].
#[derive(Debug)]
#[must_use = "an acquired lock is released as soon as the guard is dropped"]
pub enum Attempt {
    /// The name was free: it is held now.
    Acquired(LockGuard),
    /// Another owner held the name. Its holder as the backend told right
    /// after the try: `None` when the backend cannot tell, or when the
    /// holder had already let go by then.
    Held(Option<HolderInfo>),
}

impl Attempt {
    /// The guard, when acquired.
    pub fn guard(self) -> Option<LockGuard> {
        match self {
            Attempt::Acquired(g) => Some(g),
            Attempt::Held(_) => None,
        }
    }
}

impl Locker {
    /// One attempt, as [`try_lock`](Locker::try_lock); when the name is
    /// held, asks the backend who holds it ([`inspect`](Locker::inspect),
    /// one more round trip, bounded by [`HOLDER_LOOKUP`]). The two are not
    /// one request: the holder may have let go in between.
    ///
    /// ```
    /// use lockcore::{Attempt, Locker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// let locker = Locker::memory();
    /// let held = locker.lock("jobs/42").await?;
    /// match locker.try_lock_or_holder("jobs/42").await? {
    ///     Attempt::Acquired(_) => unreachable!("held above"),
    ///     Attempt::Held(h) => assert_eq!(h.and_then(|h| h.fence), held.fence()),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Locker::try_lock); a failed lookup of the holder is
    /// `Held(None)`, not an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`try_lock`](Locker::try_lock).
    pub async fn try_lock_or_holder(&self, name: &str) -> Result<Attempt> {
        Ok(match self.try_lock(name).await? {
            Some(g) => Attempt::Acquired(g),
            None => Attempt::Held(self.holder_of(name).await),
        })
    }

    /// `got`, an exclusive acquisition of `name`, with its holder on a
    /// timeout (what a caller of [`acquire`](Locker::acquire) gets; the
    /// primitives built on it, which make their own errors, do not ask).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn told_who_holds(
        &self,
        name: &str,
        got: Result<Option<LockGuard>>,
    ) -> Result<Option<LockGuard>> {
        match got {
            Err(e) if e.kind() == ErrorKind::Timeout => Err(match self.holder_of(name).await {
                Some(h) => e.with_holder(h),
                None => e,
            }),
            got => got,
        }
    }

    /// The holder of `name`, where the backend tells within
    /// [`HOLDER_LOOKUP`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn holder_of(&self, name: &str) -> Option<HolderInfo> {
        let info = tokio::time::timeout(HOLDER_LOOKUP, self.inspect(name)).await;
        info.ok()?.ok()??.holder
    }
}
