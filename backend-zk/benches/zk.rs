//! ZooKeeper backend figures, each beside the server's own floor for the
//! same round trips with the raw client, in one run on one server
//! (`LOCKTEST_ZK`, default 127.0.0.1:12181):
//!
//! 1. acquire+release pairs/s for one task, vs raw create + getChildren +
//!    delete sequences/s;
//! 2. contended handoff latency p50/p99 with 8 waiters (release call to the
//!    next holder's grant), vs raw delete → predecessor watch → getChildren.
//!
//! `cargo bench -p lockcore-zk --bench zk` (`BENCH_SECS` per figure, default 3).

// Bench code: a failed expectation aborts the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{Locker, Wait};
use lockcore_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

const BASE: &str = "/lockcore-bench";

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn locker(hosts: &str) -> Locker {
    let cfg = ZkConfig::parse(&format!("zk://{hosts}{BASE}")).expect("url");
    Locker::from_arc(Arc::new(ZkBackend::connect(cfg).await.expect("connect")))
}

async fn pairs(l: &Locker, name: &str, secs: Duration) -> f64 {
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < secs {
        let g = l.try_lock(name).await.expect("try").expect("free");
        g.release().await.expect("release");
        n += 1;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

async fn raw_pairs(c: &zk::Client, parent: &str, secs: Duration) -> f64 {
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/_c_00000000-0000-0000-0000-000000000000-lock-");
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < secs {
        let (_, seq) = c.create(&prefix, b"", &eph).await.expect("create");
        let _ = c.list_children(parent).await.expect("children");
        c.delete(&format!("{prefix}{seq}"), None)
            .await
            .expect("delete");
        n += 1;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

async fn handoffs(hosts: &str, name: &str, secs: Duration) -> Vec<Duration> {
    const TASKS: usize = 9; // one holder and 8 waiters at any time
    let released: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = Instant::now() + secs;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let l = locker(hosts)
            .await
            .with_defaults(lockcore::LockOptions::new().wait(Wait::Forever));
        let (released, samples, name) = (released.clone(), samples.clone(), name.to_owned());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let g = l.lock(&name).await.expect("lock");
                if let Some(t) = released.lock().unwrap().take() {
                    samples.lock().unwrap().push(t.elapsed());
                }
                *released.lock().unwrap() = Some(Instant::now());
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let v = samples.lock().unwrap().clone();
    v
}

async fn raw_handoffs(hosts: &str, parent: &str, secs: Duration) -> Vec<Duration> {
    let a = zk::Client::connect(hosts).await.expect("raw a");
    let b = zk::Client::connect(hosts).await.expect("raw b");
    let eph = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{parent}/x-lock-");
    let t = Instant::now();
    let mut v = Vec::new();
    while t.elapsed() < secs {
        let (_, s1) = a.create(&prefix, b"", &eph).await.expect("create a");
        let (_, s2) = b.create(&prefix, b"", &eph).await.expect("create b");
        let first = format!("{prefix}{s1}");
        let (_, w) = b.check_and_watch_stat(&first).await.expect("watch");
        let t0 = Instant::now();
        a.delete(&first, None).await.expect("delete a");
        w.changed().await;
        let _ = b.list_children(parent).await.expect("children");
        v.push(t0.elapsed());
        b.delete(&format!("{prefix}{s2}"), None)
            .await
            .expect("delete b");
    }
    v
}

fn main() {
    let hosts = std::env::var("LOCKTEST_ZK").unwrap_or_else(|_| "127.0.0.1:12181".into());
    let secs = Duration::from_secs(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let run = format!("{:08x}", rand_suffix());
        let l = locker(&hosts).await;
        let raw = zk::Client::connect(&hosts).await.expect("raw");
        let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        let raw_parent = format!("{BASE}/raw-{run}");
        raw.mkdir(&raw_parent, &dir).await.expect("raw parent");

        // Alternate short slices so both see the same server conditions.
        let (mut ours, mut floor) = (0.0, 0.0);
        let slice = secs / 3;
        for _ in 0..3 {
            floor += raw_pairs(&raw, &raw_parent, slice).await / 3.0;
            ours += pairs(&l, &format!("bench-{run}/pairs"), slice).await / 3.0;
        }
        println!(
            "zk {hosts}: acquire+release, one task: {ours:.0} pairs/s (raw create+getChildren+delete floor: {floor:.0}/s, {:.0}%)",
            100.0 * ours / floor
        );

        let mut h = handoffs(&hosts, &format!("bench-{run}/handoff"), secs).await;
        let mut r = raw_handoffs(&hosts, &raw_parent, secs).await;
        println!(
            "zk {hosts}: contended handoff, 8 waiters: p50 {:?} p99 {:?} over {} handoffs (raw delete→watch→getChildren floor: p50 {:?} p99 {:?} over {})",
            pct(&mut h, 0.5),
            pct(&mut h, 0.99),
            h.len(),
            pct(&mut r, 0.5),
            pct(&mut r, 0.99),
            r.len()
        );
    });
}

fn rand_suffix() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.subsec_nanos() ^ (t.as_secs() as u32)
}
