//! Many client processes against one backend, under faults, and the history
//! checker over all of them.
//!
//! A [`Soak`] starts client processes (the test binary itself, run again in
//! worker mode: [`run`](crate::run) and [`run_serial`](crate::run_serial)
//! turn into a worker when `LOCKTEST_WORKER` is set), each contending for a
//! few names with tries, timed and unbounded waits, cancelled
//! acquisitions, holds that outlive their ttl, releases, drops and
//! abandons. Each worker faults its own client at random (its connections
//! blackholed, delayed or reset through its own [`Proxies`](crate::Proxies), its renewals
//! paused as by a GC pause), the soak kills and replaces whole workers, and
//! pauses servers. Every worker journals each lease as it is granted and as
//! it ends, stamped with the machine's monotonic clock (`CLOCK_MONOTONIC`,
//! shared by every process), so a killed worker's open leases are known too
//! (they end when it died). At the end the journals go through
//! [`lockcore::testing::history::check`]: no two valid leases on a name overlapped
//! and tokens rose. Then the harness reports what is left on the server
//! ([`crate::Harness::leftovers`]): nothing may be.

mod clock;
mod journal;
mod soak;
mod worker;

pub use clock::{monotonic_ns, Clock, WORKER_VAR};
pub use soak::{soak_pausing, ServerFault, Soak, SoakReport};
pub(crate) use worker::worker;
