//! Moving a fleet from one backend to another without a moment of double
//! ownership: a backend that holds each name on two backends at once.
//!
//! [`Migrating`] takes a name on the *old* backend first, then on the *new*
//! one (always in that order, so two migrating clients cannot deadlock),
//! renews both through the guard's one watchdog, releases both, and fires
//! the lost signal when either lease is lost. Its fencing token is the new
//! backend's, plus a [fence offset](Migrating::fence_offset). Its
//! [`Capabilities`](crate::Capabilities) are the weaker of the two.
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
//! the migration (for Redis and MySQL, whose tokens are microseconds since
//! 1970, `1 << 52` lasts until 2112; for etcd, above the current
//! revision, with room), and keep the same offset on the
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

mod backend;
mod lease;
mod migrating;
mod offset;
mod sides;
#[cfg(test)]
mod tests;

pub use migrating::{Migrating, NAME};
pub use offset::OffsetFences;
pub use sides::Sides;
