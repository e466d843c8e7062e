//! Tools for testing a backend and an application: the history checker
//! and, behind the `bench` feature, the benchmark workloads.

#[cfg(feature = "bench")]
pub mod bench;
pub mod history;
