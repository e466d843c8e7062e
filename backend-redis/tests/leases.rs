//! Held leases on one Redis instance and on RedLock's masters (servers
//! from compose/): the renewals of many locks share script calls, and each
//! lock still gets its own key's answer.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::Duration;

use harness::{admin, script_calls, servers};
use lockcore::LockGuard;
use lockcore_conformance::cases::{hold_all, must_be_held};
use lockcore_conformance::{own_cases, run_serial, ConnectFuture, Ctx, Target, UrlHarness};

/// `n` locks named `{prefix}/{i}` with `ttl`, taken at once.
async fn hold(ctx: &Ctx, prefix: &str, n: usize, ttl: Duration) -> Vec<LockGuard> {
    let names: Vec<String> = (0..n).map(|i| ctx.name(&format!("{prefix}/{i}"))).collect();
    hold_all(&ctx.locker().await, &names, ttl).await
}

/// 300 locks renewed for 4 s (every second) cost a few script calls on
/// the server (on each master, for RedLock), not one per lock and renewal.
async fn renewals_share_script_calls(ctx: Ctx) {
    let guards = hold(&ctx, "many", 300, Duration::from_secs(3)).await;
    let first = servers(&ctx.config).into_iter().next().expect("a server");
    let mut c = admin(&first).await;
    let before = script_calls(&mut c).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let calls = script_calls(&mut c).await - before;
    eprintln!(
        "FIGURES renewals_share_script_calls {}: script_calls_in_4s_for_300_locks={calls}",
        ctx.target
    );
    // Per renewal: 300 locks x 4 renewals = 1,200 calls.
    assert!(
        calls < 300,
        "{calls} script calls in 4 s of renewals of 300 locks"
    );
    let other = ctx.locker().await;
    for i in [0, 150, 299] {
        must_be_held(&other, &ctx.name(&format!("many/{i}"))).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

/// Locks whose renewals go in one call each get their own key's answer:
/// of 40 locks, the one whose key another owner took, the one whose key
/// was deleted and the one whose key became a list (on every master) are
/// lost within their ttl; the others stay held on the server.
async fn each_renewal_gets_its_own_answer(ctx: Ctx) {
    let ttl = Duration::from_secs(1);
    let guards = hold(&ctx, "own", 40, ttl).await;
    let key = |i: usize| lockcore_redis::lock_key("lock:", &ctx.name(&format!("own/{i}")));
    for server in servers(&ctx.config) {
        let mut c = admin(&server).await;
        let () = redis::cmd("SET")
            .arg(key(7))
            .arg("another owner")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut c)
            .await
            .expect("SET");
        let _: i64 = redis::cmd("DEL")
            .arg(key(21))
            .query_async(&mut c)
            .await
            .expect("DEL");
        let _: i64 = redis::cmd("DEL")
            .arg(key(33))
            .query_async(&mut c)
            .await
            .expect("DEL");
        let _: i64 = redis::cmd("RPUSH")
            .arg(key(33))
            .arg("not a lock")
            .query_async(&mut c)
            .await
            .expect("RPUSH");
    }
    for i in [7, 21, 33] {
        // Validity counts at most one ttl from the last renewal; a loaded
        // machine gets the same again.
        tokio::time::timeout(ttl * 3, guards[i].lost())
            .await
            .unwrap_or_else(|_| panic!("lock {i} was not lost"));
    }
    let other = ctx.locker().await;
    for (i, g) in guards.iter().enumerate() {
        if ![7, 21, 33].contains(&i) {
            assert!(g.is_held(), "lock {i} was lost with its neighbours");
            must_be_held(&other, &ctx.name(&format!("own/{i}"))).await;
        }
    }
    for server in servers(&ctx.config) {
        let mut c = admin(&server).await;
        let _: i64 = redis::cmd("DEL")
            .arg(key(7))
            .arg(key(33))
            .query_async(&mut c)
            .await
            .expect("DEL");
    }
    for (i, g) in guards.into_iter().enumerate() {
        if ![7, 21, 33].contains(&i) {
            g.release().await.expect("release");
        }
    }
}

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_redis::connect(&url).await })
}

fn main() -> std::process::ExitCode {
    let target = |name: &'static str, var: &'static str| {
        own_cases!(
            Target::new(name, Some(var), |url| async move {
                Ok(UrlHarness::shared(url, connect))
            })
            .only_own_cases(),
            renewals_share_script_calls,
            each_renewal_gets_its_own_answer,
        )
    };
    run_serial(vec![
        target("redis-leases", "LOCKTEST_REDIS_URL"),
        target("redlock-leases", "LOCKTEST_REDLOCK_URL"),
    ])
}
