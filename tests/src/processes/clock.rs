//! The clock every worker process stamps its journal with, and the
//! variables that make a test binary a worker.

use std::time::{Duration, Instant};

/// The environment variable that turns a test binary into a worker: the
/// target's name.
pub const WORKER_VAR: &str = "LOCKTEST_WORKER";
pub(crate) const PLAN_VAR: &str = "LOCKTEST_WORKER_PLAN";

/// Nanoseconds on the machine's monotonic clock, the same in every process.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => {
            let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1_000_000_000).saturating_add(nanos)
        }
        Err(_) => 0,
    }
}

/// Converts between this process's `Instant`s and [`monotonic_ns`].
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    ns: u64,
    at: Instant,
}

impl Clock {
    /// The conversion as of now.
    pub fn now() -> Self {
        let at = lockcore::raw::now();
        Clock {
            ns: monotonic_ns(),
            at,
        }
    }

    /// `t` on the machine's clock.
    pub fn ns(&self, t: Instant) -> u64 {
        if t >= self.at {
            self.ns
                .saturating_add(u64::try_from((t - self.at).as_nanos()).unwrap_or(u64::MAX))
        } else {
            self.ns
                .saturating_sub(u64::try_from((self.at - t).as_nanos()).unwrap_or(u64::MAX))
        }
    }

    /// The machine's clock reading `ns` as an `Instant` of this process.
    pub fn instant(&self, ns: u64) -> Instant {
        if ns >= self.ns {
            self.at + Duration::from_nanos(ns - self.ns)
        } else {
            self.at
                .checked_sub(Duration::from_nanos(self.ns - ns))
                .unwrap_or(self.at)
        }
    }
}
