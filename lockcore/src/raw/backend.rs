//! The trait a lock server implements.

use std::fmt;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::info::{HolderInfo, Listing, LockInfo, Role};
use crate::raw::lease::{AllOrNone, Grant};
use crate::raw::request::AcquireRequest;

/// A lock server, as the library sees it.
///
/// Implementations are object-safe so a [`Locker`](crate::locker::Locker) holds an
/// `Arc<dyn Backend>`. A backend needs only map its server: every
/// backend-neutral rule (validation, reentrancy, renewal, lost signal) is
/// applied by the `Locker` before and after these calls.
#[async_trait]
pub trait Backend: std::any::Any + Send + Sync + fmt::Debug {
    /// A short name for errors and logs, e.g. `"redis"`.
    fn name(&self) -> &'static str;

    /// What this backend can promise.
    fn capabilities(&self) -> Capabilities;

    /// Acquires `req.name` for `req.owner`, waiting until `req.deadline`.
    ///
    /// Returns `Ok(None)` when the name is still held at the deadline
    /// (at once for [`Deadline::Now`](crate::raw::Deadline::Now)).
    ///
    /// # Cancel safety
    ///
    /// Implementations must be cancel safe: when the returned future is
    /// dropped at any await point, nothing stays behind on the server (no
    /// lease, no queue entry, no open transaction) after at most one cleanup
    /// round trip, which may run in the background
    /// (see [`crate::cleanup`]).
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>>;

    /// Takes every one of `reqs` in one request to the server, all or
    /// none, without waiting: the uncontended path of
    /// [`Locker::acquire_all`](crate::Locker::acquire_all). The requests
    /// are exclusive locks of distinct names, in name order, without a
    /// value, each with [`Deadline::Now`](crate::raw::Deadline::Now) and an
    /// owner and lost signal of its own. [`AllOrNone::Granted`] has one
    /// grant per request, in their order; [`AllOrNone::Held`] means some
    /// name is held and nothing was taken. The default is
    /// [`AllOrNone::Unsupported`]: the `Locker` then takes the names one by
    /// one, which every backend can.
    ///
    /// # Cancel safety
    ///
    /// Implementations must be cancel safe as [`Backend::acquire`] is: a
    /// dropped call leaves none of the names taken after at most one
    /// cleanup round trip.
    async fn try_acquire_all(&self, reqs: &[AcquireRequest<'_>]) -> Result<AllOrNone> {
        let _ = reqs;
        Ok(AllOrNone::Unsupported)
    }

    /// What the server can tell about `name`, or `Ok(None)` when the backend
    /// cannot inspect.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let _ = name;
        Ok(None)
    }

    /// The names held on the server that start with `prefix`, at most
    /// `limit` of them, in no particular order, and whether that is all of
    /// them; `Ok(None)` when the backend cannot list.
    ///
    /// Names are as [`Backend::acquire`] took them: a lock's or an
    /// election's name, each part of a primitive in the built layout by its
    /// part name (`S␟permit-0003`, `L␟write`, see
    /// [`crate::name::is_part_name`]), and once the name of a semaphore or
    /// read-write lock in the backend's own layout ([`Layout::Native`](crate::capabilities::Layout)).
    /// A name may be listed that is free by the time it is inspected (a
    /// release in between), or that only waiters queue on.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let _ = (prefix, limit);
        Ok(None)
    }

    /// Every holder of `name` in `role` of this backend's own layout of a
    /// semaphore or read-write lock ([`Layout::Native`](crate::capabilities::Layout)),
    /// in their queue order where there is one, or `Ok(None)` where the
    /// backend has no such layout or cannot tell.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        let _ = (name, role);
        Ok(None)
    }
}
