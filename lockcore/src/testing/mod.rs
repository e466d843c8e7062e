//! Tools for testing a backend and an application: the history checker,
//! a seedable random number generator and, behind the `bench` feature, the
//! benchmark workloads.

#[cfg(feature = "bench")]
pub mod bench;
pub mod history;
pub mod rng;
