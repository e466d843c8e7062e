//! The conformance suite against one Redis instance, the three-master
//! cluster, a master behind three sentinels and RedLock over five masters
//! (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use lockcore_conformance::run;

fn main() -> std::process::ExitCode {
    #[allow(unused_mut)]
    let mut targets = vec![
        harness::target("redis", "LOCKTEST_REDIS_URL", false, "redis://127.0.0.1:1"),
        harness::target(
            "redis-cluster",
            "LOCKTEST_REDIS_CLUSTER_URL",
            true,
            "redis+cluster://127.0.0.1:1",
        ),
        harness::sentinel_target(
            "redis-sentinel",
            "LOCKTEST_REDIS_SENTINEL_URL",
            "redis+sentinel://127.0.0.1:1/lockcore",
        ),
        harness::target(
            "redlock",
            "LOCKTEST_REDLOCK_URL",
            false,
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        ),
    ];
    #[cfg(feature = "tls")]
    targets.push(harness::target(
        "redis-tls",
        "LOCKTEST_REDIS_TLS_URL",
        false,
        "rediss://127.0.0.1:1",
    ));
    run(targets)
}
