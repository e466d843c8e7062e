//! Migration phases across processes, with real servers: old-only with
//! migrating clients, and migrating with new-only clients, contending for
//! a few names (workers killed and replaced now and then); the history of
//! every process shows no overlap. Redis → ZooKeeper, Redis → etcd and
//! Redis → PostgreSQL.
//! One case at a time: each starts its own worker processes.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockcore_conformance::{run_serial, Ctx, Soak};

mod migrating;

use migrating::{migrating, target, var, REDIS_ETCD, REDIS_POSTGRES, REDIS_ZK};

/// Soak workers of two kinds on one set of names; the history of every
/// process must show no overlap (tokens come from two backends, so only
/// overlaps are checked).
async fn mixed(ctx: Ctx, kinds: [&'static str; 2]) {
    let report = Soak {
        processes: 8,
        workers_of: kinds.iter().map(|k| (*k).to_owned()).collect(),
        client_faults: false,
        check_tokens: false,
        ..Soak::default()
    }
    .run(&ctx)
    .await;
    eprintln!("{} {kinds:?}: {report:?}", ctx.target);
    assert!(report.leases > 10, "too few leases to tell: {report:?}");
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        // Workers of the phases, by target name.
        target("old-redis", REDIS_ZK, || var("LOCKTEST_REDIS_URL")).only_own_cases(),
        target("new-zk", REDIS_ZK, || var("LOCKTEST_ZK_URL")).only_own_cases(),
        target("new-etcd", REDIS_ETCD, || var("LOCKTEST_ETCD_URL")).only_own_cases(),
        target("new-postgres", REDIS_POSTGRES, || {
            var("LOCKTEST_POSTGRES_URL")
        })
        .only_own_cases(),
        target("redis-zk", REDIS_ZK, || migrating("LOCKTEST_ZK_URL"))
            .only_own_cases()
            .case("old_only_with_migrating", |ctx| {
                Box::pin(mixed(ctx, ["old-redis", "redis-zk"]))
            })
            .case("migrating_with_new_only", |ctx| {
                Box::pin(mixed(ctx, ["redis-zk", "new-zk"]))
            }),
        target("redis-etcd", REDIS_ETCD, || migrating("LOCKTEST_ETCD_URL"))
            .only_own_cases()
            .case("old_only_with_migrating", |ctx| {
                Box::pin(mixed(ctx, ["old-redis", "redis-etcd"]))
            })
            .case("migrating_with_new_only", |ctx| {
                Box::pin(mixed(ctx, ["redis-etcd", "new-etcd"]))
            }),
        target("redis-postgres", REDIS_POSTGRES, || {
            migrating("LOCKTEST_POSTGRES_URL")
        })
        .only_own_cases()
        .case("old_only_with_migrating", |ctx| {
            Box::pin(mixed(ctx, ["old-redis", "redis-postgres"]))
        })
        .case("migrating_with_new_only", |ctx| {
            Box::pin(mixed(ctx, ["redis-postgres", "new-postgres"]))
        }),
    ])
}
