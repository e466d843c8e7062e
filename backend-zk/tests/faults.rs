//! ZooKeeper-specific cases (servers from compose/, one case at a time since
//! some stop or pause servers): no herd with 50 waiters, the ensemble's
//! leader killed while a lock is held and others wait, a holder cut off for
//! longer than its session, and interoperation with Curator's and kazoo's
//! node layouts.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::testing::history::History;
use lockcore::{ErrorKind, LockOptions, Locker};
use lockcore_conformance::cases::{hold_all, must_be_held};
use lockcore_conformance::own_cases;
use lockcore_conformance::scenarios::rw_beside_a_foreign_hold;
use lockcore_conformance::{
    compose, run_serial, soak_pausing, Ctx, Dir, Harness, Proxies, Target, UndoOnDrop, COMPOSE_HINT,
};
use lockcore_zk::{ZkBackend, ZkConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client as zk;

const CHROOT: &str = "/lockcore-faults";

#[derive(Debug)]
struct Zk {
    url: String,
}

#[async_trait]
impl Harness for Zk {
    async fn connect(&self) -> lockcore::Result<Locker> {
        lockcore_zk::connect(&format!("{}{CHROOT}", self.url)).await
    }
}

/// The `host:port` list of the target's `zk://` URL.
fn hosts(ctx: &Ctx) -> String {
    lockcore::raw::address::ServerUrl::parse(&ctx.config, 2181)
        .map(|u| {
            u.hosts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
        .expect("a zk:// URL")
}

fn cfg(ctx: &Ctx) -> ZkConfig {
    ZkConfig::parse(&format!("zk://{}{CHROOT}", hosts(ctx))).expect("url")
}

async fn backend(ctx: &Ctx) -> Arc<ZkBackend> {
    Arc::new(ZkBackend::connect(cfg(ctx)).await.expect("connect"))
}

async fn raw(ctx: &Ctx) -> zk::Client {
    zk::Client::connect(&hosts(ctx)).await.expect("raw client")
}

/// Waits until `l` reports `n` waiters on `name`.
async fn until_waiters(l: &Locker, name: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let w = l
            .inspect(name)
            .await
            .expect("inspect")
            .and_then(|i| i.waiters);
        if w == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} waiters never queued (saw {w:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `parent` has `n` children (a read-write lock's readers and
/// writers, which `inspect` does not show).
async fn until_children(raw: &zk::Client, parent: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = raw.list_children(parent).await.unwrap_or_default();
        if c.len() == n {
            return;
        }
        assert!(Instant::now() < deadline, "never {n} nodes (saw {c:?})");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 50 waiters on one name: each release wakes exactly one of them (one
/// predecessor-watch notification per handoff), in arrival order.
async fn fifty_waiters_one_wakeup_per_release(ctx: Ctx) {
    const WAITERS: usize = 50;
    const BACKENDS: usize = 5;
    let name = ctx.name("herd");
    let backends: Vec<Arc<ZkBackend>> = {
        let mut v = Vec::new();
        for _ in 0..BACKENDS {
            v.push(backend(&ctx).await);
        }
        v
    };
    let events = || -> u64 { backends.iter().map(|b| b.stats().predecessor_events).sum() };
    let holder = Locker::from_arc(backends[0].clone());
    let g = holder.try_lock(&name).await.expect("try").expect("free");
    let (acq_tx, mut acq_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let mut go = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let l = Locker::from_arc(backends[i % BACKENDS].clone());
        let (tx, n) = (acq_tx.clone(), name.clone());
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        go.push(go_tx);
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&n).await.expect("waiter acquires");
            tx.send(i).expect("report");
            go_rx.await.expect("told to release");
            g.release().await.expect("waiter releases");
        }));
        until_waiters(&holder, &name, i + 1).await;
    }
    assert_eq!(events(), 0, "watch events before any release");
    g.release().await.expect("holder releases");
    for (i, go) in go.into_iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(20), acq_rx.recv())
            .await
            .expect("a waiter acquires after each release")
            .expect("channel");
        assert_eq!(got, i, "served out of arrival order");
        assert_eq!(
            events(),
            i as u64 + 1,
            "handoff {i} cost more than one watch notification"
        );
        go.send(()).expect("waiter alive");
    }
    for t in tasks {
        t.await.expect("waiter task");
    }
    // Give any stray notification time to land before the final count.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        events(),
        WAITERS as u64,
        "watch notifications for 50 handoffs"
    );
    println!("zk: 50 handoffs cost {} watch notifications", events());
}

/// A four-letter-word command's reply from the server on `port`.
async fn four_letters(port: u16, cmd: &[u8]) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(cmd).await.ok()?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(out)
}

/// The most watches any one session has set on the server (`wchc`: each
/// session's id, then its watched paths indented below).
async fn most_watches_on_a_session(ctx: &Ctx) -> usize {
    let port = zk_port(ctx);
    let out = four_letters(port, b"wchc").await.expect("wchc");
    let (mut most, mut this) = (0, 0);
    for line in out.lines() {
        if line.starts_with(char::is_whitespace) {
            this += 1;
        } else {
            most = most.max(this);
            this = 0;
        }
    }
    most.max(this)
}

/// The port of the one server the tests' url names.
fn zk_port(ctx: &Ctx) -> u16 {
    hosts(ctx)
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("one zk server")
}

/// A count the server keeps (`mntr`), by its key.
async fn mntr(ctx: &Ctx, key: &str) -> u64 {
    let port = zk_port(ctx);
    let out = four_letters(port, b"mntr").await.expect("mntr");
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} in mntr"))
}

/// 300 locks held on one session, renewed every second for 4 s: the
/// renewals cost about one request per session and renewal window, not
/// one per lock (the server counts the packets it receives), and every
/// lock stays held on the server.
async fn renewals_cost_one_request_per_session(ctx: Ctx) {
    let l = lockcore_zk::connect(&format!("zk://{}{CHROOT}", hosts(&ctx)))
        .await
        .expect("connect");
    let names: Vec<String> = (0..300).map(|i| ctx.name(&format!("many/{i}"))).collect();
    let guards = hold_all(&l, &names, Duration::from_secs(3)).await;
    // Each lease sets its node's watch in its own task after the acquire
    // returned: count from when the server has every watch on one session,
    // or those requests (one a lock, once) land in the window on a loaded
    // machine.
    tokio::time::timeout(Duration::from_secs(30), async {
        while most_watches_on_a_session(&ctx).await < 300 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the server has the 300 node watches within 30 s");
    let before = mntr(&ctx, "zk_packets_received").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let packets = mntr(&ctx, "zk_packets_received").await - before;
    eprintln!(
        "FIGURES renewals_cost_one_request_per_session zk: packets_in_4s_for_300_locks={packets}"
    );
    // Per lock: 300 locks x 4 renewals = 1,200 requests. Shared: a few
    // per second, with pings and other clients' requests.
    assert!(
        packets < 150,
        "the server received {packets} packets in 4 s of renewals of 300 locks on one session"
    );
    assert!(guards.iter().all(lockcore::LockGuard::is_held));
    let other = lockcore_zk::connect(&format!("zk://{}{CHROOT}", hosts(&ctx)))
        .await
        .expect("connect");
    for i in [0, 150, 299] {
        must_be_held(&other, &ctx.name(&format!("many/{i}"))).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

/// 60 locks held on one session while every request of the client takes
/// 150 ms each way (through a proxy; a round trip longer than the 150 ms a
/// shared proof serves): renewals that wait behind a slow
/// proof share it rather than send one each in turn, so every lock stays
/// held, on the server too, for 6 s (two ttls).
async fn shared_renewals_outlast_a_slow_server(ctx: Ctx) {
    let proxies = Proxies::new();
    let routed = proxies
        .route_url(&format!("zk://{}{CHROOT}", hosts(&ctx)), 2181)
        .await
        .expect("a proxy");
    let l = lockcore_zk::connect(&routed).await.expect("connect");
    let names: Vec<String> = (0..60).map(|i| ctx.name(&format!("slow/{i}"))).collect();
    let guards = hold_all(&l, &names, Duration::from_secs(3)).await;
    proxies.delay(Dir::Both, Duration::from_millis(150));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    proxies.delay(Dir::Both, Duration::ZERO);
    assert_eq!(lost, 0, "{lost} of 60 locks lost behind a slow server");
    let other = ctx.locker().await;
    for i in [0, 30, 59] {
        must_be_held(&other, &ctx.name(&format!("slow/{i}"))).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

/// Locks with 20 different ttls, each taken and released: the backend does
/// not keep a session (and a server connection) per ttl it ever saw. The
/// server's own count of connections proves it.
async fn sessions_do_not_pile_up(ctx: Ctx) {
    let before = mntr(&ctx, "zk_num_alive_connections").await;
    let l = lockcore_zk::connect(&format!("zk://{}{CHROOT}", hosts(&ctx)))
        .await
        .expect("connect");
    for secs in 1..=20u64 {
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(secs))
            .wait(lockcore::Wait::Try);
        let g = l
            .acquire(&ctx.name(&format!("ttl/{secs}")), &opts)
            .await
            .expect("acquire")
            .expect("free");
        g.release().await.expect("release");
    }
    // The server counts a closed connection at once; give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = mntr(&ctx, "zk_num_alive_connections").await;
    assert!(
        during <= before + 6,
        "the server counts {} more connections after 20 ttls were used (at most 6: the default session and a few recent idle ones)",
        during - before
    );
    drop(l);
}

/// 200 first acquisitions at once with a ttl no session has yet open one
/// session between them, not one each (a server limits the connections of
/// one address: ZooKeeper's `maxClientCnxns` is 60 by default): all are
/// granted, and the server counts one more connection.
async fn first_acquires_at_once_share_one_session(ctx: Ctx) {
    let l = lockcore_zk::connect(&format!("zk://{}{CHROOT}", hosts(&ctx)))
        .await
        .expect("connect");
    let before = mntr(&ctx, "zk_num_alive_connections").await;
    let names: Vec<String> = (0..200).map(|i| ctx.name(&format!("first/{i}"))).collect();
    let guards = hold_all(&l, &names, Duration::from_secs(7)).await;
    let during = mntr(&ctx, "zk_num_alive_connections").await;
    assert!(
        during <= before + 1,
        "200 first acquisitions with one ttl opened {} connections",
        during - before
    );
    for g in guards {
        g.release().await.expect("release");
    }
}

/// Tries with new ttls (each needing a session of its own) against an
/// ensemble that stopped answering: each ends by about one connect timeout,
/// not one per try queued ahead of it.
async fn tries_on_a_silent_ensemble_end_together(ctx: Ctx) {
    let proxies = Proxies::new();
    let routed = proxies
        .route_url(
            &format!("zk://{}{CHROOT}?connect_timeout_ms=3000", hosts(&ctx)),
            2181,
        )
        .await
        .expect("proxy");
    let l = lockcore_zk::connect(&routed).await.expect("connect");
    proxies.blackhole(Dir::Both);
    let t = Instant::now();
    let tries: Vec<_> = (3..9u64)
        .map(|secs| {
            let (l, name) = (l.clone(), ctx.name(&format!("silent/{secs}")));
            tokio::spawn(async move {
                let opts = LockOptions::new()
                    .ttl(Duration::from_secs(secs))
                    .wait(lockcore::Wait::Try);
                l.acquire(&name, &opts).await.map(|g| g.is_some())
            })
        })
        .collect();
    for t in tries {
        let r = t.await.expect("task");
        let err = r.expect_err("a silent ensemble granted or refused a lock");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "six tries on a silent ensemble took {:?}: they waited for each other's connects",
        t.elapsed()
    );
}

/// A release cut off by a partition longer than the request timeout and
/// shorter than the session still frees the name once the partition heals:
/// our node is deleted for good, not tried once and left to the session
/// (which lives on, and with it the node, blocking the name).
async fn a_release_cut_off_by_a_partition_frees_the_name(ctx: Ctx) {
    let proxies = Proxies::new();
    let routed = proxies
        .route_url(
            &format!(
                "zk://{}{CHROOT}?request_timeout_ms=1000&connection_timeout_ms=2000",
                hosts(&ctx)
            ),
            2181,
        )
        .await
        .expect("proxy");
    let l = lockcore_zk::connect(&routed).await.expect("connect");
    let other = Locker::from_arc(backend(&ctx).await);
    let name = ctx.name("cut-release");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(20))
        .wait(lockcore::Wait::Try);
    let g = l
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    proxies.blackhole(Dir::Both);
    let released = g.release().await;
    println!("zk: a release during the partition: {released:?}");
    proxies.heal();
    let got = other
        .acquire(
            &name,
            &LockOptions::new().wait(lockcore::Wait::For(Duration::from_secs(15))),
        )
        .await
        .expect("the node of a cut-off release stayed while its session lived");
    got.expect("acquired").release().await.expect("release");
    drop(l);
}

/// A second node of ours (a creation that was cut off, then applied late)
/// appears in the queue after the grant: the release deletes it too, so it
/// does not block the name.
async fn release_deletes_a_late_twin(ctx: Ctx) {
    let l = lockcore_zk::connect(&format!("zk://{}{CHROOT}", hosts(&ctx)))
        .await
        .expect("connect");
    let name = ctx.name("twin");
    let g = l.try_lock(&name).await.expect("try").expect("free");
    let holder = l
        .inspect(&name)
        .await
        .expect("inspect")
        .and_then(|i| i.holder)
        .and_then(|h| h.owner)
        .expect("the holder's owner token");
    // Our node is `_c_<the token as a uuid>-lock-<10 digits>`.
    let t = &holder;
    assert_eq!(t.len(), 32, "an owner token: {t}");
    let prefix = &format!(
        "_c_{}-{}-{}-{}-{}-lock-",
        &t[0..8],
        &t[8..12],
        &t[12..16],
        &t[16..20],
        &t[20..32]
    );
    let parent = lockcore_zk::lock_parent(&cfg(&ctx), &name);
    let raw = raw(&ctx).await;
    let opts = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    raw.create(&format!("{parent}/{prefix}"), b"late", &opts)
        .await
        .expect("a late twin");
    g.release().await.expect("release");
    let other = lockcore_zk::connect(&format!("zk://{}{CHROOT}", hosts(&ctx)))
        .await
        .expect("connect");
    let next = other
        .lock_timeout(&name, Duration::from_secs(3))
        .await
        .expect("a late twin of the released lease blocked the name");
    next.release().await.expect("release");
}

async fn zk_mode(port: u16) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"srvr").await.ok()?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(str::to_owned)
}

/// Reads that report who holds a name see every write acknowledged before
/// them, also through a follower: a holder on the leader takes and
/// releases a name, and right after each step a client connected only to a
/// follower inspects it (200 rounds): held after the grant, free after the
/// release, never the state before. Then, 10 times, the follower is paused
/// while the holder releases (the leader and the other follower make the
/// quorum), and resumed while the client's inspection waits on it: the
/// follower then has the release to apply and the read to answer at once,
/// and the read must not come first.
async fn inspect_through_a_follower_sees_every_write(ctx: Ctx) {
    let ports: Vec<u16> = ctx
        .config
        .split(',')
        .map(|h| h.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let mut leader = None;
    let mut follower = None;
    for p in &ports {
        match zk_mode(*p).await.as_deref() {
            Some("leader") => leader = Some(*p),
            Some("follower") => follower = Some(*p),
            _ => {}
        }
    }
    let (leader, follower) = (
        leader.expect("the ensemble has a leader"),
        follower.expect("the ensemble has a follower"),
    );
    let holder = lockcore_zk::connect(&format!("zk://127.0.0.1:{leader}"))
        .await
        .expect("connect");
    let observer = lockcore_zk::connect(&format!("zk://127.0.0.1:{follower}"))
        .await
        .expect("connect");
    let name = ctx.name("follower-read");
    let (mut stale_free, mut stale_held) = (0, 0);
    for _ in 0..200 {
        let g = holder.try_lock(&name).await.expect("try").expect("free");
        let seen = observer
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("inspects");
        if seen.holder.is_none() {
            stale_free += 1;
        }
        g.release().await.expect("release");
        let seen = observer
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("inspects");
        if seen.holder.is_some() {
            stale_held += 1;
        }
    }
    assert_eq!(
        (stale_free, stale_held),
        (0, 0),
        "of 200 rounds, a held name was shown free {stale_free} times and a released one held {stale_held} times"
    );
    let server = format!("zk-{}", follower - 12190);
    let mut stale = 0;
    for _ in 0..10 {
        let g = holder.try_lock(&name).await.expect("try").expect("free");
        // Seen held through the follower: its session is settled.
        assert!(observer
            .inspect(&name)
            .await
            .expect("inspect")
            .is_some_and(|i| i.holder.is_some()));
        compose("pause", &server).await;
        let resumed = UndoOnDrop::new("resume", &[&server]);
        g.release().await.expect("release");
        let seen = {
            let (o, n) = (observer.clone(), name.clone());
            tokio::spawn(async move { o.inspect(&n).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(resumed);
        let seen = seen
            .await
            .expect("task")
            .expect("inspect")
            .expect("inspects");
        if seen.holder.is_some() {
            stale += 1;
        }
    }
    assert_eq!(
        stale, 0,
        "a released name was shown held through a resumed follower {stale} of 10 times"
    );
}

/// Kill the ensemble's leader while a lock is held and three clients wait:
/// never two holders, and acquisition resumes once a new leader is elected.
async fn leader_killed_while_held(ctx: Ctx) {
    const SERVERS: [&str; 3] = ["zk-1", "zk-2", "zk-3"];
    let ports: Vec<u16> = ctx
        .config
        .split(',')
        .map(|h| h.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let mut leader = None;
    for (i, p) in ports.iter().enumerate() {
        if zk_mode(*p).await.as_deref() == Some("leader") {
            leader = Some(SERVERS[i]);
        }
    }
    let leader = leader.expect("the ensemble has a leader");
    let name = ctx.name("leader-kill");
    // Sessions of 20 s outlive an election.
    let opts = LockOptions::new().ttl(Duration::from_secs(20));
    let holder = Locker::from_arc(backend(&ctx).await).with_defaults(opts);
    let g = holder.try_lock(&name).await.expect("try").expect("free");
    let history = History::new();
    let inside = Arc::new(AtomicBool::new(false));
    let first_after = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let l = Locker::from_arc(backend(&ctx).await).with_defaults(opts);
        let (n, h, inside, first) = (
            name.clone(),
            history.clone(),
            inside.clone(),
            first_after.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let g = l
                .lock_timeout(&n, Duration::from_secs(90))
                .await
                .expect("a waiter acquires after the election");
            first.lock().unwrap().get_or_insert_with(Instant::now);
            let id = h.acquired(&g);
            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
            tokio::time::sleep(Duration::from_millis(50)).await;
            inside.store(false, Ordering::SeqCst);
            h.ended(id, &g);
            g.release().await.expect("release");
        }));
    }
    until_waiters(&holder, &name, 3).await;
    let id = history.acquired(&g);
    inside.store(true, Ordering::SeqCst);
    let _restart = UndoOnDrop::new("start", &[leader]);
    let killed = Instant::now();
    compose("kill", leader).await;
    // The holder keeps its lease through the election, then releases.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        g.is_held(),
        "the holder lost its lease: {:?}",
        g.lost_reason()
    );
    inside.store(false, Ordering::SeqCst);
    history.ended(id, &g);
    match g.release().await {
        Ok(()) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::Lost, "{e}"),
    }
    for t in tasks {
        t.await.expect("waiter task");
    }
    let resumed = first_after.lock().unwrap().expect("a waiter acquired") - killed;
    history
        .check()
        .expect("no overlapping leases, tokens rising");
    let mut new_leader = None;
    for p in &ports {
        if zk_mode(*p).await.as_deref() == Some("leader") {
            new_leader = Some(*p);
        }
    }
    println!(
        "zk-ensemble: leader {leader} killed; first acquisition {resumed:?} later (new leader on port {new_leader:?})"
    );
    println!(
        "FIGURES leader_killed zk-ensemble: first_lock_after_kill={}ms, overlaps=0",
        resumed.as_millis()
    );
    drop(_restart);
}

/// A holder whose server stops answering for longer than its session
/// timeout: its lost signal fires (without waiting for the expiry report),
/// the server expires its session, and the next waiter gets the lock, never
/// before the holder's lost signal.
async fn expired_session_fires_lost_and_next_waiter_gets_it(ctx: Ctx) {
    let name = ctx.name("expiry");
    let holder = Locker::from_arc(backend(&ctx).await)
        .with_defaults(LockOptions::new().ttl(Duration::from_secs(2)));
    let waiter = Locker::from_arc(backend(&ctx).await)
        .with_defaults(LockOptions::new().ttl(Duration::from_secs(30)));
    let g = holder.try_lock(&name).await.expect("try").expect("free");
    let lost_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    {
        let (lost, at) = (g.lost(), lost_at.clone());
        tokio::spawn(async move {
            lost.await;
            *at.lock().unwrap() = Some(Instant::now());
        });
    }
    let w = {
        let n = name.clone();
        tokio::spawn(async move {
            let g = waiter
                .lock_timeout(&n, Duration::from_secs(60))
                .await
                .expect("the waiter gets the lock");
            (Instant::now(), g)
        })
    };
    until_waiters(&holder, &name, 1).await;
    let _resume = UndoOnDrop::new("resume", &["zk"]);
    let paused = Instant::now();
    compose("pause", "zk").await;
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost fires while cut off, before any expiry report");
    let lost_after = paused.elapsed();
    assert!(!g.is_held());
    // Keep the server away past the 2 s session timeout, then bring it back:
    // it expires the holder's session; the 30 s session of the waiter lives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    compose("resume", "zk").await;
    let (got_at, g2) = tokio::time::timeout(Duration::from_secs(30), w)
        .await
        .expect("the waiter acquires after the expiry")
        .expect("waiter task");
    let lost_at = lost_at.lock().unwrap().expect("lost recorded");
    assert!(
        lost_at <= got_at,
        "the waiter acquired before the holder's lost signal"
    );
    assert!(g2.is_held());
    let err = g.release().await.expect_err("release of an expired lease");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    g2.release().await.expect("release");
    println!(
        "zk: lost fired {lost_after:?} after the server stopped; the waiter acquired {:?} after the pause began",
        got_at - paused
    );
}

/// A session's end reaches every lease on it at once, with no renewal to
/// notice it (renewal off, a 30 s ttl): ended on the client (one lease
/// abandoned, as if the process died, ends the session it shares with the
/// others) and ended by the server (expired). The names stay taken on the
/// server until it expires the abandoned session: a lease's task deletes
/// nothing on a dead session.
async fn a_session_end_raises_every_lease_on_it(ctx: Ctx) {
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).renew(false);
    for how in ["abandoned", "expired"] {
        let b = backend(&ctx).await;
        let l = Locker::from_arc(b.clone()).with_defaults(opts);
        let names: Vec<String> = (0..3)
            .map(|i| ctx.name(&format!("end-{how}-{i}")))
            .collect();
        let mut held = Vec::new();
        for n in &names {
            held.push(l.try_lock(n).await.expect("try").expect("free"));
        }
        let ended = Instant::now();
        if how == "abandoned" {
            let first = l.try_lock(&ctx.name(&format!("end-{how}-x"))).await;
            first.expect("try").expect("free").abandon();
        } else {
            assert!(b.expire_sessions().await.expect("expire") >= 1);
        }
        for g in &held {
            tokio::time::timeout(Duration::from_secs(5), g.lost())
                .await
                .unwrap_or_else(|_| panic!("{how}: a lease on the session not lost in 5 s"));
        }
        println!(
            "zk: {how} session: every lease lost {:?} after",
            ended.elapsed()
        );
        if how == "abandoned" {
            let other = Locker::from_arc(backend(&ctx).await);
            for n in &names {
                must_not_get(&other, n).await;
            }
        }
    }
}

/// A session the client gives up on a server gone for about the session
/// timeout reaches every lease on it then, with no renewal to notice it
/// (renewal off). The server is killed, so the connection is refused at
/// once and the client counts from then, less its connection timeout (10
/// s here): the session is given up 20 s after the kill, 10 s before the
/// leases' validity deadlines. The client still keeps their node watches
/// (it waits to reconnect), so the session itself raises them.
async fn a_session_given_up_raises_every_lease_on_it(ctx: Ctx) {
    let ttl = Duration::from_secs(30);
    let opts = LockOptions::new().ttl(ttl).renew(false);
    let mut config = cfg(&ctx);
    config.connection_timeout = Duration::from_secs(10);
    let b = ZkBackend::connect(config).await.expect("connect");
    let l = Locker::from_arc(Arc::new(b)).with_defaults(opts);
    let mut held = Vec::new();
    for i in 0..3 {
        let n = ctx.name(&format!("given-up-{i}"));
        held.push(l.try_lock(&n).await.expect("try").expect("free"));
    }
    let deadline = held[0].valid_until().expect("held");
    let _start = UndoOnDrop::new("start", &["zk"]);
    let killed = Instant::now();
    compose("kill", "zk").await;
    for g in &held {
        tokio::time::timeout(ttl, g.lost())
            .await
            .expect("lost while the server is gone");
    }
    let lost_at = Instant::now();
    compose("start", "zk").await;
    println!(
        "zk: server gone, every lease lost {:?} after the kill, {:?} before its validity deadline",
        lost_at - killed,
        deadline.saturating_duration_since(lost_at)
    );
    assert!(
        lost_at + Duration::from_secs(5) < deadline,
        "lost {:?} after the kill: by the validity deadline, not when the session was given up",
        lost_at - killed
    );
}

/// Lock nodes under `name`'s parent, as the server lists them.
async fn nodes(ctx: &Ctx, name: &str) -> Vec<String> {
    let parent = lockcore_zk::lock_parent(&cfg(ctx), name);
    match raw(ctx).await.list_children(&parent).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("listing {parent}: {e}"),
    }
}

/// Sessions expired on demand (the `KillServerSession` technique), under a
/// holder and under a waiter, then the clients go on with new sessions:
/// the holder's lost signal fires and its node is gone; the waiter whose
/// session expired is never granted the lock on the strength of its old
/// node (CURATOR-604 granted a second holder so), it waits again behind
/// the live holder; nothing is left on the server at the end.
async fn session_expiry_under_holder_and_waiter(ctx: Ctx) {
    let name = ctx.name("session-expiry");
    let (hb, wb) = (backend(&ctx).await, backend(&ctx).await);
    let holder = Locker::from_arc(hb.clone());
    let waiter = Locker::from_arc(wb.clone());
    let third = Locker::from_arc(backend(&ctx).await);
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    // Under a holder.
    let g = holder
        .acquire(&name, &opts.wait(lockcore::Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let expired = Instant::now();
    assert!(hb.expire_sessions().await.expect("expire") >= 1);
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("the holder's lost signal after its session expired");
    let lost_after = expired.elapsed();
    assert!(
        nodes(&ctx, &name).await.is_empty(),
        "the expired holder's node is left"
    );
    drop(g);

    // Under a waiter: the third client holds, the waiter queues, its
    // session expires while it waits.
    let g3 = third
        .acquire(&name, &opts.wait(lockcore::Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let w = {
        let (waiter, n, opts) = (waiter.clone(), name.clone(), opts);
        tokio::spawn(async move {
            // Long enough that expiring its session (a few tries, each up
            // to a connect timeout and a session timeout) ends within it.
            waiter
                .acquire(
                    &n,
                    &opts.wait(lockcore::Wait::For(Duration::from_secs(120))),
                )
                .await
        })
    };
    until_waiters(&third, &name, 1).await;
    assert!(wb.expire_sessions().await.expect("expire") >= 1);
    // The wait ends with an error, or goes on with a new session and node;
    // either way it is not granted while the third client holds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if w.is_finished() {
        match w.await.expect("waiter task") {
            Ok(Some(_)) => panic!("the waiter was granted the lock after its session expired, while another client holds it (CURATOR-604)"),
            Ok(None) => panic!("the wait timed out early"),
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Indeterminate),
                "the waiter's error: {e}"
            ),
        }
        // It asks again, with a new session: still behind the holder.
        let again = waiter
            .acquire(&name, &opts.wait(lockcore::Wait::Try))
            .await
            .expect("try after the expiry");
        assert!(
            again.is_none(),
            "granted while another client holds the name (CURATOR-604)"
        );
    } else {
        assert!(!w.is_finished());
        // Still waiting: the release hands over to it, under a live session.
        g3.release().await.expect("release");
        let g2 = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("the waiter gets the lock after the release")
            .expect("waiter task")
            .expect("acquire")
            .expect("granted");
        assert!(g2.is_held());
        must_not_get(&holder, &name).await;
        g2.release().await.expect("release");
        assert!(
            nodes(&ctx, &name).await.is_empty(),
            "nodes left: {:?}",
            nodes(&ctx, &name).await
        );
        println!("FIGURES zk_session_expiry zk: holder_lost_after_expiry={}ms, waiter=went_on_with_a_new_session", lost_after.as_millis());
        return;
    }
    must_not_get(&holder, &name).await;
    g3.release().await.expect("release");
    let g2 = waiter
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("the waiter gets it once free");
    g2.release().await.expect("release");
    assert!(
        nodes(&ctx, &name).await.is_empty(),
        "nodes left: {:?}",
        nodes(&ctx, &name).await
    );
    println!("FIGURES zk_session_expiry zk: holder_lost_after_expiry={}ms, waiter=failed_cleanly_then_waited_again", lost_after.as_millis());
}

/// `l` cannot take `name` now (proven by a try on the server).
async fn must_not_get(l: &Locker, name: &str) {
    assert!(
        l.try_lock(name).await.expect("try").is_none(),
        "a second client got {name}"
    );
}

/// Nodes written as Curator's `InterProcessMutex` and kazoo's `Lock` write
/// them make our acquire wait; ours make Curator's ordering wait.
async fn curator_and_kazoo_nodes_are_contenders(ctx: Ctx) {
    let cfg = cfg(&ctx);
    let l = Locker::from_arc(backend(&ctx).await);
    let raw = raw(&ctx).await;
    let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for (case, prefix) in [
        ("curator", "_c_5f1e0c3a-2b7d-4e43-9a4e-1f2d3c4b5a69-lock-"),
        ("kazoo", "8f14e45fceea167a5a36dedd4bea2543__lock__"),
    ] {
        let name = ctx.name(case);
        let parent = lockcore_zk::lock_parent(&cfg, &name);
        raw.mkdir(&parent, &dir).await.expect("parent");
        let (_, seq) = raw
            .create(&format!("{parent}/{prefix}"), b"10.0.0.7", &eph)
            .await
            .expect("foreign node");
        let foreign = format!("{parent}/{prefix}{seq}");
        assert!(
            l.try_lock(&name).await.expect("try").is_none(),
            "{case} node ignored"
        );
        let err = l
            .lock_timeout(&name, Duration::from_millis(500))
            .await
            .expect_err("waits behind the foreign node");
        assert_eq!(err.kind(), ErrorKind::Timeout);
        let waiter = {
            let (l, n) = (l.clone(), name.clone());
            tokio::spawn(async move { l.lock(&n).await.expect("acquires after the foreign node") })
        };
        until_waiters(&l, &name, 1).await;
        let deleted = Instant::now();
        raw.delete(&foreign, None).await.expect("foreign release");
        let g = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the foreign release")
            .expect("task");
        println!(
            "zk: woken {:?} after the {case} node was deleted",
            deleted.elapsed()
        );
        // Now we hold: a Curator contender arriving sorts after us.
        let (_, seq2) = raw
            .create(
                &format!("{parent}/_c_00000000-0000-0000-0000-000000000000-lock-"),
                b"",
                &eph,
            )
            .await
            .expect("curator contender");
        let mut children = raw.list_children(&parent).await.expect("children");
        // Curator's StandardLockInternalsDriver.fixForSorting: the part after "lock-".
        children.sort_by_key(|c| match c.rfind("lock-") {
            Some(i) => c[i + 5..].to_owned(),
            None => c.clone(),
        });
        let curator_pos = children
            .iter()
            .position(|c| c.ends_with(&format!("{seq2}")))
            .expect("listed");
        assert_eq!(
            curator_pos, 1,
            "Curator would not wait behind us: {children:?}"
        );
        g.release().await.expect("release");
        raw.delete(
            &format!("{parent}/_c_00000000-0000-0000-0000-000000000000-lock-{seq2}"),
            None,
        )
        .await
        .expect("cleanup");
    }
}

/// kazoo's `ReadLock` and `WriteLock` nodes, written as kazoo writes them:
/// our reader reads beside a kazoo reader and waits for a kazoo writer;
/// our writer waits for either.
async fn kazoo_read_and_write_nodes_are_contenders(ctx: Ctx) {
    let cfg = cfg(&ctx);
    let l = Locker::from_arc(backend(&ctx).await);
    let raw = raw(&ctx).await;
    let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for (case, mark, reads_beside) in [("rlock", "__rlock__", true), ("wlock", "__lock__", false)] {
        let name = ctx.name(case);
        let rw = lockcore::RwLock::new(&l, &name).expect("rwlock");
        let parent = lockcore_zk::lock_parent(&cfg, &name);
        raw.mkdir(&parent, &dir).await.expect("parent");
        let (_, seq) = raw
            .create(
                &format!("{parent}/8f14e45fceea167a5a36dedd4bea2543{mark}"),
                b"",
                &eph,
            )
            .await
            .expect("kazoo node");
        rw_beside_a_foreign_hold(&rw, reads_beside, &format!("a kazoo {case}")).await;
        raw.delete(
            &format!("{parent}/8f14e45fceea167a5a36dedd4bea2543{mark}{seq}"),
            None,
        )
        .await
        .expect("kazoo release");
        let w = rw
            .try_write()
            .await
            .expect("try_write")
            .expect("free again");
        w.release().await.expect("release");
    }
}

/// A real Curator client (Java, `backend-zk/tests/curator/CuratorProbe.java`
/// on Debian's `libcurator-recipes-java`), driven line by line.
struct Curator {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Curator {
    /// Starts the probe on `path` with participant id `id`.
    async fn start(ctx: &Ctx, path: &str, id: &str) -> Self {
        use tokio::io::AsyncBufReadExt;
        let jars = [
            "curator-client",
            "curator-framework",
            "curator-recipes",
            "zookeeper",
            "zookeeper-jute",
            "guava",
            "slf4j-api",
            "slf4j-nop",
        ];
        let cp: Vec<String> = jars
            .iter()
            .map(|j| format!("/usr/share/java/{j}.jar"))
            .collect();
        for jar in &cp {
            assert!(
                std::path::Path::new(jar).exists(),
                "{jar} is missing: apt-get install libcurator-recipes-java (compose/local up installs it)"
            );
        }
        let probe = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/curator/CuratorProbe.java"
        );
        let mut child = tokio::process::Command::new("java")
            .arg("-cp")
            .arg(cp.join(":"))
            .arg(probe)
            .args([&hosts(ctx), path, id])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("java runs");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let mut probe = Curator {
            child,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
        };
        assert_eq!(probe.line().await, "ready");
        probe
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the Curator probe answers")
            .expect("read")
            .expect("the Curator probe is running")
    }

    /// Sends `cmd` and returns the probe's answer.
    async fn ask(&mut self, cmd: &str) -> String {
        self.stdin
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .expect("write");
        self.stdin.flush().await.expect("flush");
        self.line().await
    }

    /// Closes the probe's input and waits for it to exit cleanly.
    async fn stop(self) {
        let Curator {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("the Curator probe exits")
            .expect("wait");
        assert!(status.success(), "the Curator probe: {status}");
    }
}

/// Our elections and Curator's `LeaderLatch` on one path: one leader among
/// both, each side names the other's leader with its value, and leadership
/// passes both ways on resignation (our election nodes are `LeaderLatch`'s,
/// `_c_<uuid>-latch-<seq>`, with the value as data).
async fn curator_leader_latch_interoperates(ctx: Ctx) {
    let l = Locker::from_arc(backend(&ctx).await);
    let name = ctx.name("latch");
    let path = lockcore_zk::lock_parent(&cfg(&ctx), &name);
    let ours = lockcore::Election::new(&l, &name).expect("election");

    // Curator leads: we see it, and do not lead beside it.
    let mut a = Curator::start(&ctx, &path, "java-a").await;
    assert_eq!(a.ask("campaign").await, "queued");
    assert_eq!(a.ask("await-leader 10000").await, "leader");
    let seen = ours.leader().await.expect("leader").expect("a leader");
    assert_eq!(seen.value, "java-a", "our observer names Curator's leader");
    assert!(
        ours.try_campaign("ours").await.expect("try").is_none(),
        "we led beside Curator's leader"
    );
    let campaign = {
        let ours = ours.clone();
        tokio::spawn(async move { ours.campaign("ours").await.expect("campaign") })
    };
    until_waiters(&l, &name, 1).await;
    assert_eq!(
        a.ask("is-leader").await,
        "leader",
        "Curator lost the lead to our waiter"
    );

    // Curator resigns: ours leads, and a Curator candidate waits and names it.
    assert_eq!(a.ask("resign").await, "resigned");
    let lead = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("ours leads once Curator resigned")
        .expect("task");
    let mut b = Curator::start(&ctx, &path, "java-b").await;
    assert_eq!(b.ask("campaign").await, "queued");
    assert_eq!(
        b.ask("is-leader").await,
        "not-leader",
        "Curator led beside ours"
    );
    assert_eq!(b.ask("leader").await, "leader=ours");
    assert_eq!(a.ask("leader").await, "leader=ours");

    // Ours resigns: Curator's candidate leads.
    lead.resign().await.expect("resign");
    assert_eq!(b.ask("await-leader 10000").await, "leader");
    let seen = ours.leader().await.expect("leader").expect("a leader");
    assert_eq!(seen.value, "java-b");
    a.stop().await;
    b.stop().await;
}

/// Our lock and Curator's `InterProcessMutex` on one path exclude each
/// other, both ways, with real Curator clients.
async fn curator_mutex_interoperates(ctx: Ctx) {
    let l = Locker::from_arc(backend(&ctx).await);
    let name = ctx.name("mutex");
    let path = lockcore_zk::lock_parent(&cfg(&ctx), &name);
    let mut c = Curator::start(&ctx, &path, "java").await;
    assert_eq!(c.ask("lock 5000").await, "locked");
    assert!(
        l.try_lock(&name).await.expect("try").is_none(),
        "we took a name Curator holds"
    );
    let waiter = {
        let (l, n) = (l.clone(), name.clone());
        tokio::spawn(async move { l.lock(&n).await.expect("lock") })
    };
    until_waiters(&l, &name, 1).await;
    assert_eq!(c.ask("unlock").await, "unlocked");
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("ours gets the name Curator released")
        .expect("task");
    assert_eq!(
        c.ask("lock 300").await,
        "busy",
        "Curator took a name we hold"
    );
    g.release().await.expect("release");
    assert_eq!(c.ask("lock 5000").await, "locked");
    assert_eq!(c.ask("unlock").await, "unlocked");
    c.stop().await;
}

/// Our read-write lock and Curator's `InterProcessReadWriteLock` on one
/// path, with real Curator clients: readers share across both, a writer
/// of either side excludes the other side's readers and writers, and a
/// waiting writer of ours holds back Curator's new readers (writers first
/// on both sides: one queue of `_c_<uuid>-__READ__<seq>` and
/// `-__WRIT__<seq>` nodes).
async fn curator_rwlock_interoperates(ctx: Ctx) {
    let l = Locker::from_arc(backend(&ctx).await);
    let name = ctx.name("rw");
    let path = lockcore_zk::lock_parent(&cfg(&ctx), &name);
    let ours = lockcore::RwLock::new(&l, &name).expect("rwlock");
    let mut c = Curator::start(&ctx, &path, "java").await;

    // Curator reads: ours reads beside it, and cannot write.
    assert_eq!(c.ask("read 5000").await, "locked");
    let r = ours.try_read().await.expect("try_read");
    r.expect("our reader was refused beside Curator's")
        .release()
        .await
        .expect("release");
    assert!(
        ours.try_write().await.expect("try_write").is_none(),
        "we wrote beside Curator's reader"
    );

    // Our writer waits for Curator's reader, and holds back Curator's next.
    let writer = {
        let ours = ours.clone();
        tokio::spawn(async move {
            ours.write(&LockOptions::new().wait(lockcore::Wait::For(Duration::from_secs(30))))
                .await
                .expect("write")
                .expect("a write lock")
        })
    };
    until_children(&raw(&ctx).await, &path, 2).await;
    let mut d = Curator::start(&ctx, &path, "java-d").await;
    assert_eq!(
        d.ask("read 300").await,
        "busy",
        "Curator's new reader passed our waiting writer"
    );
    assert_eq!(c.ask("unread").await, "unlocked");
    let w = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("ours writes once Curator's reader left")
        .expect("task");
    assert_eq!(
        d.ask("read 300").await,
        "busy",
        "Curator read while we wrote"
    );
    assert_eq!(
        d.ask("write 300").await,
        "busy",
        "Curator wrote while we wrote"
    );
    w.release().await.expect("release");

    // Curator writes: ours can neither read nor write.
    assert_eq!(c.ask("write 5000").await, "locked");
    assert!(
        ours.try_read().await.expect("try_read").is_none(),
        "we read while Curator wrote"
    );
    assert!(
        ours.try_write().await.expect("try_write").is_none(),
        "we wrote while Curator wrote"
    );
    assert_eq!(c.ask("unwrite").await, "unlocked");
    let r = ours
        .try_read()
        .await
        .expect("try_read")
        .expect("free again");
    assert_eq!(d.ask("read 5000").await, "locked", "readers share");
    assert_eq!(d.ask("unread").await, "unlocked");
    r.release().await.expect("release");
    c.stop().await;
    d.stop().await;
}

/// Our semaphore and Curator's `InterProcessSemaphoreV2` of 2 on one
/// path, with real Curator clients: together they never hold more than 2
/// permits, a waiter of ours gets the lease Curator returns, and Curator
/// gets the one we return (one `leases` node per permit, taken under the
/// `locks` mutex).
async fn curator_semaphore_interoperates(ctx: Ctx) {
    let l = Locker::from_arc(backend(&ctx).await);
    let name = ctx.name("sem");
    let path = lockcore_zk::lock_parent(&cfg(&ctx), &name);
    let ours = lockcore::Semaphore::new(&l, &name, 2).expect("semaphore");
    let mut c = Curator::start(&ctx, &path, "java").await;

    assert_eq!(c.ask("permit 2 5000").await, "locked");
    let mine = ours
        .try_acquire()
        .await
        .expect("try")
        .expect("the second permit");
    assert!(
        ours.try_acquire().await.expect("try").is_none(),
        "we took a third permit beside Curator's"
    );
    assert_eq!(
        c.ask("permit 2 300").await,
        "busy",
        "Curator took a third permit beside ours"
    );

    // Our waiter gets the permit Curator returns.
    let waiter = {
        let ours = ours.clone();
        tokio::spawn(async move {
            ours.acquire_timeout(Duration::from_secs(30))
                .await
                .expect("a permit")
        })
    };
    until_children(&raw(&ctx).await, &format!("{path}/leases"), 3).await;
    assert_eq!(c.ask("unpermit").await, "unlocked");
    let second = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("ours gets the permit Curator returned")
        .expect("task");
    assert_eq!(
        c.ask("permit 2 300").await,
        "busy",
        "Curator beside our two"
    );

    // Curator gets the permit we return.
    mine.release().await.expect("release");
    assert_eq!(c.ask("permit 2 5000").await, "locked");
    assert!(
        ours.try_acquire().await.expect("try").is_none(),
        "a third permit beside Curator's and ours"
    );
    assert_eq!(c.ask("unpermit").await, "unlocked");
    second.release().await.expect("release");
    c.stop().await;
}

/// A ttl below the server's minSessionTimeout (2 s here) is raised, with an
/// honest validity; one above maxSessionTimeout (60 s) is refused, naming it.
async fn ttl_outside_server_bounds(ctx: Ctx) {
    let b = backend(&ctx).await;
    let l = Locker::from_arc(b.clone());
    let name = ctx.name("bounds");
    let t = Instant::now();
    let g = l
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(1))
                .wait(lockcore::Wait::Try),
        )
        .await
        .expect("a 1 s ttl is raised to the server minimum")
        .expect("free");
    assert!(g.valid_until().expect("held") <= t + Duration::from_secs(1));
    g.release().await.expect("release");
    let err = l
        .acquire(&name, &LockOptions::new().ttl(Duration::from_secs(120)))
        .await
        .expect_err("a 120 s ttl exceeds maxSessionTimeout");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("60s"), "{err}");
    assert!(l.try_lock(&name).await.expect("try").is_some());
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        harness::target("zk-soak", "LOCKTEST_ZK_URL")
            .only_own_cases()
            .case("soak", |ctx| Box::pin(soak_pausing(ctx, "zk"))),
        own_cases!(
            Target::new("zk", Some("LOCKTEST_ZK_URL"), |url| async move {
                Ok(Arc::new(Zk { url }) as Arc<dyn Harness>)
            })
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            fifty_waiters_one_wakeup_per_release,
            session_expiry_under_holder_and_waiter,
            ttl_outside_server_bounds,
            sessions_do_not_pile_up,
            first_acquires_at_once_share_one_session,
            renewals_cost_one_request_per_session,
            shared_renewals_outlast_a_slow_server,
            tries_on_a_silent_ensemble_end_together,
            a_release_cut_off_by_a_partition_frees_the_name,
            release_deletes_a_late_twin,
            curator_and_kazoo_nodes_are_contenders,
            curator_mutex_interoperates,
            curator_leader_latch_interoperates,
            kazoo_read_and_write_nodes_are_contenders,
            curator_semaphore_interoperates,
            curator_rwlock_interoperates,
            expired_session_fires_lost_and_next_waiter_gets_it,
            a_session_end_raises_every_lease_on_it,
            a_session_given_up_raises_every_lease_on_it,
        ),
        own_cases!(
            Target::new(
                "zk-ensemble",
                Some("LOCKTEST_ZK_ENSEMBLE_URL"),
                |url| async move { Ok(Arc::new(Zk { url }) as Arc<dyn Harness>) },
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            inspect_through_a_follower_sees_every_write,
            leader_killed_while_held,
        ),
    ])
}
