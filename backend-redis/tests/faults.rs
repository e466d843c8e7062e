//! Redis-specific fault injection (servers from compose/, one case at a
//! time since they stop and start servers): RedLock with instances down, a
//! restart without persistence, and the replica-sync guard.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Wait};
use lockcore_conformance::{
    compose, run_serial, ConnectFuture, Ctx, Target, UndoOnDrop, UrlHarness,
};

fn redlock_hosts() -> Vec<String> {
    std::env::var("LOCKTEST_REDLOCK_URLS")
        .unwrap_or_default()
        .split(',')
        .map(|u| {
            u.trim()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

async fn raw_get(host: &str, key: &str) -> Option<String> {
    let client = redis::Client::open(format!("redis://{host}")).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut c)
        .await
        .expect("GET")
}

/// With two of five masters down RedLock still acquires; with three down it
/// fails cleanly, leaving nothing held on the two that live.
async fn redlock_majority_rules(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("majority");
    let _restart = UndoOnDrop::new("start", &["redlock-3", "redlock-4", "redlock-5"]);
    compose("kill", "redlock-4").await;
    compose("kill", "redlock-5").await;
    let g = l
        .try_lock(&name)
        .await
        .expect("3 of 5 answer")
        .expect("free");
    assert!(g.is_held());
    g.release().await.expect("release with two down");

    compose("kill", "redlock-3").await;
    let t = Instant::now();
    let err = l
        .try_lock(&name)
        .await
        .expect_err("2 of 5 cannot make a majority");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    let key = lockcore_redis::lock_key("lock:", &name);
    for host in &redlock_hosts()[..2] {
        assert_eq!(
            raw_get(host, &key).await,
            None,
            "a failed RedLock attempt left {key} on {host}"
        );
    }
}

/// A holder on one instance sees its lost signal when the instance restarts
/// without persistence (the lock key is gone, so renewal is refused).
async fn lost_after_restart_without_persistence(ctx: Ctx) {
    let host = redlock_hosts()[0].clone();
    let l = lockcore_redis::connect(&format!("redis://{host}"))
        .await
        .expect("connect");
    let name = ctx.name("restart");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .wait(Wait::Try);
    let g = l
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    let _restart = UndoOnDrop::new("start", &["redlock-1"]);
    compose("kill", "redlock-1").await;
    compose("start", "redlock-1").await;
    tokio::time::timeout(Duration::from_secs(3) + Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires after the instance lost its data");
    assert!(!g.is_held());
    assert!(g.lost_reason().is_some());
}

/// The replica-sync guard: an acquire succeeds while the replica confirms,
/// and is refused (and undone) while the replica is paused.
async fn replica_sync_guard(ctx: Ctx) {
    let base =
        std::env::var("LOCKTEST_REDIS_REPLICATED_URL").expect("LOCKTEST_REDIS_REPLICATED_URL");
    let url = format!("{base}?sync_replicas=1&sync_timeout_ms=300");
    let l = lockcore_redis::connect(&url).await.expect("connect");
    let name = ctx.name("sync");
    let g = l
        .try_lock(&name)
        .await
        .expect("replica confirms")
        .expect("free");
    g.release().await.expect("release");

    let _resume = UndoOnDrop::new("resume", &["redis-replica"]);
    compose("pause", "redis-replica").await;
    let err = l
        .try_lock(&name)
        .await
        .expect_err("the paused replica cannot confirm");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("replicas"), "{err}");
    let host = base.trim_start_matches("redis://").trim_end_matches('/');
    assert_eq!(
        raw_get(host, &lockcore_redis::lock_key("lock:", &name)).await,
        None,
        "a refused acquire left the key held"
    );
}

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_redis::connect(&url).await })
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        Target::new(
            "redlock-faults",
            Some("LOCKTEST_REDLOCK_URLS"),
            |list| async move {
                let hosts: Vec<&str> = list
                    .split(',')
                    .map(|u| u.trim().trim_start_matches("redis://"))
                    .collect();
                Ok(UrlHarness::shared(
                    format!("redlock://{}", hosts.join(",")),
                    connect,
                ))
            },
        )
        .only_own_cases()
        .case("redlock_majority_rules", |ctx| {
            Box::pin(redlock_majority_rules(ctx))
        })
        .case("lost_after_restart_without_persistence", |ctx| {
            Box::pin(lost_after_restart_without_persistence(ctx))
        }),
        Target::new(
            "redis-replica",
            Some("LOCKTEST_REDIS_REPLICATED_URL"),
            |url| async move { Ok(UrlHarness::shared(url, connect)) },
        )
        .only_own_cases()
        .case("replica_sync_guard", |ctx| {
            Box::pin(replica_sync_guard(ctx))
        }),
    ])
}
