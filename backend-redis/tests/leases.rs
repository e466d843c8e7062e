//! Held leases on one Redis instance and on RedLock's masters (servers
//! from compose/): the renewals of many locks share script calls, and each
//! lock still gets its own key's answer.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::Duration;

use harness::{admin, script_calls, servers};
use lockcore::{LockGuard, LockOptions, Wait};
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

/// Locks whose renewals go in one call each get their own key's answer,
/// across calls too (600 locks, more than one call takes): the locks whose
/// key another owner took, whose key was deleted, and whose key became a
/// list (on every master), one on each side of a call's 256 keys, are lost
/// within their ttl, and the other owner's key is left as it was; the
/// others stay held on the server.
async fn each_renewal_gets_its_own_answer(ctx: Ctx) {
    const TAKEN: [usize; 2] = [7, 300];
    const DELETED: [usize; 2] = [21, 590];
    const LISTS: [usize; 2] = [33, 257];
    let bad: Vec<usize> = [TAKEN, DELETED, LISTS].concat();
    let ttl = Duration::from_secs(1);
    let guards = hold(&ctx, "own", 600, ttl).await;
    let key = |i: usize| lockcore_redis::lock_key("lock:", &ctx.name(&format!("own/{i}")));
    for server in servers(&ctx.config) {
        let mut c = admin(&server).await;
        let mut pipe = redis::pipe();
        // One transaction: no renewal sees a key gone halfway (RedLock
        // would take it back).
        pipe.atomic();
        for i in TAKEN {
            pipe.cmd("SET")
                .arg(key(i))
                .arg("another owner")
                .arg("PX")
                .arg(30_000)
                .ignore();
        }
        for i in DELETED.into_iter().chain(LISTS) {
            pipe.cmd("DEL").arg(key(i)).ignore();
        }
        for i in LISTS {
            pipe.cmd("RPUSH").arg(key(i)).arg("not a lock").ignore();
        }
        let () = pipe.query_async(&mut c).await.expect("MULTI");
    }
    for &i in &bad {
        // Validity counts at most one ttl from the last renewal; a loaded
        // machine gets the same again.
        tokio::time::timeout(ttl * 3, guards[i].lost())
            .await
            .unwrap_or_else(|_| panic!("lock {i} was not lost"));
    }
    let other = ctx.locker().await;
    for (i, g) in guards.iter().enumerate() {
        if !bad.contains(&i) {
            assert!(g.is_held(), "lock {i} was lost with its neighbours");
        }
    }
    for i in [0, 8, 256, 299, 301, 599] {
        must_be_held(&other, &ctx.name(&format!("own/{i}"))).await;
    }
    for server in servers(&ctx.config) {
        let mut c = admin(&server).await;
        for i in TAKEN {
            let pttl: i64 = redis::cmd("PTTL")
                .arg(key(i))
                .query_async(&mut c)
                .await
                .expect("PTTL");
            // Set to 30 s; a renewal of ours would have set it to 1 s.
            assert!(
                pttl > 20_000,
                "another owner's key {i} was renewed: pttl {pttl} ms"
            );
        }
        let _: i64 = redis::cmd("DEL")
            .arg(TAKEN.into_iter().chain(LISTS).map(key).collect::<Vec<_>>())
            .query_async(&mut c)
            .await
            .expect("DEL");
    }
    for (i, g) in guards.into_iter().enumerate() {
        if !bad.contains(&i) {
            g.release().await.expect("release");
        }
    }
}

/// A `redis://` URL that names one node of a cluster: the node refuses the
/// keys of several slots in one script call (CROSSSLOT), so the renewals
/// go one to a call from then on, and the locks on that node's slots stay
/// held (the names of other slots are refused there, `MOVED`).
async fn renewals_on_a_cluster_node_go_one_each(ctx: Ctx) {
    let node = servers(&ctx.config).into_iter().next().expect("a node");
    let l = lockcore_redis::connect(&node).await.expect("connect");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let mut held = Vec::new();
    for i in 0..400 {
        let name = ctx.name(&format!("node/{i}"));
        if let Ok(Some(g)) = l.acquire(&name, &opts).await {
            held.push((name, g));
        }
        if held.len() == 20 {
            break;
        }
    }
    assert_eq!(held.len(), 20, "20 names on the node's slots");
    // Renewals asked at once, which go in one call first.
    let extending = held.iter().map(|(_, g)| g.extend(Duration::from_secs(2)));
    for (r, (name, _)) in futures_util::future::join_all(extending)
        .await
        .iter()
        .zip(&held)
    {
        assert!(r.is_ok(), "extending {name}: {r:?}");
    }
    // Three ttls of renewals.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let other = lockcore_redis::connect(&node).await.expect("connect");
    for (name, g) in &held {
        assert!(g.is_held(), "{name} was lost");
        must_be_held(&other, name).await;
    }
    for (_, g) in held {
        g.release().await.expect("release");
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
        own_cases!(
            Target::new(
                "redis-cluster-node-leases",
                Some("LOCKTEST_REDIS_CLUSTER_URL"),
                |url| async move { Ok(UrlHarness::shared(url, connect)) },
            )
            .only_own_cases(),
            renewals_on_a_cluster_node_go_one_each,
        ),
    ])
}
