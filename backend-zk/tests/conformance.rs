//! The conformance suite against one ZooKeeper server and the three-server
//! ensemble (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use lockcore_conformance::run;

fn main() -> std::process::ExitCode {
    run(vec![
        harness::target("zk", "LOCKTEST_ZK_URL"),
        harness::target("zk-ensemble", "LOCKTEST_ZK_ENSEMBLE_URL"),
    ])
}
