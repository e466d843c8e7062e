//! Replicas and failovers (servers from compose/, one case at a time since
//! they stop and start servers): the replica-sync guard on one instance
//! with a replica, on a cluster and behind Sentinel, and Sentinel's
//! failover under holders and waiters, with the guard and without it.
//!
//! Sentinel cases find the master by asking the sentinels (it moves with
//! each failover), cut replication by disabling the replicas' user on the
//! master (`ACL SETUSER replicator off`: every server stays up and
//! promotable), and leave the group healthy again: the killed server
//! restarted as a replica, every link up.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{admin, numsub, raw_get, sentinel_master, until};
use lockcore::testing::history::History;
use lockcore::{ErrorKind, LockOptions, Wait};
use lockcore_conformance::{
    compose, own_cases, run_serial, ConnectFuture, Ctx, Dir, Proxies, Target, UndoOnDrop,
    UrlHarness, COMPOSE_HINT,
};

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_redis::connect(&url).await })
}

fn key(name: &str) -> String {
    lockcore_redis::lock_key("lock:", name)
}

fn host_of(url: &str) -> &str {
    url.trim_start_matches("redis://").trim_end_matches('/')
}

/// `url` with `query` added to its options.
fn with(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

// ------------------------------------------------ one instance, a cluster --

/// The replica-sync guard: an acquire succeeds while the replica confirms,
/// and is refused (and undone) while the replica is paused.
async fn replica_sync_guard(ctx: Ctx) {
    let url = with(&ctx.config, "sync_replicas=1&sync_timeout_ms=300");
    let l = lockcore_redis::connect(&url).await.expect("connect");
    let name = ctx.name("sync");
    // The guard's pipeline loads its script where the server lacks it.
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin(&ctx.config).await)
        .await
        .expect("SCRIPT FLUSH");
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
    assert_eq!(
        raw_get(host_of(&ctx.config), &key(&name)).await,
        None,
        "a refused acquire left the key held"
    );
}

/// With the replica-sync guard, a renewal that no replica confirms does not
/// extend the lease: once the replica stops confirming (paused), the
/// holder's lost signal fires within the ttl of its last confirmed renewal,
/// while the master alone would have kept renewing it.
async fn unconfirmed_renewals_fire_lost(ctx: Ctx) {
    let url = with(&ctx.config, "sync_replicas=1&sync_timeout_ms=200");
    let l = lockcore_redis::connect(&url).await.expect("connect");
    let name = ctx.name("renew");
    let ttl = Duration::from_secs(2);
    let g = l
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let _resume = UndoOnDrop::new("resume", &["redis-replica"]);
    compose("pause", "redis-replica").await;
    let after = lost_unconfirmed(&g, ttl, host_of(&ctx.config), &name).await;
    compose("resume", "redis-replica").await;
    eprintln!(
        "FIGURES unconfirmed_renewals_fire_lost redis: lost_after_cut_ms={}",
        after.as_millis()
    );
    drop(g);
}

/// Waits for `g`'s lost signal after its replicas stopped confirming
/// (within its ttl and a margin) and checks why: its validity ran out
/// while the key stayed on the master at `host` (renewed there,
/// unconfirmed), not because the key went. Returns how long it took.
async fn lost_unconfirmed(
    g: &lockcore::LockGuard,
    ttl: Duration,
    host: &str,
    name: &str,
) -> Duration {
    let cut = Instant::now();
    let lost = tokio::time::timeout(ttl + Duration::from_secs(3), g.lost()).await;
    let after = cut.elapsed();
    let on_master = raw_get(host, &key(name)).await;
    assert!(
        lost.is_ok(),
        "the holder kept its lease {after:?} after its replicas stopped confirming renewals"
    );
    assert!(on_master.is_some(), "the key left the master");
    assert!(
        g.lost_reason().is_some_and(|r| r.contains("validity")),
        "lost for another reason: {:?}",
        g.lost_reason()
    );
    after
}

/// With the guard, an acquire that waits and whose grant no replica
/// confirms is undone and tried again: once the replica confirms (resumed
/// a second later) it is granted, rather than failing at the first refusal.
async fn a_waiting_acquire_outlasts_an_unconfirmed_grant(ctx: Ctx) {
    let url = with(&ctx.config, "sync_replicas=1&sync_timeout_ms=200");
    let l = lockcore_redis::connect(&url).await.expect("connect");
    let name = ctx.name("waits");
    let _resume = UndoOnDrop::new("resume", &["redis-replica"]);
    compose("pause", "redis-replica").await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            l.acquire(
                &name,
                &LockOptions::new().wait(Wait::For(Duration::from_secs(20))),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    compose("resume", "redis-replica").await;
    let g = waiting
        .await
        .expect("task")
        .expect("granted once the replica confirms")
        .expect("granted");
    assert!(raw_get(host_of(&ctx.config), &key(&name)).await.is_some());
    g.release().await.expect("release");
}

/// With the guard, a release that no replica confirms is an error (the
/// name may stay taken on a promoted replica until its ttl), and the key is
/// gone from the master all the same.
async fn unconfirmed_release_is_an_error(ctx: Ctx) {
    let url = with(&ctx.config, "sync_replicas=1&sync_timeout_ms=200");
    let l = lockcore_redis::connect(&url).await.expect("connect");
    let name = ctx.name("release");
    let g = l.try_lock(&name).await.expect("acquire").expect("free");
    let _resume = UndoOnDrop::new("resume", &["redis-replica"]);
    compose("pause", "redis-replica").await;
    let err = g
        .release()
        .await
        .expect_err("no replica confirms the release");
    compose("resume", "redis-replica").await;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("release"), "{err}");
    assert_eq!(raw_get(host_of(&ctx.config), &key(&name)).await, None);
}

/// The guard is taken and enforced on a cluster (`WAIT` in the pipeline of
/// the lock's script, so on the master of its slot). The compose cluster
/// has no replicas, so `WAIT 1` is never confirmed: every acquire is
/// refused and undone; `sync_replicas=0` passes. (That `WAIT` counts the
/// slot's shard rather than another needs a shard with replicas beside
/// one without; the compose cluster has none.)
async fn cluster_guard_waits_on_the_shard(ctx: Ctx) {
    let strict = lockcore_redis::connect(&with(&ctx.config, "sync_replicas=1&sync_timeout_ms=50"))
        .await
        .expect("connect");
    let name = ctx.name("shard");
    let err = strict
        .try_lock(&name)
        .await
        .expect_err("a shard without replicas cannot confirm");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    // A WAIT longer than the response timeout is still waited for.
    let long = lockcore_redis::connect(&with(
        &ctx.config,
        "sync_replicas=1&sync_timeout_ms=800&response_timeout_ms=200",
    ))
    .await
    .expect("connect");
    let err = long
        .try_lock(&name)
        .await
        .expect_err("a shard without replicas cannot confirm");
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    let none = lockcore_redis::connect(&with(&ctx.config, "sync_replicas=0"))
        .await
        .expect("connect");
    let g = none
        .try_lock(&name)
        .await
        .expect("nothing to wait for")
        .expect("the refused acquire was undone");
    g.release().await.expect("release");
}

/// The loss a single master can suffer, shown: the replica lags (its
/// replication stream cut), a holder takes the name on the primary, the
/// primary dies and the replica is promoted without the key; another client
/// takes the name there while the first still believes it holds it. The
/// replica-sync guard refuses that first acquisition (`replica_sync_guard`);
/// RedLock, ZooKeeper and etcd do not fail over to a copy that misses
/// acknowledged writes.
async fn failover_to_a_lagging_replica_loses_the_lock(ctx: Ctx) {
    let primary = ctx.config.clone();
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut admin(&primary).await)
        .await
        .expect("INFO replication");
    let replica = info
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("slave0:")?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .map(str::to_owned)
            };
            Some(format!("redis://{}:{}", field("ip=")?, field("port=")?))
        })
        .expect("the primary has a replica");
    // Undone in reverse: start the primary, then the replica again (it
    // replicates the primary directly once more).
    let _start_replica = UndoOnDrop::new("start", &["redis-replica"]);
    let _kill_replica = UndoOnDrop::new("kill", &["redis-replica"]);
    let _start_primary = UndoOnDrop::new("start", &["redis-primary"]);

    // The replica replicates through a proxy, which then drops the stream:
    // the replica lags.
    let proxies = Proxies::new();
    let routed = proxies.route(host_of(&primary)).await.expect("proxy");
    let (host, port) = routed.rsplit_once(':').expect("host:port");
    let mut r = admin(&replica).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg(host)
        .arg(port)
        .query_async(&mut r)
        .await
        .expect("replicate through the proxy");
    until(
        "the replica syncs through the proxy",
        Duration::from_secs(20),
        || {
            let mut r = r.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut r)
                    .await
                    .unwrap_or_default();
                info.contains("master_link_status:up")
            }
        },
    )
    .await;
    proxies.blackhole(Dir::Both);

    let name = ctx.name("failover");
    let a = lockcore_redis::connect(&primary).await.expect("connect");
    let g = a
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Wait::Try),
        )
        .await
        .expect("acquire")
        .expect("free");
    compose("kill", "redis-primary").await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut r)
        .await
        .expect("promote the replica");
    let b = lockcore_redis::connect(&replica).await.expect("connect");
    let g2 = b
        .try_lock(&name)
        .await
        .expect("try on the promoted replica")
        .expect("the promoted replica never had the key");
    assert!(
        g.is_held() && g2.is_held(),
        "the loss did not show: A held {}, B held {}",
        g.is_held(),
        g2.is_held()
    );
    eprintln!("FIGURES failover_to_a_lagging_replica redis: both_believed_held=true");
    drop(g2);
    drop(g);
}

// ------------------------------------------------------------- Sentinel --

/// The compose server listening on the port of `url` (a member of the
/// Sentinel group: `sentinel-redis-1` on 16410, and so on).
fn server_of(url: &str) -> String {
    let port: u16 = host_of(url)
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("port");
    format!("sentinel-redis-{}", port - 16409)
}

/// What `ROLE` says of the server at `url`: `Some(None)` for a master,
/// `Some(Some(port))` for a replica whose link to the master on `port` is
/// up, `None` otherwise.
async fn role(url: &str) -> Option<Option<u16>> {
    let client = redis::Client::open(url).ok()?;
    let mut c = tokio::time::timeout(
        Duration::from_secs(1),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let role: redis::Role = tokio::time::timeout(
        Duration::from_secs(1),
        redis::cmd("ROLE").query_async(&mut c),
    )
    .await
    .ok()?
    .ok()?;
    match role {
        redis::Role::Primary { .. } => Some(None),
        redis::Role::Replica {
            primary_port,
            replication_state,
            ..
        } if replication_state == "connected" => Some(Some(primary_port)),
        _ => None,
    }
}

/// Waits until the group is whole: the master every sentinel names answers
/// as master, the two other servers replicate it with their links up, and
/// every sentinel sees them so. Returns the master's `redis://` URL.
async fn healthy(sentinels: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(master) = sentinel_master(sentinels).await {
            let port: u16 = host_of(&master)
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok())
                .unwrap_or(0);
            let mut whole = role(&master).await == Some(None);
            for p in 16410..=16412u16 {
                if p != port && whole {
                    whole = role(&format!("redis://127.0.0.1:{p}")).await == Some(Some(port));
                }
            }
            if whole && sentinels_agree(sentinels, port).await {
                return master;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the Sentinel group is not whole within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether every sentinel names the master on `port` and sees two replicas
/// that are not down.
async fn sentinels_agree(sentinels: &str, port: u16) -> bool {
    let u = lockcore::raw::address::ServerUrl::parse(sentinels, 26379).expect("url");
    for s in &u.hosts {
        let mut c = admin(&format!("redis://{s}")).await;
        let replicas: Vec<std::collections::HashMap<String, String>> = match redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(&u.path)
            .query_async(&mut c)
            .await
        {
            Ok(r) => r,
            Err(_) => return false,
        };
        let up = replicas
            .iter()
            .filter(|r| {
                r.get("flags").is_some_and(|f| f == "slave")
                    && r.get("master-port").and_then(|p| p.parse().ok()) == Some(port)
                    && r.get("master-link-status").is_some_and(|s| s == "ok")
            })
            .count();
        if up != 2 {
            return false;
        }
    }
    true
}

/// Kills the master (SIGKILL) and returns the new master's URL once the
/// sentinels name another one, with the time that took. The killed server
/// is started again (a replica of the new master) when the returned guard
/// drops.
async fn kill_master(sentinels: &str, master: &str) -> (String, Duration, UndoOnDrop) {
    let server = server_of(master);
    let undo = UndoOnDrop::new("start", &[server.as_str()]);
    compose("kill", &server).await;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(60);
    loop {
        if let Ok(now) = sentinel_master(sentinels).await {
            if now != master && role(&now).await == Some(None) {
                return (now, killed.elapsed(), undo);
            }
        }
        assert!(Instant::now() < deadline, "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cuts replication from the master at `url`: its replicas' user is
/// disabled and their connections closed, so they lag while they stay up
/// (and promotable). Undone when the returned guard drops.
async fn cut_replication(url: &str) -> Heal {
    let mut c = admin(url).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("replicator")
        .arg("off")
        .query_async(&mut c)
        .await
        .expect("ACL SETUSER replicator off");
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("USER")
        .arg("replicator")
        .query_async(&mut c)
        .await
        .expect("CLIENT KILL USER replicator");
    Heal(url.to_owned())
}

/// Enables the replicas' user again on its master when dropped (when that
/// server is still up).
struct Heal(String);

impl Drop for Heal {
    fn drop(&mut self) {
        let on = redis::Client::open(self.0.as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
            .and_then(|mut c| {
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("replicator")
                    .arg("on")
                    .query::<()>(&mut c)
            });
        if let Err(e) = on {
            eprintln!(
                "replication not re-enabled on {} ({e}); fine if it was killed",
                self.0
            );
        }
    }
}

/// Kill -9 of the master under a holder and three waiters, with the
/// replica-sync guard: no two leases overlap (history checker), the holder
/// keeps its lease on the new master (the key is there, renewed past its
/// first ttl), and every waiter is served after the failover.
async fn sentinel_failover_keeps_the_holder(ctx: Ctx) {
    let sentinels = ctx.config.clone();
    let master = healthy(&sentinels).await;
    let url = with(&sentinels, "sync_replicas=1&sync_timeout_ms=500");
    let name = ctx.name("failover");
    let ttl = Duration::from_secs(15);
    let history = Arc::new(History::new());
    let a = lockcore_redis::connect(&url).await.expect("connect");
    let g = a
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let held = history.acquired(&g);
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let (url, name, history) = (url.clone(), name.clone(), history.clone());
        waiters.push(tokio::spawn(async move {
            let l = lockcore_redis::connect(&url).await.expect("connect");
            let w = l
                .acquire(
                    &name,
                    &LockOptions::new()
                        .ttl(Duration::from_secs(4))
                        .wait(Wait::For(Duration::from_secs(60))),
                )
                .await
                .expect("the waiter rides out the failover")
                .expect("served within 60 s");
            let served = Instant::now();
            let id = history.acquired(&w);
            tokio::time::sleep(Duration::from_millis(100)).await;
            history.ended(id, &w);
            w.release().await.expect("release");
            served
        }));
    }
    // The waiters wait on the old master before it dies.
    let channel = format!("{}:released", key(&name));
    until(
        "the waiters subscribed on the master",
        Duration::from_secs(10),
        || async { numsub(&master, &channel).await == 3 },
    )
    .await;
    let (new_master, detected, _restart) = kill_master(&sentinels, &master).await;
    // Past the first ttl after the kill: the key is on the new master only
    // if the holder renewed it there.
    let kill = Instant::now() - detected;
    tokio::time::sleep_until((kill + ttl + Duration::from_secs(1)).into()).await;
    // Every waiter listens on the new master (checked on the server).
    until(
        "the waiters re-subscribed on the new master",
        Duration::from_secs(10),
        || async { numsub(&new_master, &channel).await == 3 },
    )
    .await;
    let on_new = raw_get(host_of(&new_master), &key(&name)).await;
    assert!(
        g.is_held(),
        "the holder lost its lease: {:?}",
        g.lost_reason()
    );
    assert!(
        on_new.is_some(),
        "the key is not on the new master {new_master} a ttl after the failover"
    );
    history.ended(held, &g);
    let released = Instant::now();
    g.release().await.expect("release on the new master");
    let mut served = Vec::new();
    for w in waiters {
        served.push(w.await.expect("waiter"));
    }
    let first = served
        .iter()
        .min()
        .expect("three waiters")
        .duration_since(released);
    let summary = history.check().expect("no two holders, tokens rising");
    eprintln!(
        "FIGURES sentinel_failover_keeps_the_holder redis-sentinel: failover_detected_ms={} holder_kept=true first_waiter_after_release_ms={} grants={}",
        detected.as_millis(),
        first.as_millis(),
        summary.leases
    );
    drop(_restart);
    healthy(&sentinels).await;
}

/// Without the guard, replication cut before the grant: the master dies,
/// the lagging replica is promoted without the key, a second client takes
/// the name while the first still holds it (the known weakness, measured),
/// the first one's lost signal fires at its next renewal, and the second
/// one's fencing token is larger (the token's server-time floor).
async fn sentinel_failover_without_guard_loses_the_lock(ctx: Ctx) {
    let sentinels = ctx.config.clone();
    let master = healthy(&sentinels).await;
    let name = ctx.name("lagging");
    let _heal = cut_replication(&master).await;
    let a = lockcore_redis::connect(&sentinels).await.expect("connect");
    // Renewed every 10 s: the second client's grant comes well before the
    // first holder's next renewal.
    let ttl = Duration::from_secs(30);
    let g = a
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let (_new_master, detected, restart) = kill_master(&sentinels, &master).await;
    let kill = Instant::now() - detected;
    let b = lockcore_redis::connect(&sentinels).await.expect("connect");
    let g2 = b
        .try_lock(&name)
        .await
        .expect("try on the new master")
        .expect("the promoted replica never had the key");
    let second = kill.elapsed();
    assert!(
        g.is_held(),
        "the first holder noticed before the second grant"
    );
    assert!(
        g2.fence() > g.fence(),
        "tokens went back across the failover: {:?} then {:?}",
        g.fence(),
        g2.fence()
    );
    tokio::time::timeout(ttl, g.lost())
        .await
        .expect("the first holder's lost fires at its next renewal");
    assert!(
        g.lost_reason().is_some_and(|r| r.contains("refused")),
        "lost for another reason: {:?}",
        g.lost_reason()
    );
    let lost = kill.elapsed();
    eprintln!(
        "FIGURES sentinel_failover_without_guard redis-sentinel: failover_detected_ms={} second_holder_ms={} first_lost_ms={} both_believed_held=true",
        detected.as_millis(),
        second.as_millis(),
        lost.as_millis()
    );
    g2.release().await.expect("release");
    drop(g);
    drop(restart);
    healthy(&sentinels).await;
}

/// A master counts only when a majority of the sentinels names it: the
/// first sentinel of the URL, alone, is pointed at another server (a stale
/// sentinel), and the client still goes to the master the other two name.
async fn sentinel_majority_names_the_master(ctx: Ctx) {
    let sentinels = ctx.config.clone();
    let master = healthy(&sentinels).await;
    let u = lockcore::raw::address::ServerUrl::parse(&sentinels, 26379).expect("url");
    let first = format!("redis://{}", u.hosts[0]);
    let stray = std::env::var("LOCKTEST_REDIS_URL").expect("LOCKTEST_REDIS_URL");
    let (stray_host, stray_port) = host_of(&stray).rsplit_once(':').expect("host:port");
    let (master_host, master_port) = host_of(&master).rsplit_once(':').expect("host:port");
    let point = |host: String, port: String| {
        let first = first.clone();
        let name = u.path.clone();
        async move {
            let mut c = admin(&first).await;
            let _: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("REMOVE")
                .arg(&name)
                .query_async(&mut c)
                .await;
            let () = redis::cmd("SENTINEL")
                .arg("MONITOR")
                .arg(&name)
                .arg(host)
                .arg(port)
                .arg(2)
                .query_async(&mut c)
                .await
                .expect("SENTINEL MONITOR");
            let () = redis::cmd("SENTINEL")
                .arg("SET")
                .arg(&name)
                .arg("down-after-milliseconds")
                .arg(2000)
                .arg("failover-timeout")
                .arg(4000)
                .arg("parallel-syncs")
                .arg(2)
                .query_async(&mut c)
                .await
                .expect("SENTINEL SET");
        }
    };
    point(stray_host.to_owned(), stray_port.to_owned()).await;
    let l = lockcore_redis::connect(&sentinels).await;
    point(master_host.to_owned(), master_port.to_owned()).await;
    let l = l.expect("connect through the majority");
    let name = ctx.name("majority");
    let g = l.try_lock(&name).await.expect("try").expect("free");
    let on_master = raw_get(host_of(&master), &key(&name)).await;
    let on_stray = raw_get(host_of(&stray), &key(&name)).await;
    g.release().await.expect("release");
    assert!(
        on_stray.is_none(),
        "the lock went to the stale sentinel's server"
    );
    assert!(on_master.is_some(), "the lock is not on the master");
    healthy(&sentinels).await;
}

/// Wrong input is said as such: a master name no sentinel knows, and a
/// server's address given as a sentinel's.
async fn sentinel_wrong_input_is_said(ctx: Ctx) {
    let u = lockcore::raw::address::ServerUrl::parse(&ctx.config, 26379).expect("url");
    let hosts: Vec<String> = u.hosts.iter().map(ToString::to_string).collect();
    let wrong_name = format!("redis+sentinel://{}/no-such-master", hosts.join(","));
    let err = lockcore_redis::connect(&wrong_name)
        .await
        .expect_err("no such master");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("no majority"), "{err}");
    let master = healthy(&ctx.config).await;
    let not_a_sentinel = format!("redis+sentinel://{}/{}", host_of(&master), u.path);
    let err = lockcore_redis::connect(&not_a_sentinel)
        .await
        .expect_err("a server is not a sentinel");
    assert!(err.to_string().contains("sentinel"), "{err}");
}

/// With the guard and replication cut: the acquire is refused
/// (`Unavailable`) and nothing is left held on the master.
async fn sentinel_guard_refuses_an_unreplicated_grant(ctx: Ctx) {
    let sentinels = ctx.config.clone();
    let master = healthy(&sentinels).await;
    let l = lockcore_redis::connect(&with(&sentinels, "sync_replicas=1&sync_timeout_ms=300"))
        .await
        .expect("connect");
    let name = ctx.name("refused");
    let heal = cut_replication(&master).await;
    let err = l.try_lock(&name).await.expect_err("no replica can confirm");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("replicas"), "{err}");
    assert_eq!(
        raw_get(host_of(&master), &key(&name)).await,
        None,
        "a refused acquire left the key held"
    );
    drop(heal);
    healthy(&sentinels).await;
}

/// With the guard, a renewal that no replica confirms (replication cut
/// after the grant) fires lost within the ttl instead of extending the
/// lease; nothing was ever granted that a promoted replica would not know.
async fn sentinel_unconfirmed_renewal_fires_lost(ctx: Ctx) {
    let sentinels = ctx.config.clone();
    let master = healthy(&sentinels).await;
    let l = lockcore_redis::connect(&with(&sentinels, "sync_replicas=1&sync_timeout_ms=200"))
        .await
        .expect("connect");
    let name = ctx.name("unconfirmed");
    let ttl = Duration::from_secs(2);
    let g = l
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let heal = cut_replication(&master).await;
    let after = lost_unconfirmed(&g, ttl, host_of(&master), &name).await;
    drop(heal);
    eprintln!(
        "FIGURES sentinel_unconfirmed_renewal redis-sentinel: lost_after_cut_ms={}",
        after.as_millis()
    );
    drop(g);
    healthy(&sentinels).await;
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        own_cases!(
            Target::new(
                "redis-replica",
                Some("LOCKTEST_REDIS_REPLICATED_URL"),
                |url| async move { Ok(UrlHarness::shared(url, connect)) },
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            replica_sync_guard,
            unconfirmed_renewals_fire_lost,
            unconfirmed_release_is_an_error,
            a_waiting_acquire_outlasts_an_unconfirmed_grant,
            failover_to_a_lagging_replica_loses_the_lock,
        ),
        own_cases!(
            Target::new(
                "redis-cluster-guard",
                Some("LOCKTEST_REDIS_CLUSTER_URL"),
                |url| async move { Ok(UrlHarness::shared(url, connect)) },
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            cluster_guard_waits_on_the_shard,
        ),
        own_cases!(
            Target::new(
                "redis-sentinel-faults",
                Some("LOCKTEST_REDIS_SENTINEL_URL"),
                |url| async move { Ok(UrlHarness::shared(url, connect)) },
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            sentinel_wrong_input_is_said,
            sentinel_majority_names_the_master,
            sentinel_guard_refuses_an_unreplicated_grant,
            sentinel_unconfirmed_renewal_fires_lost,
            sentinel_failover_keeps_the_holder,
            sentinel_failover_without_guard_loses_the_lock,
        ),
    ])
}
