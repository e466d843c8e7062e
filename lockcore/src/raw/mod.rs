//! What a backend author needs, and an application does not: the
//! [`Backend`] and [`BackendLease`] traits, the [`AcquireRequest`] a backend
//! answers, the clock and deadline helpers, server addresses, retry and
//! backoff.
//!
//! A backend maps acquire, renew and release onto its server and nothing
//! more: name and option validation, reentrancy, the watchdog, the lost
//! signal and the guard live in [`Locker`](crate::locker::Locker), once for all
//! backends. `tests/README.md` in the repository is the guide to writing
//! one, and the conformance suite checks it.
//!
//! Everything a backend crate uses, in one import:
//!
//! ```
//! use lockcore::raw::prelude::*;
//! ```

pub mod address;
mod backend;
pub mod batch;
pub(crate) mod held;
pub mod held_conn;
mod lease;
mod renewing;
mod request;
pub mod retry;
pub mod sync;
mod time;
mod waited;
pub(crate) mod watchdog;

pub use async_trait::async_trait;
pub use backend::Backend;
pub use lease::{AllOrNone, BackendLease, Grant, Released};
pub use renewing::{Answers, Renewal, Renewing};
pub use request::{AcquireRequest, Deadline, Mode, OwnerToken};
pub(crate) use time::drift_allowance;
pub use time::{now, validity_deadline, whole_seconds, within};
pub use waited::waiting;
pub(crate) use waited::watch;

/// What a backend crate needs, in one import:
/// `use lockcore::raw::prelude::*;`.
pub mod prelude {
    pub use async_trait::async_trait;
    pub use tokio_util::sync::CancellationToken;

    pub use super::{
        now, validity_deadline, waiting, whole_seconds, within, AcquireRequest, AllOrNone, Answers,
        Backend, BackendLease, Deadline, Grant, Mode, OwnerToken, Released, Renewal, Renewing,
    };
    pub use crate::capabilities::{Capabilities, Fencing, Layout, LeaseKind, LockDelay};
    pub use crate::cleanup::{spawn_cleanup, CleanupOnDrop};
    pub use crate::error::{Error, ErrorKind, Result};
    pub use crate::info::{HolderInfo, Listing, LockInfo, Role};
}
