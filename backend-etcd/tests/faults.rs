//! etcd-specific faults (servers from compose/, one case at a time since
//! some stop servers): the cluster's leader killed under contention, a
//! stalled holder, a compaction during a long wait, and interoperation with
//! `etcdctl lock` and `etcdctl elect`.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{CompactionOptions, GetOptions};
use lockcore::testing::history::History;
use lockcore::{ErrorKind, LockOptions, Locker, Wait};
use lockcore_conformance::own_cases;
use lockcore_conformance::{
    compose, run_serial, soak_pausing, ClientPause, ConnectFuture, Ctx, Dir, Proxies, Target,
    UndoOnDrop, UrlHarness, COMPOSE_HINT,
};
use lockcore_etcd::{lock_range, EtcdBackend, EtcdConfig, DEFAULT_PREFIX};
use tokio::io::{AsyncBufReadExt, BufReader};

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_etcd::connect(&url).await })
}

async fn backend(ctx: &Ctx) -> EtcdBackend {
    EtcdBackend::connect(EtcdConfig::parse(&ctx.config).expect("config"))
        .await
        .expect("connect")
}

/// Polls `f` every 20 ms until it is true, failing after `within`.
async fn until<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn waiters(l: &Locker, name: &str) -> usize {
    l.inspect(name)
        .await
        .expect("inspect")
        .and_then(|i| i.waiters)
        .unwrap_or(0)
}

/// The index (0-based, in `LOCKTEST_ETCD_CLUSTER_URL` order) of the leader.
/// The `http://host:port` endpoint of each member an `etcd://` URL names.
fn endpoints(ctx: &Ctx) -> Vec<String> {
    lockcore::raw::address::ServerUrl::parse(&ctx.config, 2379)
        .map(|u| u.hosts.iter().map(|h| format!("http://{h}")).collect())
        .expect("an etcd:// URL")
}

async fn leader(endpoints: &[String]) -> usize {
    for (i, ep) in endpoints.iter().enumerate() {
        let Ok(mut c) = etcd_client::Client::connect([ep.as_str()], None).await else {
            continue;
        };
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), c.status()).await {
            if s.header().map(|h| h.member_id()) == Some(s.leader()) {
                return i;
            }
        }
    }
    panic!("no member of {endpoints:?} says it is the leader");
}

/// The leader is killed while a lock is held and three clients wait: never
/// two holders, tokens keep rising, and every waiter gets the lock.
async fn leader_killed_under_contention(ctx: Ctx) {
    const WAITERS: usize = 3;
    let endpoints = endpoints(&ctx);
    let name = ctx.name("leader-kill");
    let ttl = Duration::from_secs(5);
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait(Wait::For(Duration::from_secs(60)));
    let holder = ctx.locker().await;
    let g = holder
        .acquire(&name, &opts.wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let history = History::new();
    let first = history.acquired(&g);
    let inside = Arc::new(AtomicBool::new(true));
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let l = ctx.locker().await;
        let (name, history, inside) = (name.clone(), history.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let g = l
                .acquire(&name, &opts)
                .await
                .expect("a waiter acquires after the failover")
                .expect("waits");
            let at = Instant::now();
            let id = history.acquired(&g);
            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
            tokio::time::sleep(Duration::from_millis(50)).await;
            inside.store(false, Ordering::SeqCst);
            history.ended(id, &g);
            let _ = g.release().await;
            at
        }));
    }
    until("waiters queued", Duration::from_secs(20), || async {
        waiters(&holder, &name).await >= WAITERS
    })
    .await;

    let dead = leader(&endpoints).await;
    let server = format!("etcd-{}", dead + 1);
    let _restart = UndoOnDrop::new("start", &[server.as_str()]);
    compose("kill", &server).await;
    let killed = Instant::now();
    inside.store(false, Ordering::SeqCst);
    history.ended(first, &g);
    // The holder's release may find no leader yet; its lease then ends by
    // its ttl, which the waiters outwait.
    let released = g.release().await;
    let mut got = Vec::new();
    for t in tasks {
        let at = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("waiters finish within 60 s")
            .expect("waiter task");
        got.push(at.duration_since(killed));
    }
    got.sort();
    let summary = history.check().expect("no overlap, rising tokens");
    assert_eq!(summary.leases, WAITERS + 1);
    eprintln!(
        "leader {server} killed: holder release {}; first waiter acquired {:?} after the kill, all {WAITERS} by {:?}",
        match &released {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("failed ({e}); the lease is revoked in the background"),
        },
        got[0],
        got[WAITERS - 1]
    );
    assert!(
        got[0] < ttl + Duration::from_secs(15),
        "acquisition resumed only after {:?}",
        got[0]
    );
    eprintln!(
        "FIGURES leader_killed etcd-cluster: first_lock_after_kill={}ms, all_{WAITERS}_waiters_by={}ms, overlaps=0",
        got[0].as_millis(),
        got[WAITERS - 1].as_millis()
    );
}

/// A holder whose renewals stall loses its lease after the ttl: its lost
/// signal fires, and the waiter gets the lock only then, with a larger token.
async fn stalled_holder_loses_lease(ctx: Ctx) {
    let pause = ClientPause::new();
    let a = pause.wrap(&ctx.locker().await);
    let name = ctx.name("stalled");
    let ttl = Duration::from_secs(2);
    let g = a
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let fence1 = g.fence().expect("fence");
    let other = ctx.locker().await;
    let waiter = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            let g = other
                .lock_timeout(&name, Duration::from_secs(30))
                .await
                .expect("the waiter gets the lock after the ttl");
            (Instant::now(), g)
        })
    };
    until("waiter queued", Duration::from_secs(20), || async {
        waiters(&other, &name).await == 1
    })
    .await;
    pause.pause();
    let paused = Instant::now();
    tokio::time::timeout(ttl + Duration::from_secs(5), g.lost())
        .await
        .expect("the lost signal fires once the ttl ran out");
    let lost_at = Instant::now();
    assert!(!g.is_held());
    assert!(
        lost_at.duration_since(paused) <= ttl + Duration::from_secs(1),
        "lost fired {:?} after renewals stalled (ttl {ttl:?})",
        lost_at.duration_since(paused)
    );
    let (got_at, g2) = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("waiter in time")
        .expect("waiter task");
    assert!(
        got_at >= lost_at,
        "the waiter got the lock before the holder's lost signal"
    );
    let fence2 = g2.fence().expect("fence");
    assert!(fence2 > fence1, "token {fence2} after {fence1}");
    pause.resume();
    let err = g.release().await.expect_err("release of a lost lease");
    assert_eq!(err.kind(), ErrorKind::Lost);
    assert!(
        ctx.locker()
            .await
            .try_lock(&name)
            .await
            .expect("try")
            .is_none(),
        "the stalled holder's release freed the new holder"
    );
    g2.release().await.expect("release");
}

/// A clean release whose delete reached the server but whose reply was
/// lost (the proxy drops every reply until the key is gone on the server,
/// then cuts the connection) is retried; the retry finds the key gone, by this release,
/// and reports `Released`, not a lost lease.
async fn a_release_whose_reply_was_lost_is_released(ctx: Ctx) {
    let proxies = Proxies::new();
    let routed = proxies.route_url(&ctx.config, 2379).await.expect("proxy");
    let l = lockcore_etcd::connect(&routed).await.expect("connect");
    let other = ctx.locker().await;
    let name = ctx.name("release-reply-lost");
    let g = l
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(10))
                .renew(false)
                .wait(Wait::Try),
        )
        .await
        .expect("acquire")
        .expect("free");
    proxies.blackhole(Dir::Down);
    let releasing = tokio::spawn(async move { g.release().await });
    until(
        "the key deleted on the server",
        Duration::from_secs(10),
        || async {
            other
                .inspect(&name)
                .await
                .expect("inspect")
                .is_some_and(|i| i.holder.is_none())
        },
    )
    .await;
    // The connection that lost the reply is cut: the client retries on a
    // new one.
    proxies.heal();
    proxies.reset();
    let r = tokio::time::timeout(Duration::from_secs(20), releasing)
        .await
        .expect("the release hung")
        .expect("task");
    r.expect("a clean release whose delete was retried reported an error");
}

/// Compactions land between a waiter's read and its predecessor watch (its
/// requests slowed down by 1.5 s through a proxy): the waiter still wakes
/// promptly when the holder releases. (Predecessor watches start at the
/// server's current revision and look at the predecessor once created, so
/// no compaction can overtake them.)
async fn compaction_during_long_wait(ctx: Ctx) {
    let a = ctx.locker().await;
    let proxies = Proxies::new();
    let routed = proxies.route_url(&ctx.config, 2379).await.expect("proxy");
    let wb = EtcdBackend::connect(EtcdConfig::parse(&routed).expect("config"))
        .await
        .expect("connect");
    let w = Locker::new(wb);
    let name = ctx.name("compaction");
    let g = a
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait(Wait::Try),
        )
        .await
        .expect("acquire")
        .expect("free");
    // Every request of the waiter, its watches included, arrives late.
    proxies.delay(Dir::Up, Duration::from_millis(1500));
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let g = w.lock(&name).await.expect("the waiter acquires");
            let at = Instant::now();
            g.release().await.expect("release");
            at
        })
    };
    until("waiter queued", Duration::from_secs(20), || async {
        waiters(&a, &name).await == 1
    })
    .await;
    let mut raw = backend(&ctx).await.client().clone();
    let filler = format!("{}/filler", ctx.namespace);
    // Three seconds of compactions: two of the waiter's slowed round trips.
    for _ in 0..30 {
        let put = raw.put(filler.clone(), "x", None).await.expect("put");
        let rev = put.header().expect("header").revision();
        match raw
            .compact(rev, Some(CompactionOptions::new().with_physical()))
            .await
        {
            Ok(_) => {}
            // Another compaction got there first.
            Err(e) if e.to_string().contains("compacted") => {}
            Err(e) => panic!("compact: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxies.delay(Dir::Up, Duration::ZERO);
    assert!(
        ctx.locker()
            .await
            .try_lock(&name)
            .await
            .expect("try")
            .is_none(),
        "the holder lost the name"
    );
    let released = Instant::now();
    g.release().await.expect("release");
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the wake-up was not lost")
        .expect("waiter task");
    let wake = got.saturating_duration_since(released);
    // At most one delay (1.5 s) already under way, plus slack.
    assert!(
        wake < Duration::from_secs(4),
        "woke {wake:?} after the release"
    );
    let _ = raw.delete(filler, None).await;
}

/// A waiter whose predecessor's key is deleted and put again under the
/// same name between the waiter's read and its watch does not wait on that
/// new key, which is behind its own: it takes the lock. (A handle puts the
/// same key again when it gives up on a name and asks for it again with
/// the lease it kept spare; two such waiters once waited on each other for
/// good.) The waiter's requests arrive 300 ms late through a proxy, so the
/// test can land the delete and the put between its read and its watch.
async fn a_predecessor_put_again_is_not_waited_for(ctx: Ctx) {
    use etcd_client::{EventType, PutOptions, WatchOptions};
    let name = ctx.name("put-again");
    let range = lock_range(DEFAULT_PREFIX, &name);
    let mut raw = backend(&ctx).await.client().clone();
    // The predecessor: a key of the lock's layout, on a lease of the test's.
    let lease = raw.lease_grant(30, None).await.expect("grant").id();
    let pred = format!("{range}{lease:x}");
    let on_lease = || Some(PutOptions::new().with_lease(lease));
    raw.put(pred.clone(), "", on_lease()).await.expect("put");
    let proxies = Proxies::new();
    let routed = proxies.route_url(&ctx.config, 2379).await.expect("proxy");
    let w = lockcore_etcd::connect(&routed).await.expect("connect");
    let mut events = raw
        .watch(range.clone(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    proxies.delay(Dir::Up, Duration::from_millis(300));
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait(Wait::For(Duration::from_secs(30)));
            w.acquire(&name, &opts).await
        })
    };
    // The waiter's put; its read reaches the server 300 ms after it, and
    // its watch 300 ms after that.
    'put: loop {
        let resp = events.message().await.expect("watch").expect("open");
        for e in resp.events() {
            let ours = e.kv().is_some_and(|kv| kv.key() != pred.as_bytes());
            if ours && e.event_type() == EventType::Put {
                break 'put;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(450)).await;
    raw.delete(pred.clone(), None).await.expect("delete");
    raw.put(pred.clone(), "", on_lease())
        .await
        .expect("put again");
    let g = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter waited on a key put after its own")
        .expect("waiter task")
        .expect("acquire")
        .expect("granted");
    proxies.delay(Dir::Up, Duration::ZERO);
    g.release().await.expect("release");
    raw.lease_revoke(lease).await.expect("revoke");
}

/// `etcdctl <args>` against the target's endpoints, its stdout piped.
fn etcdctl(ctx: &Ctx, args: &[&str]) -> tokio::process::Child {
    let mut c = tokio::process::Command::new("etcdctl");
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints(ctx).join(",")))
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    c.spawn().expect("etcdctl runs")
}

/// `etcdctl lock lockcore/<encoded name>` and this backend exclude each
/// other, both ways.
async fn etcdctl_lock_interoperates(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("etcdctl");
    let pfx = lock_range(DEFAULT_PREFIX, &name);
    let pfx = pfx.trim_end_matches('/');
    let etcdctl = |cmd: &[&str]| etcdctl(&ctx, &[&["lock", pfx, "--"], cmd].concat());
    // etcdctl holds until `sh` sees the flag file (its stdin is /dev/null).
    let flag = std::env::temp_dir().join(format!("{}.release", pfx.replace('/', "_")));
    let _ = std::fs::remove_file(&flag);
    let script = format!(
        "echo held; while [ ! -e '{}' ]; do sleep 0.05; done",
        flag.display()
    );
    let mut held = etcdctl(&["sh", "-c", &script]);
    let mut out = BufReader::new(held.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), out.next_line())
        .await
        .expect("etcdctl took the lock")
        .expect("read");
    assert_eq!(line.as_deref(), Some("held"));
    let raw = backend(&ctx).await;
    let keys = raw
        .client()
        .clone()
        .get(format!("{pfx}/"), Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(
        keys.kvs().len(),
        1,
        "etcdctl's key is not in the range {pfx}/"
    );
    assert!(
        l.try_lock(&name).await.expect("try").is_none(),
        "acquired a name etcdctl holds"
    );
    std::fs::write(&flag, b"").expect("flag file"); // `sh` ends, etcdctl unlocks
    let g = l
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("free once etcdctl unlocked");
    let _ = held.wait().await;
    let _ = std::fs::remove_file(&flag);

    // Now this backend holds and etcdctl waits.
    let mut waiting = etcdctl(&["echo", "got"]);
    let mut out = BufReader::new(waiting.stdout.take().expect("stdout")).lines();
    let early = tokio::time::timeout(Duration::from_millis(1500), out.next_line()).await;
    assert!(
        early.is_err(),
        "etcdctl got a lock this backend holds: {early:?}"
    );
    g.release().await.expect("release");
    let line = tokio::time::timeout(Duration::from_secs(10), out.next_line())
        .await
        .expect("etcdctl gets the lock after the release")
        .expect("read");
    assert_eq!(line.as_deref(), Some("got"));
    let status = waiting.wait().await.expect("etcdctl exits");
    assert!(status.success(), "etcdctl: {status}");
}

/// `etcdctl elect` and [`lockcore::Election`] on one name: each sees the
/// other's leader and value, one leads at a time, and `etcdctl elect -l`
/// follows this backend's leaders.
async fn etcdctl_elect_interoperates(ctx: Ctx) {
    let (l, other) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("elect");
    let pfx = lock_range(DEFAULT_PREFIX, &name);
    let pfx = pfx.trim_end_matches('/').to_owned();
    let etcdctl = |args: &[&str]| etcdctl(&ctx, &[&["elect"], args].concat());
    let election = lockcore::Election::new(&l, &name).expect("election");
    let watcher = lockcore::Election::new(&other, &name).expect("election");

    // etcdctl campaigns first: it prints its key, then its proposal.
    let mut theirs = etcdctl(&[&pfx, "from-etcdctl"]);
    let mut out = BufReader::new(theirs.stdout.take().expect("stdout")).lines();
    let elected = async {
        while let Some(line) = out.next_line().await.expect("read") {
            if line == "from-etcdctl" {
                return;
            }
        }
        panic!("etcdctl exited before it was elected");
    };
    tokio::time::timeout(Duration::from_secs(10), elected)
        .await
        .expect("etcdctl was elected");
    let seen = watcher.leader().await.expect("leader").expect("a leader");
    assert_eq!(seen.value, "from-etcdctl", "etcdctl's leader as seen here");
    assert!(
        election.try_campaign("ours").await.expect("try").is_none(),
        "led beside etcdctl's leader"
    );
    // Ours waits; etcdctl resigns on SIGINT, and ours leads.
    let campaign = tokio::spawn(async move { election.campaign("ours").await });
    let pid = theirs.id().expect("pid").to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let ours = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("led once etcdctl resigned")
        .expect("task")
        .expect("campaign");
    let _ = theirs.wait().await;

    // etcdctl observes our leader's value.
    let mut listen = etcdctl(&["-l", &pfx]);
    let mut out = BufReader::new(listen.stdout.take().expect("stdout")).lines();
    let observed = async {
        while let Some(line) = out.next_line().await.expect("read") {
            if line == "ours" {
                return;
            }
        }
        panic!("etcdctl elect -l exited");
    };
    tokio::time::timeout(Duration::from_secs(10), observed)
        .await
        .expect("etcdctl elect -l printed our value");
    assert_eq!(
        watcher.leader().await.expect("leader").map(|s| s.value),
        Some("ours".to_owned())
    );
    ours.resign().await.expect("resign");
    let _ = listen.kill().await;
}

/// A waiter whose lease dies while it waits (revoked, as an expiry would
/// end it) is never told that it holds the lock (etcd#11456: `Lock`
/// returned success after the waiter's session had expired): once the
/// holder releases, the waiter either fails cleanly or holds with a key of
/// its own on a live lease, proven on the server.
async fn waiter_whose_lease_died_is_never_granted(ctx: Ctx) {
    let name = ctx.name("waiter-lease");
    let a = ctx.locker().await;
    let b = ctx.locker().await;
    let ttl = Duration::from_secs(6);
    let g = a
        .acquire(&name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let w = {
        let n = name.clone();
        tokio::spawn(async move {
            b.acquire(
                &n,
                &LockOptions::new()
                    .ttl(ttl)
                    .wait(Wait::For(Duration::from_secs(30))),
            )
            .await
        })
    };
    until("the waiter queues", Duration::from_secs(10), || {
        let (a, n) = (a.clone(), name.clone());
        async move { waiters(&a, &n).await == 1 }
    })
    .await;
    // Revoke the waiter's lease: every key but the holder's.
    let admin = backend(&ctx).await;
    let mut c = admin.client().clone();
    let range = lock_range(DEFAULT_PREFIX, &name);
    let resp = c
        .get(
            range.clone(),
            Some(GetOptions::new().with_prefix().with_sort(
                etcd_client::SortTarget::Create,
                etcd_client::SortOrder::Ascend,
            )),
        )
        .await
        .expect("list");
    let waiting: Vec<i64> = resp.kvs().iter().skip(1).map(|kv| kv.lease()).collect();
    assert_eq!(waiting.len(), 1, "one waiter's key");
    c.lease_revoke(waiting[0])
        .await
        .expect("revoke the waiter's lease");
    g.release().await.expect("release");
    let outcome = tokio::time::timeout(Duration::from_secs(30), w)
        .await
        .expect("the wait ends")
        .expect("waiter task");
    match outcome {
        Ok(Some(g2)) => {
            // Granted: then under a key of its own on a live lease.
            let resp = c
                .get(range, Some(GetOptions::new().with_prefix()))
                .await
                .expect("list");
            let kv = resp
                .kvs()
                .first()
                .expect("the holder's key is on the server");
            assert_ne!(
                kv.lease(),
                waiting[0],
                "granted on the revoked lease (etcd#11456)"
            );
            let ttl_left = c
                .lease_time_to_live(kv.lease(), None)
                .await
                .expect("lease ttl")
                .ttl();
            assert!(ttl_left > 0, "granted on a dead lease (etcd#11456)");
            println!("FIGURES etcd_waiter_lease_died etcd: outcome=granted_on_a_new_live_lease");
            g2.release().await.expect("release");
        }
        Ok(None) => panic!("the wait timed out though the name was released"),
        Err(e) => {
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::Unavailable | ErrorKind::Lost | ErrorKind::Indeterminate
                ),
                "{e}"
            );
            println!(
                "FIGURES etcd_waiter_lease_died etcd: outcome=failed_cleanly ({:?})",
                e.kind()
            );
        }
    }
}

fn main() -> std::process::ExitCode {
    let url = |s: String| async move { Ok(UrlHarness::shared(s, connect)) };
    run_serial(vec![
        harness::target("etcd-soak", "LOCKTEST_ETCD_URL")
            .only_own_cases()
            .case("soak", |ctx| Box::pin(soak_pausing(ctx, "etcd"))),
        own_cases!(
            Target::new("etcd-faults", Some("LOCKTEST_ETCD_URL"), url)
                .hint(COMPOSE_HINT)
                .only_own_cases(),
            stalled_holder_loses_lease,
            a_release_whose_reply_was_lost_is_released,
            compaction_during_long_wait,
            waiter_whose_lease_died_is_never_granted,
            a_predecessor_put_again_is_not_waited_for,
            etcdctl_lock_interoperates,
            etcdctl_elect_interoperates,
        ),
        Target::new(
            "etcd-cluster-faults",
            Some("LOCKTEST_ETCD_CLUSTER_URL"),
            url,
        )
        .hint(COMPOSE_HINT)
        .only_own_cases()
        .case("leader_killed_under_contention", |ctx| {
            Box::pin(leader_killed_under_contention(ctx))
        }),
    ])
}
