//! ZooKeeper backend figures, each beside the server's own floor for the
//! same round trips with the raw client, in one run on one server
//! (`LOCKTEST_ZK_URL`, default zk://127.0.0.1:12181):
//!
//! 1. acquire+release pairs/s for one task, vs raw create + getChildren +
//!    delete sequences/s;
//! 2. contended handoff latency p50/p99 with 8 waiters (release call to the
//!    next holder's grant), vs raw delete → predecessor watch → getChildren.
//!
//! `cargo bench -p lockcore-zk --bench zk` (`BENCH_SECS` per figure, default 3).

// Bench code: a failed expectation aborts the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::testing::bench as workload;
use lockcore::Locker;
use lockcore_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

const BASE: &str = "/lockcore-bench";

async fn locker(hosts: &str) -> Locker {
    let cfg = ZkConfig::parse(&format!("zk://{hosts}{BASE}")).expect("url");
    Locker::from_arc(Arc::new(ZkBackend::connect(cfg).await.expect("connect")))
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
    let url = std::env::var("LOCKTEST_ZK_URL").unwrap_or_else(|_| "zk://127.0.0.1:12181".into());
    let hosts = url.trim_start_matches("zk://").to_owned();
    let secs = Duration::from_secs(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
    );
    let rt = workload::runtime();
    rt.block_on(async {
        let run = format!("{:08x}", rand_suffix());
        let l = locker(&hosts).await;
        let raw = zk::Client::connect(&hosts).await.expect("raw");
        // Persistent, not a container: the server deletes an empty
        // container (every second in compose/) between two raw cycles.
        let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let raw_parent = format!("{BASE}/raw-{run}");
        raw.mkdir(&raw_parent, &dir).await.expect("raw parent");

        // Alternate short slices so both see the same server conditions.
        let (mut ours, mut floor) = (0.0, 0.0);
        let slice = secs / 3;
        for _ in 0..3 {
            floor += raw_pairs(&raw, &raw_parent, slice).await / 3.0;
            ours += workload::uncontended(&l, &format!("bench-{run}/pairs"), 1, slice)
                .await
                .expect("pairs")
                / 3.0;
        }
        println!(
            "zk {hosts}: acquire+release, one task: {ours:.0} pairs/s (raw create+getChildren+delete floor: {floor:.0}/s, {:.0}%)",
            100.0 * ours / floor
        );

        // One holder and 8 waiters at any time.
        let mut clients = Vec::new();
        for _ in 0..9 {
            clients.push(locker(&hosts).await);
        }
        let h = workload::handoffs(clients, &format!("bench-{run}/handoff"), secs)
            .await
            .expect("handoffs");
        let mut r = raw_handoffs(&hosts, &raw_parent, secs).await;
        r.sort();
        println!(
            "zk {hosts}: contended handoff, 8 waiters: p50 {:?} p99 {:?} over {} handoffs (raw delete→watch→getChildren floor: p50 {:?} p99 {:?} over {})",
            workload::percentile(&h, 0.5),
            workload::percentile(&h, 0.99),
            h.len(),
            workload::percentile(&r, 0.5),
            workload::percentile(&r, 0.99),
            r.len()
        );
        let _ = raw.delete(&raw_parent, None).await;
    });
}

fn rand_suffix() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.subsec_nanos() ^ (t.as_secs() as u32)
}
