//! The conformance suite against one etcd member and the three-member
//! cluster (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use lockcore_conformance::run;

fn main() -> std::process::ExitCode {
    run(vec![
        harness::target("etcd", "LOCKTEST_ETCD_URL"),
        harness::target("etcd-cluster", "LOCKTEST_ETCD_CLUSTER_URL"),
    ])
}
