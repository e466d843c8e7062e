//! Redis-specific fault injection (servers from compose/, one case at a
//! time since they stop and start servers): RedLock with instances down or
//! silent, a restart without persistence, and the pub/sub wake-up
//! connection going half-open. Replicas, the replica-sync guard and
//! Sentinel's failovers are in `failover.rs`.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use harness::{admin, numsub, raw_get, script_calls, until};

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Locker, Wait};
use lockcore_conformance::own_cases;
use lockcore_conformance::{
    compose, run_serial, soak_pausing, ConnectFuture, Ctx, Dir, Proxies, Target, UndoOnDrop,
    UrlHarness, COMPOSE_HINT,
};

/// `host:port` of each RedLock master.
fn redlock_hosts() -> Vec<String> {
    let url = std::env::var("LOCKTEST_REDLOCK_URL").unwrap_or_default();
    lockcore::raw::address::ServerUrl::parse(&url, 6379)
        .map(|u| u.hosts.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

/// Sets `key` to `value` on the server at `host` for 30 s, as another
/// client would.
async fn set_on(host: &str, key: &str, value: &[u8]) {
    let mut c = admin(&format!("redis://{host}")).await;
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(30_000)
        .query_async(&mut c)
        .await
        .expect("SET");
}

/// Deletes `key` on the server at `host`.
async fn del_on(host: &str, key: &str) {
    let mut c = admin(&format!("redis://{host}")).await;
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut c)
        .await
        .expect("DEL");
}

/// Tries a fresh name until the client works again after a network fault.
async fn until_recovered(l: &Locker, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Ok(Some(g))) =
            tokio::time::timeout(Duration::from_secs(5), l.try_lock(name)).await
        {
            g.release().await.expect("release");
            return;
        }
        assert!(Instant::now() < deadline, "the client never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pub/sub connection that carries wake-ups goes half-open (every
/// packet silently dropped): afterwards, a new waiter's subscription reaches
/// the server. Then the server closes it under that waiter: the waiting
/// subscription is renewed on a new connection (both checked with `PUBSUB
/// NUMSUB` on the server), and a release wakes the waiter by a push, not by
/// a poll.
async fn pubsub_recovers_from_a_dead_connection(ctx: Ctx) {
    let url = ctx.config.clone();
    let proxies = Proxies::new();
    let routed = proxies.route_url(&url, 6379).await.expect("proxy");
    let l = lockcore_redis::connect(&routed).await.expect("connect");
    let holder = lockcore_redis::connect(&url).await.expect("connect");
    let channel = |n: &str| format!("{}:released", lockcore_redis::lock_key("lock:", n));

    // A wake-up over the pub/sub connection, so that it exists.
    let x = ctx.name("pubsub/x");
    let g = holder.try_lock(&x).await.expect("try").expect("free");
    let waiter = {
        let (l, x) = (l.clone(), x.clone());
        tokio::spawn(async move { l.lock(&x).await.expect("waiter").release().await })
    };
    until("the waiter subscribed", Duration::from_secs(10), || async {
        numsub(&url, &channel(&x)).await >= 1
    })
    .await;
    g.release().await.expect("release");
    waiter.await.expect("waiter").expect("release");

    // Every connection of the client goes silent, then the network heals.
    proxies.blackhole(Dir::Both);
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxies.heal();
    until_recovered(&l, &ctx.name("pubsub/recovered")).await;

    // A new waiter's subscription must reach the server.
    let y = ctx.name("pubsub/y");
    let g = holder.try_lock(&y).await.expect("try").expect("free");
    let waiter = {
        let (l, y) = (l.clone(), y.clone());
        tokio::spawn(async move {
            let g = l.lock(&y).await.expect("waiter");
            let at = Instant::now();
            g.release().await.expect("release");
            at
        })
    };
    until(
        "a new subscription after the dead connection reached the server",
        Duration::from_secs(10),
        || async { numsub(&url, &channel(&y)).await >= 1 },
    )
    .await;

    // The server closes every pub/sub connection under the waiting
    // subscription: it must be renewed on a new connection.
    let mut admin = admin(&url).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .expect("CLIENT KILL TYPE pubsub");
    assert!(killed >= 1, "no pub/sub connection to close");
    until(
        "the waiting subscription was renewed on a new connection",
        Duration::from_secs(10),
        || async { numsub(&url, &channel(&y)).await >= 1 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    g.release().await.expect("release");
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got the lock")
        .expect("waiter task");
    let wake = got.saturating_duration_since(released);
    assert!(
        wake < Duration::from_secs(1),
        "the waiter was woken {wake:?} after the release: by a poll, not a push"
    );
}

/// A RedLock release that no instance answers is not a lost lease: it fails
/// with `Unavailable` or `Indeterminate` (the keys end by their ttl), and
/// the lost signal does not fire.
async fn redlock_release_unanswered_is_not_lost(ctx: Ctx) {
    let proxies = Proxies::new();
    let routed = proxies
        .route_url(&format!("redlock://{}", redlock_hosts().join(",")), 6379)
        .await
        .expect("proxy");
    let l = lockcore_redis::connect(&routed).await.expect("connect");
    let name = ctx.name("release-unanswered");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::Try);
    let g = l
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    let lost = g.lost_token();
    proxies.blackhole(Dir::Both);
    let err = tokio::time::timeout(Duration::from_secs(10), g.release())
        .await
        .expect("release hung")
        .expect_err("no instance answered the release");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Unavailable | ErrorKind::Indeterminate
        ),
        "{err}"
    );
    assert!(
        !lost.is_cancelled(),
        "the lost signal fired for an unanswered release"
    );
    // Clean up on the servers.
    for host in redlock_hosts() {
        let mut c = admin(&format!("redis://{host}")).await;
        let _: i64 = redis::cmd("DEL")
            .arg(lockcore_redis::lock_key("lock:", &name))
            .query_async(&mut c)
            .await
            .expect("DEL");
    }
}

/// A RedLock acquire returns once a majority granted, and a release once a
/// majority released; the calls still out finish in the background. So the
/// key reaches every instance after an acquire and leaves every one after a
/// release, proven on each server, also when every instance has forgotten
/// the release script (`SCRIPT FLUSH`) and must be sent it again.
async fn redlock_calls_reach_every_instance(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("every-instance");
    let key = lockcore_redis::lock_key("lock:", &name);
    let hosts = redlock_hosts();
    let on_all = |present: bool| {
        let (hosts, key) = (hosts.clone(), key.clone());
        move || {
            let (hosts, key) = (hosts.clone(), key.clone());
            async move {
                for host in &hosts {
                    if raw_get(host, &key).await.is_some() != present {
                        return false;
                    }
                }
                true
            }
        }
    };
    for _ in 0..10 {
        let g = l.try_lock(&name).await.expect("acquire").expect("free");
        until(
            "the key on every instance",
            Duration::from_secs(5),
            on_all(true),
        )
        .await;
        for host in &hosts {
            let mut c = admin(&format!("redis://{host}")).await;
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut c)
                .await
                .expect("SCRIPT FLUSH");
        }
        g.release().await.expect("release");
        until(
            "the key gone from every instance",
            Duration::from_secs(5),
            on_all(false),
        )
        .await;
    }
}

/// Two acquisitions with one owner token (as `migrate:` makes, acquiring
/// again on its new backend after a pass was cut off) write different
/// tokens on the servers: an undo of one that comes late to an instance
/// never deletes the other's key.
async fn redlock_tokens_are_never_reused(ctx: Ctx) {
    use lockcore::raw::{AcquireRequest, Backend, Deadline, OwnerToken};
    let cfg = lockcore_redis::RedisConfig::parse(&ctx.config).expect("config");
    let b = lockcore_redis::RedLockBackend::connect(cfg)
        .await
        .expect("connect");
    let name = ctx.name("tokens");
    let key = lockcore_redis::lock_key("lock:", &name);
    let owner = OwnerToken::random();
    let lost = lockcore::raw::prelude::CancellationToken::new();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let g = b
            .acquire(AcquireRequest {
                name: &name,
                owner,
                ttl: Duration::from_secs(10),
                lock_delay: Duration::ZERO,
                deadline: Deadline::Now,
                lost: &lost,
                value: None,
                mode: lockcore::raw::Mode::Exclusive,
                renew: true,
            })
            .await
            .expect("acquire")
            .expect("free");
        let host = &redlock_hosts()[0];
        until(
            "the key on the first instance",
            Duration::from_secs(5),
            || async { raw_get(host, &key).await.is_some() },
        )
        .await;
        seen.push(raw_get(host, &key).await.expect("the key"));
        g.lease.release().await.expect("release");
    }
    assert_ne!(
        seen[0], seen[1],
        "one owner's two acquisitions wrote one token"
    );
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

/// One master listed twice, under two spellings (`127.0.0.1` and
/// `localhost`, or the same address twice), is refused at connect with
/// `InvalidConfig`: it would count twice toward the majority.
async fn redlock_one_master_twice_is_refused(_ctx: Ctx) {
    let hosts = redlock_hosts();
    let port = hosts[0].rsplit_once(':').expect("host:port").1;
    for url in [
        format!("redlock://{},localhost:{port},{}", hosts[0], hosts[1]),
        format!("redlock://{},{},{}", hosts[0], hosts[1], hosts[0]),
    ] {
        let e = lockcore_redis::connect(&url)
            .await
            .expect_err("a master listed twice was accepted");
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}: {e}");
        assert!(e.to_string().contains("twice"), "{e}");
    }
}

/// A release that a majority refuses (the lease was gone there: expired,
/// or the keys removed) reports the lease lost, even when one master still
/// had it and released it.
async fn redlock_release_refused_by_a_majority_is_lost(ctx: Ctx) {
    let l = ctx.locker().await;
    let hosts = redlock_hosts();
    let name = ctx.name("majority-refused");
    let key = lockcore_redis::lock_key("lock:", &name);
    let g = l
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(30))
                .renew(false)
                .wait(Wait::Try),
        )
        .await
        .expect("acquire")
        .expect("free");
    for host in &hosts[..3] {
        del_on(host, &key).await;
    }
    let e = g
        .release()
        .await
        .expect_err("a release refused by 3 of 5 masters reported success");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
}

/// The RedLock leader is the token a majority of masters hold, as the
/// masters themselves say: a key on two of five is no leader, on three it
/// is (with the value after its token); with two masters down the leader
/// is still named, with three down the answer is `Unavailable`, not "no
/// leader".
async fn redlock_leader_is_the_majority_holder(ctx: Ctx) {
    let l = ctx.locker().await;
    let hosts = redlock_hosts();
    assert_eq!(hosts.len(), 5, "five masters");
    let stray = ctx.name("stray");
    let key = lockcore_redis::lock_key("lock:", &stray);
    let election = lockcore::Election::new(&l, &stray).expect("election");
    for (n, host) in hosts.iter().enumerate() {
        set_on(host, &key, b"stray.1 host-x").await;
        let seen = election.leader().await.expect("leader");
        if n + 1 < 3 {
            assert_eq!(seen, None, "a key on {} of 5 named a leader", n + 1);
        } else {
            let seen = seen.expect("a key on a majority is the leader");
            assert_eq!((seen.value.as_str(), seen.term), ("host-x", None));
        }
    }
    for host in &hosts {
        del_on(host, &key).await;
    }
    assert_eq!(election.leader().await.expect("leader"), None);
    // Another client's token need not be UTF-8: it is a holder all the
    // same, not an instance that did not answer.
    for host in &hosts[..3] {
        set_on(host, &key, b"\xff\xfe").await;
    }
    let info = l.inspect(&stray).await.expect("inspect").expect("inspects");
    assert!(
        info.holder.is_some(),
        "a majority's binary token is no holder"
    );
    for host in &hosts {
        del_on(host, &key).await;
    }

    let name = ctx.name("majority-leader");
    let election = lockcore::Election::new(&l, &name).expect("election");
    let leading = election
        .try_campaign("host-a")
        .await
        .expect("campaign")
        .expect("no one leads");
    let _restart = UndoOnDrop::new("start", &["redlock-3", "redlock-4", "redlock-5"]);
    compose("kill", "redlock-4").await;
    compose("kill", "redlock-5").await;
    let seen = election
        .leader()
        .await
        .expect("3 of 5 answer")
        .expect("a leader");
    assert_eq!(seen.value, "host-a");
    compose("kill", "redlock-3").await;
    let err = election
        .leader()
        .await
        .expect_err("2 of 5 cannot say who leads");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    drop(leading);
}

/// A RedLock holder keeps its majority while its instances restart one
/// after another without persistence (redsync #149: extensions landed on a
/// minority after restarts, and the lock was lost or, worse, believed held):
/// a renewal takes the key again where an instance lost it, so after three
/// of five restarts the key is still on a majority, proven on the servers,
/// and another client cannot take the name.
async fn redlock_renewal_survives_restarts(ctx: Ctx) {
    let l = ctx.locker().await;
    let other = ctx.locker().await;
    let name = ctx.name("restarts");
    let ttl = Duration::from_secs(3);
    let g = l
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let hosts = redlock_hosts();
    let key = lockcore_redis::lock_key("lock:", &name);
    let _restart = UndoOnDrop::new("start", &["redlock-1", "redlock-2", "redlock-3"]);
    for (i, server) in ["redlock-1", "redlock-2", "redlock-3"].iter().enumerate() {
        compose("kill", server).await;
        compose("start", server).await;
        assert_eq!(
            raw_get(&hosts[i], &key).await,
            None,
            "{server} kept its data"
        );
        // Two renewals (every ttl/3) after the restart.
        tokio::time::sleep(ttl * 2 / 3 + Duration::from_millis(300)).await;
        assert!(
            g.is_held(),
            "lost after restarting {server}: {:?}",
            g.lost_reason()
        );
    }
    let mut holding = 0;
    for host in &hosts {
        if raw_get(host, &key).await.is_some() {
            holding += 1;
        }
    }
    assert!(holding >= 3, "the key is on {holding} of 5 instances");
    // The other client's connections to the restarted instances come back
    // in the background: until then it cannot make a majority either.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match other.try_lock(&name).await {
            Ok(Some(_)) => {
                panic!("another client took the name from a holder that believes it holds it")
            }
            Ok(None) => break,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the other client never got an answer: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    g.release().await.expect("release");
}

/// RedLock's known weakness, shown rather than assumed: a holder that got
/// its majority while two masters were down (keys on 1, 2, 3) loses its
/// key on master 3 when it restarts without persistence; another client
/// then takes masters 3, 4, 5, a majority, while the first still believes
/// it holds the lock, until its next renewal finds only two masters (its
/// lost signal fires then). Persistence with `appendfsync always`, or
/// delaying a restarted master's rejoin by the ttl, is what closes this;
/// RedLock has no fencing to fall back on.
async fn redlock_restart_without_persistence_can_double_grant(ctx: Ctx) {
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let name = ctx.name("weakness");
    let ttl = Duration::from_secs(6);
    let _restart = UndoOnDrop::new("start", &["redlock-3", "redlock-4", "redlock-5"]);
    compose("kill", "redlock-4").await;
    compose("kill", "redlock-5").await;
    // Renewed by hand below, so that no renewal lands between the restart
    // and B's acquisition (it would take master 3 back first).
    let g = a
        .acquire(
            &name,
            &LockOptions::new().ttl(ttl).wait(Wait::Try).renew(false),
        )
        .await
        .expect("3 of 5 answer")
        .expect("free");
    compose("start", "redlock-4").await;
    compose("start", "redlock-5").await;
    compose("kill", "redlock-3").await;
    compose("start", "redlock-3").await;
    let restarted = Instant::now();
    // B takes 3, 4 and 5 (its connections to them come back first).
    let deadline = Instant::now() + Duration::from_secs(10);
    let g2 = loop {
        match b.try_lock(&name).await {
            Ok(Some(g2)) => break g2,
            other => {
                assert!(Instant::now() < deadline, "B never got the name: {other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let second = restarted.elapsed();
    assert!(
        g.is_held() && g2.is_held(),
        "the weakness did not show: A held {}, B held {}",
        g.is_held(),
        g2.is_held()
    );
    eprintln!(
        "FIGURES redlock_restart_without_persistence redlock: second_holder_after_restart={}ms, both_believed_held=true",
        second.as_millis()
    );
    // A's next renewal finds its key on two masters only (or cannot reach
    // the restarted ones yet): it fails, and A's lease ends by its deadline.
    let err = g.extend(ttl).await.expect_err("a renewal on a minority");
    assert!(
        matches!(err.kind(), ErrorKind::Lost | ErrorKind::Unavailable),
        "{err}"
    );
    tokio::time::timeout(ttl, g.lost())
        .await
        .expect("A's lost signal");
    g2.release().await.expect("release");
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
    let killed = Instant::now();
    compose("start", "redlock-1").await;
    tokio::time::timeout(Duration::from_secs(3) + Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires after the instance lost its data");
    let lost_after = killed.elapsed();
    assert!(!g.is_held());
    assert!(g.lost_reason().is_some());
    // The counter went with the data; the next token is still larger.
    let before = g.fence().expect("a token");
    let next = l
        .acquire(&name, &opts)
        .await
        .expect("acquire after the restart")
        .expect("free after the restart");
    let after = next.fence().expect("a token");
    assert!(
        after > before,
        "the token after a restart without persistence fell: {before} then {after}"
    );
    println!(
        "FIGURES restart_without_persistence redis: lost_after_kill={}ms, next_token_larger=true",
        lost_after.as_millis()
    );
    next.release().await.expect("release");
}

/// Fencing counters do not pile up: a name's counter expires an hour after
/// its last acquisition (Redisson's token keys were never deleted), and the
/// tokens still rise strictly across many acquisitions.
async fn fence_counters_expire(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("counter");
    let mut last = 0;
    for _ in 0..50 {
        let g = l.try_lock(&name).await.expect("try").expect("free");
        let fence = g.fence().expect("a token");
        assert!(fence > last, "tokens did not rise: {last} then {fence}");
        last = fence;
        g.release().await.expect("release");
    }
    let key = format!("{}:fence", lockcore_redis::lock_key("lock:", &name));
    let mut c = admin(&ctx.config).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("PTTL");
    assert!(
        pttl > 0 && pttl <= 3_600_000,
        "the fencing counter {key} is kept for ever (PTTL {pttl})"
    );
}

/// A leader holding past the fencing counter's hour (its key gone, as it
/// is an hour after the last acquisition) is still named with its own
/// term, and renewing puts the counter back.
async fn leader_term_outlives_the_counter(ctx: Ctx) {
    let l = ctx.locker().await;
    let other = ctx.locker().await;
    let name = ctx.name("term");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let leading = lockcore::Election::new(&l, &name)
        .expect("election")
        .campaign_with("a", &opts)
        .await
        .expect("campaign")
        .expect("leads");
    let key = format!("{}:fence", lockcore_redis::lock_key("lock:", &name));
    let mut c = admin(&ctx.config).await;
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("DEL");
    let watcher = lockcore::Election::new(&other, &name).expect("election");
    let seen = watcher.leader().await.expect("leader").expect("a leader");
    assert_eq!(seen.term, leading.term(), "the leader's term as observed");
    let term = leading.term().expect("a term");
    let counter = |c: &redis::aio::MultiplexedConnection| {
        let (mut c, key) = (c.clone(), key.clone());
        async move {
            let v: Option<u64> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut c)
                .await
                .expect("GET");
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut c)
                .await
                .expect("PTTL");
            (v, pttl)
        }
    };
    // A renewal (every ttl/3) puts the counter back at the leader's term,
    // kept for the hour.
    until("the counter is back", Duration::from_secs(5), || async {
        counter(&c).await.0.is_some()
    })
    .await;
    let (v, pttl) = counter(&c).await;
    assert_eq!(v, Some(term), "the counter is the leader's term");
    assert!(pttl > 3_000_000, "kept for the hour, not {pttl} ms");
    // A counter above the term is never lowered by a renewal.
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(term + 1000)
        .query_async(&mut c)
        .await
        .expect("SET");
    tokio::time::sleep(Duration::from_millis(800)).await; // two renewals at ttl/3
    assert_eq!(
        counter(&c).await.0,
        Some(term + 1000),
        "a renewal lowered the counter"
    );
    // Something other than a string there does not cost the leadership.
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("DEL");
    let _: i64 = redis::cmd("HSET")
        .arg(&key)
        .arg("f")
        .arg("v")
        .query_async(&mut c)
        .await
        .expect("HSET");
    tokio::time::sleep(Duration::from_secs(2)).await; // twice the ttl
    assert!(
        leading.is_leader(),
        "renewals failed: {:?}",
        leading.guard().lost_reason()
    );
    must_be_held_here(&other, &name).await;
    let _: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut c)
        .await
        .expect("DEL");
    leading.resign().await.expect("resign");
}

/// Another client's `try` on `name` fails: it is held on the server.
async fn must_be_held_here(l: &Locker, name: &str) {
    assert!(
        l.try_lock(name).await.expect("try").is_none(),
        "{name} is not held"
    );
}

/// An acquire whose script fails after its `SET NX` applied (here: a
/// foreign value of another type where the fencing counter lives) is an
/// error and leaves no lock key behind: the name is not blocked for a ttl.
async fn failed_acquire_script_leaves_no_key(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("wrongtype");
    let lock = lockcore_redis::lock_key("lock:", &name);
    let fence = format!("{lock}:fence");
    let mut c = admin(&ctx.config).await;
    let _: i64 = redis::cmd("RPUSH")
        .arg(&fence)
        .arg("not a counter")
        .query_async(&mut c)
        .await
        .expect("RPUSH");
    let err = l.try_lock(&name).await.expect_err("the counter is a list");
    assert_eq!(err.kind(), lockcore::ErrorKind::Backend, "{err}");
    // The undo runs in the background: give it a moment, bounded.
    let exists = until_gone(&mut c, &[&lock]).await;
    let _: i64 = redis::cmd("DEL")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .expect("DEL");
    assert_eq!(exists, 0, "the failed acquire left {lock} behind");
}

/// How many of `keys` still exist once none does, or after 2 s.
async fn until_gone<K: redis::ToRedisArgs + Send + Sync>(
    c: &mut redis::aio::MultiplexedConnection,
    keys: &[K],
) -> i64 {
    let mut exists: i64 = 1;
    for _ in 0..100 {
        exists = redis::cmd("EXISTS")
            .arg(keys)
            .query_async(c)
            .await
            .expect("EXISTS");
        if exists == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    exists
}

/// A multi-name try on one instance is one script, taken or refused: the
/// names are taken in one round trip when all are free (each with its own
/// key, token and fencing token), and none is taken when one is held.
async fn multi_try_is_one_script(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let mut c = admin(&ctx.config).await;
    let names = [ctx.name("one/a"), ctx.name("one/b"), ctx.name("one/c")];
    // The script loaded (a first call may be refused with NOSCRIPT).
    a.try_lock_all(&[ctx.name("one/warm-1"), ctx.name("one/warm-2")])
        .await
        .expect("try all")
        .expect("free")
        .release()
        .await
        .expect("release");
    let before = script_calls(&mut c).await;
    let m = a
        .try_lock_all(&names)
        .await
        .expect("try all")
        .expect("free");
    assert_eq!(
        script_calls(&mut c).await - before,
        1,
        "a multi-name try of free names took more than one script"
    );
    for n in &names {
        must_be_held_here(&b, n).await;
    }
    let before = script_calls(&mut c).await;
    assert!(b.try_lock_all(&names).await.expect("try all").is_none());
    assert_eq!(
        script_calls(&mut c).await - before,
        1,
        "a refused multi-name try took more than one script"
    );
    m.release().await.expect("release");
}

/// A multi-name script that fails after it set some keys (a foreign value
/// of another type where the second name's fencing counter lives) is an
/// error and leaves no lock key of any name behind.
async fn failed_multi_script_leaves_no_key(ctx: Ctx) {
    let l = ctx.locker().await;
    let names = [ctx.name("multi-wrongtype/a"), ctx.name("multi-wrongtype/b")];
    let locks: Vec<String> = names
        .iter()
        .map(|n| lockcore_redis::lock_key("lock:", n))
        .collect();
    let fence = format!("{}:fence", locks[1]);
    let mut c = admin(&ctx.config).await;
    let _: i64 = redis::cmd("RPUSH")
        .arg(&fence)
        .arg("not a counter")
        .query_async(&mut c)
        .await
        .expect("RPUSH");
    let err = l
        .try_lock_all(&names)
        .await
        .expect_err("the second counter is a list");
    assert_eq!(err.kind(), lockcore::ErrorKind::Backend, "{err}");
    let left = until_gone(&mut c, &locks).await;
    let _: i64 = redis::cmd("DEL")
        .arg(&fence)
        .query_async(&mut c)
        .await
        .expect("DEL");
    assert_eq!(
        left, 0,
        "the failed multi-name acquire left lock keys behind"
    );
}

/// Renewals go to the server many to a script call: when the server has
/// forgotten the script (`SCRIPT FLUSH`, or a restart), the call loads it
/// again and the lease stays held, as seen on the server for three ttls.
async fn batched_renewals_load_their_script_again(ctx: Ctx) {
    let (l, other) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("renew-flushed");
    let key = lockcore_redis::lock_key("lock:", &name);
    let ttl = Duration::from_secs(1);
    let g = l
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let mut c = admin(&ctx.config).await;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .expect("SCRIPT FLUSH");
    // Time is the subject: without a renewal the key is gone after one ttl.
    let flushed = Instant::now();
    while flushed.elapsed() < 3 * ttl {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut c)
            .await
            .expect("EXISTS");
        assert_eq!(
            exists,
            1,
            "the lease's key went away {:?} after SCRIPT FLUSH",
            flushed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        other.try_lock(&name).await.expect("try").is_none(),
        "another client took the name"
    );
    g.release().await.expect("release");
}

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_redis::connect(&url).await })
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        harness::target(
            "redis-soak",
            "LOCKTEST_REDIS_URL",
            false,
            "redis://127.0.0.1:1",
        )
        .only_own_cases()
        .case("soak", |ctx| Box::pin(soak_pausing(ctx, "redis"))),
        harness::target(
            "redlock-soak",
            "LOCKTEST_REDLOCK_URL",
            false,
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        )
        .only_own_cases()
        .case("soak", |ctx| Box::pin(soak_pausing(ctx, "redlock-2"))),
        own_cases!(
            Target::new(
                "redlock-faults",
                Some("LOCKTEST_REDLOCK_URL"),
                |url| async move { Ok(UrlHarness::shared(url, connect)) },
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            redlock_calls_reach_every_instance,
            redlock_tokens_are_never_reused,
            redlock_majority_rules,
            redlock_one_master_twice_is_refused,
            redlock_release_refused_by_a_majority_is_lost,
            redlock_leader_is_the_majority_holder,
            redlock_renewal_survives_restarts,
            redlock_restart_without_persistence_can_double_grant,
            lost_after_restart_without_persistence,
            redlock_release_unanswered_is_not_lost,
        ),
        own_cases!(
            Target::new(
                "redis-faults",
                Some("LOCKTEST_REDIS_URL"),
                |url| async move { Ok(UrlHarness::shared(url, connect)) },
            )
            .only_own_cases(),
            pubsub_recovers_from_a_dead_connection,
            failed_acquire_script_leaves_no_key,
            multi_try_is_one_script,
            failed_multi_script_leaves_no_key,
            leader_term_outlives_the_counter,
            fence_counters_expire,
            batched_renewals_load_their_script_again,
        ),
    ])
}
