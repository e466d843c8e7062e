//! Lease recycling, checked on the server: a lock cycle costs two durable
//! writes (counted by the server's `etcd_server_proposals_committed_total`),
//! a cleanly released lease serves the next acquisition with the same ttl,
//! and abandoned, lost or differently sized leases are never reused; the
//! renewals of many held locks share a few keep-alive streams and batched key
//! reads (counted by the server's `grpc_server_started_total`). One case at
//! a time, since the counts are the whole server's.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

mod common;

use common::{connect, delete_and_see_it_alone_lost, holder_lease, metric, raw, shared_lease_of};
use etcd_client::{Client, GetOptions};
use lockcore::{LockOptions, Wait};
use lockcore_conformance::cases::{hold_all, must_be_held};
use lockcore_conformance::own_cases;
use lockcore_conformance::{run_serial, Ctx, Target, UrlHarness, COMPOSE_HINT};
use lockcore_etcd::{lock_range, EtcdBackend, EtcdConfig, DEFAULT_PREFIX};

/// The proposals the server has committed (every durable write, lease
/// grants and revokes included; keepalives are not proposals).
async fn proposals(ctx: &Ctx) -> u64 {
    metric(ctx, "etcd_server_proposals_committed_total").await
}

/// The gRPC calls of `method` the server has begun (a stream counts once).
async fn calls(ctx: &Ctx, service: &str, method: &str, kind: &str) -> u64 {
    let series = format!(
        "grpc_server_started_total{{grpc_method=\"{method}\",grpc_service=\"etcdserverpb.{service}\",grpc_type=\"{kind}\"}}"
    );
    metric(ctx, &series).await
}

fn opts(ttl: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(ttl))
        .wait(Wait::For(Duration::from_secs(10)))
}

/// One acquire and release of `name` with a ttl of `ttl` seconds.
async fn cycle(l: &lockcore::Locker, name: &str, ttl: u64) {
    l.acquire(name, &opts(ttl))
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
}

/// Lock cycles on one name cost two durable writes each (put and delete),
/// not four (grant, put, delete, revoke).
async fn two_durable_writes_per_cycle(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let name = ctx.name("cycle");
    // The first cycle grants the lease that the others reuse.
    cycle(&l, &name, 5).await;
    let cycles = 50;
    let before = proposals(&ctx).await;
    for _ in 0..cycles {
        cycle(&l, &name, 5).await;
    }
    let writes = proposals(&ctx).await - before;
    // A little room for the server's own proposals (none are expected).
    assert!(
        writes <= 2 * cycles + 3,
        "{writes} durable writes for {cycles} lock cycles; 2 per cycle expected"
    );
}

/// A released lock's lease serves the next acquisition with the same ttl,
/// of this or another name; another ttl gets its own lease.
async fn released_lease_serves_the_next_lock(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let (a, b) = (ctx.name("a"), ctx.name("b"));
    let g = l.acquire(&a, &opts(5)).await.unwrap().unwrap();
    let first = holder_lease(&mut c, &a).await.expect("a key for a");
    g.release().await.unwrap();
    assert_eq!(holder_lease(&mut c, &a).await, None, "released: no key");
    let alive = c.lease_time_to_live(first, None).await.expect("ttl");
    assert!(alive.ttl() > 0, "the released lock's lease stays granted");

    let g = l.acquire(&b, &opts(5)).await.unwrap().unwrap();
    assert_eq!(holder_lease(&mut c, &b).await, Some(first), "reused");
    let other = l.acquire(&a, &opts(7)).await.unwrap().unwrap();
    let seven = holder_lease(&mut c, &a).await.expect("a key for a");
    assert_ne!(seven, first, "a ttl of 7 s does not take a 5 s lease");
    let left = c.lease_time_to_live(seven, None).await.expect("ttl");
    assert!(left.granted_ttl() >= 7, "granted {}", left.granted_ttl());
    g.release().await.unwrap();
    other.release().await.unwrap();
}

/// A recycled lease is renewed when taken: a lock taken with no watchdog on
/// a lease left idle lives its own ttl, not the lease's remainder.
async fn recycled_lease_gets_its_whole_ttl(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let name = ctx.name("whole");
    let ttl = 6;
    let g = l.acquire(&name, &opts(ttl)).await.unwrap().unwrap();
    let id = holder_lease(&mut c, &name).await.expect("key");
    g.release().await.unwrap();
    // Let the idle lease run down, but not past the margin of one request.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let g = l
        .acquire(&name, &opts(ttl).renew(false))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder_lease(&mut c, &name).await, Some(id), "reused");
    let left = c.lease_time_to_live(id, None).await.expect("ttl").ttl();
    assert!(
        left >= ttl as i64 - 1,
        "the taken lease has {left} s left of its {ttl} s"
    );
    g.release().await.unwrap();
}

/// Abandoned and lost leases are never reused: the next lock gets a new
/// lease, and the abandoned lock stays held on the server until its ttl.
async fn abandoned_and_lost_leases_are_not_reused(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let other = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let (a, b, d) = (ctx.name("a"), ctx.name("b"), ctx.name("d"));
    // A released lease to tempt the next acquisitions.
    cycle(&l, &d, 3).await;
    let spare = c
        .leases()
        .await
        .expect("leases")
        .leases()
        .iter()
        .map(|s| s.id())
        .collect::<Vec<_>>();

    let g = l.acquire(&a, &opts(3)).await.unwrap().unwrap();
    let abandoned = holder_lease(&mut c, &a).await.expect("key");
    assert!(spare.contains(&abandoned), "the spare lease was taken");
    g.abandon();
    let g = l.acquire(&b, &opts(3)).await.unwrap().unwrap();
    let next = holder_lease(&mut c, &b).await.expect("key");
    assert_ne!(next, abandoned, "an abandoned lease was reused");
    assert!(
        other.try_lock(&a).await.unwrap().is_none(),
        "the abandoned lock is still held on the server"
    );

    // Lost: the lease revoked behind the holder's back.
    c.lease_revoke(next).await.expect("revoke");
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost fires");
    let _ = g.release().await;
    let g = l.acquire(&b, &opts(3)).await.unwrap().unwrap();
    let after = holder_lease(&mut c, &b).await.expect("key");
    assert_ne!(after, next, "a lost lease was reused");
    g.release().await.unwrap();

    let start = Instant::now();
    let g = other.acquire(&a, &opts(3)).await.unwrap().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "the abandoned lock ended by its ttl"
    );
    g.release().await.unwrap();
}

/// A lease released twice through one handle (as a lost relay and then the
/// user's release can do) is not revoked by the second release, when
/// another lock already holds it again.
async fn a_second_release_leaves_a_reused_lease_alone(ctx: Ctx) {
    use lockcore::raw::{AcquireRequest, Backend, Deadline, OwnerToken, Released, Renewal};
    let b = EtcdBackend::connect(EtcdConfig::parse(&ctx.config).expect("config"))
        .await
        .expect("connect");
    let mut c = raw(&ctx).await;
    let (a, n) = (ctx.name("twice-a"), ctx.name("twice-b"));
    let lost = lockcore::raw::prelude::CancellationToken::new();
    let req = |name: &'static str| AcquireRequest {
        name,
        owner: OwnerToken::random(),
        ttl: Duration::from_secs(5),
        lock_delay: Duration::ZERO,
        deadline: Deadline::Now,
        lost: &lost,
        value: None,
        mode: lockcore::raw::Mode::Exclusive,
        // Renewed by hand: it keeps its own lease (a renewed one moves).
        renew: false,
    };
    let (a, n): (&'static str, &'static str) = (a.leak(), n.leak());
    let g1 = b.acquire(req(a)).await.unwrap().expect("a");
    assert_eq!(g1.lease.release().await.unwrap(), Released::Released);
    let g2 = b.acquire(req(n)).await.unwrap().expect("b");
    let lease = holder_lease(&mut c, n).await.expect("b's key");
    assert_eq!(g1.lease.release().await.unwrap(), Released::NotHeld);
    assert!(
        matches!(
            g2.lease.renew(Duration::from_secs(5)).await,
            Ok(Renewal::Renewed { .. })
        ),
        "the other lock's lease was revoked"
    );
    assert_eq!(
        holder_lease(&mut c, n).await,
        Some(lease),
        "b's key is gone"
    );
    g2.lease.release().await.unwrap();
}

/// The keys under `name`'s range, read on the server.
async fn keys_of(c: &mut Client, name: &str) -> usize {
    let range = lock_range(DEFAULT_PREFIX, name);
    c.get(range, Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .kvs()
        .len()
}

/// A `try` that finds the name held, and a waiter that gives up, delete
/// their key and keep their lease spare, as `concurrency.Mutex` keeps its
/// session (one durable write, the delete, and no grant for the next
/// acquisition): the next lock of the handle takes that same lease.
async fn failed_tries_keep_their_lease_spare(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let other = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let (held, next) = (ctx.name("held"), ctx.name("next"));
    let h = other.acquire(&held, &opts(5)).await.unwrap().unwrap();
    for wait in [Wait::Try, Wait::For(Duration::from_millis(300))] {
        // A spare lease to start from, whose id is known.
        let g = l.acquire(&next, &opts(5)).await.unwrap().unwrap();
        let id = holder_lease(&mut c, &next).await.expect("a key for next");
        g.release().await.unwrap();
        match l.acquire(&held, &opts(5).wait(wait)).await {
            Ok(None) => {}
            Err(e) if e.kind() == lockcore::ErrorKind::Timeout => {}
            Ok(Some(_)) => panic!("{wait:?}: granted a held name"),
            Err(e) => panic!("{wait:?}: {e}"),
        }
        assert_eq!(keys_of(&mut c, &held).await, 1, "{wait:?}: a key was left");
        let alive = c.lease_time_to_live(id, None).await.expect("ttl").ttl();
        assert!(alive > 0, "{wait:?}: the lease was revoked");
        let g = l.acquire(&next, &opts(5)).await.unwrap().unwrap();
        assert_eq!(
            holder_lease(&mut c, &next).await,
            Some(id),
            "{wait:?}: the next lock did not take the lease back"
        );
        g.release().await.unwrap();
    }
    h.release().await.unwrap();
}

/// The spare leases of a backend are revoked when it is dropped.
async fn spares_are_revoked_with_the_backend(ctx: Ctx) {
    let mut c = raw(&ctx).await;
    let name = ctx.name("dropped");
    let l = ctx.harness.connect().await.expect("connect");
    let g = l.acquire(&name, &opts(9)).await.unwrap().unwrap();
    let id = holder_lease(&mut c, &name).await.expect("key");
    g.release().await.unwrap();
    assert!(
        c.lease_time_to_live(id, None).await.unwrap().ttl() > 0,
        "spare"
    );
    drop(l);
    lockcore::cleanup::flush(Duration::from_secs(5)).await;
    let left = c.lease_time_to_live(id, None).await.unwrap().ttl();
    assert!(
        left <= 0,
        "the spare lease outlived its backend ({left} s left)"
    );
}

/// A multi-name try of free names is one transaction: the store's
/// revision moves by one, every name's token is that revision, and each
/// name has a key on a lease of its own. Cycles after the first reuse the
/// released leases: one put for all the names and a delete per name, no
/// grant. A try over a set with a name held puts nothing.
async fn multi_try_is_one_transaction(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names = [
        ctx.name("multi/a"),
        ctx.name("multi/b"),
        ctx.name("multi/c"),
    ];
    let revision = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            c.get("lockcore-test-revision", None)
                .await
                .expect("get")
                .header()
                .expect("header")
                .revision()
        }
    };
    let before = revision(&mut c).await;
    let m = l
        .try_lock_all(&names)
        .await
        .expect("try all")
        .expect("free");
    let after = revision(&mut c).await;
    assert_eq!(after - before, 1, "not one transaction");
    let mut leases = Vec::new();
    for n in &names {
        assert_eq!(m.fence(n), Some(after as u64), "{n}'s token");
        leases.push(holder_lease(&mut c, n).await.expect("a key"));
    }
    leases.sort_unstable();
    leases.dedup();
    assert_eq!(leases.len(), names.len(), "the names share a lease");
    m.release().await.expect("release");
    let cycles = 10;
    let before = proposals(&ctx).await;
    for _ in 0..cycles {
        l.try_lock_all(&names)
            .await
            .expect("try all")
            .expect("free")
            .release()
            .await
            .expect("release");
    }
    let writes = proposals(&ctx).await - before;
    assert!(
        writes <= (1 + 3) * cycles + 3,
        "{writes} durable writes for {cycles} cycles of three names; 4 per cycle expected"
    );
    let other = ctx.harness.connect().await.expect("connect");
    let held = other.try_lock(&names[1]).await.expect("try").expect("free");
    let before = revision(&mut c).await;
    assert!(l.try_lock_all(&names).await.expect("try all").is_none());
    assert_eq!(revision(&mut c).await, before, "a refused try wrote");
    held.release().await.expect("release");
}

/// 300 locks held by one backend, renewed every second for 4 s: their
/// keepalives share a few long-lived streams (a stream per renewal cost a
/// set-up and a reset each, and thousands of resets make the server close
/// the connection), their key reads share transactions, and every lock
/// stays held on the server.
async fn renewals_share_a_few_streams(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let names: Vec<String> = (0..300).map(|i| ctx.name(&format!("many/{i}"))).collect();
    let guards = hold_all(&l, &names, Duration::from_secs(3)).await;
    // Past the first renewals, whose moves onto the shared lease are writes.
    let mut c = raw(&ctx).await;
    shared_lease_of(&mut c, &names, Duration::from_secs(3)).await;
    let streams = || calls(&ctx, "Lease", "LeaseKeepAlive", "bidi_stream");
    let reads = || async {
        calls(&ctx, "KV", "Range", "unary").await + calls(&ctx, "KV", "Txn", "unary").await
    };
    let (streams_before, reads_before) = (streams().await, reads().await);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let streams = streams().await - streams_before;
    let reads = reads().await - reads_before;
    eprintln!(
        "FIGURES renewals_share_a_few_streams etcd: keepalive_streams_in_4s_for_300_locks={streams} key_read_requests={reads}"
    );
    // Per renewal: 300 locks x 4 renewals = 1,200 streams and 1,200 reads.
    // The backend keeps 16, opened on first use (and a few more, if the
    // server or another client on it reset some).
    assert!(
        streams <= 32,
        "{streams} keep-alive streams opened in 4 s of renewals of 300 locks"
    );
    assert!(
        reads < 300,
        "{reads} read requests in 4 s of renewals of 300 locks"
    );
    assert!(guards.iter().all(lockcore::LockGuard::is_held));
    let other = ctx.harness.connect().await.expect("connect");
    for i in [0, 150, 299] {
        must_be_held(&other, &ctx.name(&format!("many/{i}"))).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

/// A free loopback port (bound and let go).
async fn free_port() -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    l.local_addr().expect("addr").port()
}

/// A private etcd member that accepts at most 4 operations per
/// transaction (`--max-txn-ops 4`), killed with the returned child.
async fn etcd_with_few_txn_ops() -> (tokio::process::Child, String, std::path::PathBuf) {
    let (client, peer) = (free_port().await, free_port().await);
    let dir = std::env::temp_dir().join(format!("lockcore-etcd-txn-ops-{client}"));
    let _ = std::fs::remove_dir_all(&dir);
    let child = tokio::process::Command::new("etcd")
        .args([
            "--name=few",
            &format!("--data-dir={}", dir.display()),
            &format!("--listen-client-urls=http://127.0.0.1:{client}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{client}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            &format!("--initial-cluster=few=http://127.0.0.1:{peer}"),
            "--max-txn-ops=4",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("etcd (from the etcd-server package) on the PATH");
    let url = format!("etcd://127.0.0.1:{client}");
    let give_up = Instant::now() + Duration::from_secs(30);
    while lockcore_etcd::connect(&url).await.is_err() {
        assert!(Instant::now() < give_up, "the private etcd did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, url, dir)
}

/// On a server that refuses transactions of more than 4 operations, the
/// batched key reads of renewals go in smaller transactions: 200 locks
/// renewed for two ttls all stay held, on the server too.
async fn renewals_fit_the_servers_txn_limit(_ctx: Ctx) {
    let (child, url, dir) = etcd_with_few_txn_ops().await;
    let l = lockcore_etcd::connect(&url).await.expect("connect");
    let names: Vec<String> = (0..200).map(|i| format!("few/{i}")).collect();
    let guards = hold_all(&l, &names, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 200 locks lost");
    let other = lockcore_etcd::connect(&url).await.expect("connect");
    for i in [0, 100, 199] {
        must_be_held(&other, &format!("few/{i}")).await;
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lock key deleted on the server while its lease lives (`etcdctl del`):
/// the renewal that finds it gone raises the lost signal, and the locks
/// whose keys were checked in the same transaction stay held, on the
/// server too.
async fn a_deleted_key_is_lost_and_only_it(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let names: Vec<String> = (0..20).map(|i| ctx.name(&format!("del/{i}"))).collect();
    let ttl = Duration::from_secs(2);
    let guards = hold_all(&l, &names, ttl).await;
    let mut c = raw(&ctx).await;
    delete_and_see_it_alone_lost(&ctx, &mut c, &names, &guards, 7, ttl).await;
    for g in guards {
        let _ = g.release().await;
    }
}

fn main() -> std::process::ExitCode {
    let url = |s: String| async move { Ok(UrlHarness::shared(s, connect)) };
    run_serial(vec![own_cases!(
        Target::new("etcd-leases", Some("LOCKTEST_ETCD_URL"), url)
            .hint(COMPOSE_HINT)
            .only_own_cases(),
        two_durable_writes_per_cycle,
        released_lease_serves_the_next_lock,
        recycled_lease_gets_its_whole_ttl,
        abandoned_and_lost_leases_are_not_reused,
        a_second_release_leaves_a_reused_lease_alone,
        failed_tries_keep_their_lease_spare,
        spares_are_revoked_with_the_backend,
        multi_try_is_one_transaction,
        renewals_share_a_few_streams,
        renewals_fit_the_servers_txn_limit,
        a_deleted_key_is_lost_and_only_it,
    )])
}
