//! Distributed locks with pluggable backends.
//!
//! `lockcore` is the backend-neutral part: the [`Locker`] handle, lock
//! [options](LockOptions), the [`LockGuard`] with watchdog renewal, a lost
//! signal and a fencing token, the [`Error`] type, [`Capabilities`], the
//! [fencing gate](fencing) for guarded resources, the [history
//! checker](testing::history), and the [in-memory backend](memory), which is the
//! embedded default. Backends for Redis, ZooKeeper, etcd and MySQL live in
//! their own crates and implement [`raw::Backend`]; what only a backend
//! author needs is in [`raw`].
//!
//! The contract every backend meets (and the conformance suite checks):
//! mutual exclusion while a lease is valid, owner-checked renewal and
//! release, strictly rising fencing tokens where the backend
//! [can promise them](Fencing), a lost signal when the lease can no longer be
//! trusted, every acquisition its own owner (tasks sharing one [`Locker`]
//! exclude each other; reentrancy is explicit, through
//! [`LockGuard::reenter`]), and cancel-safe acquisition.
//!
//! **No safety property depends on the user keeping some other object
//! alive, or on a process staying alive.** A [`LockGuard`] alone keeps its
//! lease renewed or fires its lost signal, however long it outlives the
//! [`Locker`] it came from; a dropped acquisition or guard is undone on the
//! server by a task of its own (see [`cleanup`], and [`cleanup::flush`]
//! before a process exits); and a process that dies leaves a lease that the
//! server ends by its ttl, session or connection. Renewals of one lease run
//! one at a time, so a slow reply never overwrites a later one.
//!
//! ```
//! use std::time::Duration;
//! use lockcore::{Locker, LockOptions, Wait};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let locker = Locker::memory();
//!
//! // Wait up to 5 s for the lock; renew it while held.
//! let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Wait::For(Duration::from_secs(5)));
//! let guard = locker.acquire("migrations", &opts).await?.expect("waits, so never None");
//!
//! tokio::select! {
//!     _ = guard.lost() => eprintln!("lease lost: stop"),
//!     _ = async { /* the guarded work, writing with guard.fence() */ } => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub mod capabilities;
pub mod cleanup;
mod contended;
pub mod error;
pub mod fencing;
mod guard;
pub mod holdings;
mod info;
mod locker;
pub mod memory;
pub mod migrate;
mod multi;
pub mod name;
pub mod observe;
pub mod options;
mod primitives;
pub mod raw;
pub mod testing;

pub use capabilities::{Capabilities, Fencing, Layout, LeaseKind, LockDelay};
pub use contended::{Attempt, HOLDER_LOOKUP};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use guard::LockGuard;
pub use holdings::{HeldNames, Holdings, PermitHolder, WriterHolder};
pub use info::{HolderInfo, Listing, LockInfo, Role};
pub use locker::{Locker, DEADLINE_GRACE};
pub use multi::MultiGuard;
pub use name::{validate_name, MAX_NAME_BYTES};
pub use options::{LockOptions, Wait, DEFAULT_TTL, MAX_TTL, MIN_TTL};
pub use primitives::election::{self, Election, Leader, Leadership, Observer};
pub use primitives::rwlock::{self, ReadGuard, RwLock, WriteGuard};
pub use primitives::semaphore::{self, Permit, Semaphore};

// Guards and acquire futures are `Send` (and guards `'static`): they can move
// into spawned tasks. Checked at compile time.
#[allow(dead_code)]
fn _assert_send() {
    fn send<T: Send>(_: &T) {}
    fn send_static<T: Send + Sync + 'static>() {}
    send_static::<LockGuard>();
    send_static::<Locker>();
    send_static::<Error>();
    let l = Locker::memory();
    send(&l.lock("x"));
    send(&l.try_lock("x"));
    send(&l.acquire("x", &LockOptions::new()));
    send(&l.lock_timeout("x", std::time::Duration::from_secs(1)));
    send_static::<Leadership>();
    if let Ok(e) = Election::new(&l, "x") {
        send(&e.campaign("v"));
        send(&e.leader());
        send(&e.observe().changed());
    }
}

// Every guard and handle a user moves into `tokio::spawn` is `Send + Sync +
// 'static`: a change that breaks it fails to compile here, not in a user's
// code.
const _: fn() = || {
    fn movable<T: Send + Sync + 'static>() {}
    movable::<Locker>();
    movable::<LockGuard>();
    movable::<LockOptions>();
    movable::<Semaphore>();
    movable::<Permit>();
    movable::<RwLock>();
    movable::<ReadGuard>();
    movable::<WriteGuard>();
    movable::<Election>();
    movable::<Leadership>();
    movable::<Observer>();
    movable::<Error>();
    movable::<Holdings>();
};
