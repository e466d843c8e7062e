//! etcd backend figures, each beside the server's floor for the same round
//! trips made with the raw client, in one run on one server:
//!
//! - acquire+release pairs/s, one task; floor: the two durable writes of
//!   etcd's own `concurrency.Mutex` on a session lease (create txn, delete
//!   txn), the lease granted once;
//! - the same with 64 tasks on distinct names;
//! - contended handoff latency (release → next waiter holds) with 8 waiters,
//!   p50/p99; floor: delete txn → watch event → one read txn.
//!
//! `cargo bench -p lockcore-etcd --bench etcd` with `LOCKTEST_ETCD_URL` set
//! (`BENCH_SECS` per figure, default 3).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, WatchOptions,
};
use lockcore::testing::bench as workload;

/// Each throughput figure alternates with its floor this many times.
const ROUNDS: u32 = 3;

fn secs() -> Duration {
    let s = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(s)
}

/// The round trips of one acquire+release on lease `id`, with the raw
/// client.
async fn raw_pair(c: &mut Client, range: &str, id: i64) {
    let key = format!("{range}{id:x}");
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
        .with_keys_only();
    let r = c
        .txn(
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(id))),
                    TxnOp::get(range, Some(first)),
                ]),
        )
        .await
        .expect("txn");
    let rev = r.header().expect("header").revision();
    c.txn(
        Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]),
    )
    .await
    .expect("delete");
}

fn lease_id() -> i64 {
    (lockcore::raw::OwnerToken::random().as_u128() as u64 >> 1).max(1) as i64
}

async fn pairs_per_sec_raw(c: &Client, tasks_n: usize, ns: &str, d: Duration) -> f64 {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..tasks_n {
        let range = format!("lockcore/{ns}%2Fraw%2F{i}/");
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            // One session lease per task, as `concurrency.NewSession`.
            let id = lease_id();
            c.lease_client()
                .grant(60, Some(etcd_client::LeaseGrantOptions::new().with_id(id)))
                .await
                .expect("grant");
            let mut n = 0u64;
            while start.elapsed() < d {
                raw_pair(&mut c, &range, id).await;
                n += 1;
            }
            let _ = c.lease_client().revoke(id).await;
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// Floor: delete a key a watcher waits on; the watcher reads once.
async fn handoff_raw(c: &Client, ns: &str, d: Duration) -> Vec<Duration> {
    let key = format!("lockcore/{ns}%2Fraw-handoff/k");
    let mut out = Vec::new();
    let start = Instant::now();
    let mut c = c.clone();
    while start.elapsed() < d {
        let put = c.put(key.clone(), "", None).await.expect("put");
        let rev = put.header().expect("header").revision();
        let mut ws = c
            .watch(
                key.clone(),
                Some(WatchOptions::new().with_start_revision(rev + 1)),
            )
            .await
            .expect("watch");
        let created = ws.message().await.expect("created").expect("msg");
        assert!(created.created());
        let mut waiter = c.clone();
        let k2 = key.clone();
        let w = tokio::spawn(async move {
            loop {
                let m = ws.message().await.expect("watch").expect("msg");
                if m.events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    break;
                }
            }
            waiter
                .txn(Txn::new().and_then([TxnOp::get(k2, None)]))
                .await
                .expect("read");
            Instant::now()
        });
        let t0 = Instant::now();
        c.txn(
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::delete(key.clone(), None)]),
        )
        .await
        .expect("delete");
        out.push(w.await.expect("waiter").duration_since(t0));
    }
    out
}

fn main() {
    let Ok(url) = std::env::var("LOCKTEST_ETCD_URL") else {
        eprintln!("LOCKTEST_ETCD_URL is unset: start compose/ and eval \"$(compose/local env)\"");
        std::process::exit(2);
    };
    let rt = workload::runtime();
    rt.block_on(async move {
        let d = secs();
        let ns = format!("bench-{:08x}", rand_u32());
        let endpoint = url.replace("etcd://", "http://");
        let raw = Client::connect([endpoint.as_str()], None).await.expect("raw");
        let l = lockcore_etcd::connect(&url).await.expect("connect");
        println!("etcd at {url}, {d:?} per figure");

        // Each figure and its floor in alternating thirds, so that the
        // server's drift over the run weighs on both alike.
        let (mut one, mut one_raw, mut many, mut many_raw) = (0.0, 0.0, 0.0, 0.0);
        for _ in 0..ROUNDS {
            one += workload::uncontended(&l, &ns, 1, d / ROUNDS).await.expect("pairs");
            one_raw += pairs_per_sec_raw(&raw, 1, &ns, d / ROUNDS).await;
        }
        for _ in 0..ROUNDS {
            many += workload::uncontended(&l, &ns, 64, d / ROUNDS).await.expect("pairs");
            many_raw += pairs_per_sec_raw(&raw, 64, &ns, d / ROUNDS).await;
        }
        let n = f64::from(ROUNDS);
        let (one, one_raw, many, many_raw) = (one / n, one_raw / n, many / n, many_raw / n);
        println!("acquire+release, 1 task:    {one:8.0} pairs/s   (raw floor {one_raw:8.0}/s, {:.0}%)", 100.0 * one / one_raw);
        println!("acquire+release, 64 tasks:  {many:8.0} pairs/s   (raw floor {many_raw:8.0}/s, {:.0}%)", 100.0 * many / many_raw);

        // One holder and 8 waiters at any time.
        let mut clients = Vec::new();
        for _ in 0..9 {
            clients.push(lockcore_etcd::connect(&url).await.expect("connect"));
        }
        let h = workload::handoffs(clients, &format!("{ns}/handoff"), d)
            .await
            .expect("handoffs");
        let mut hr = handoff_raw(&raw, &ns, d).await;
        hr.sort();
        println!(
            "handoff, 8 waiters: p50 {:?} p99 {:?} ({} handoffs)   (raw floor p50 {:?} p99 {:?}, {} samples)",
            workload::percentile(&h, 0.5),
            workload::percentile(&h, 0.99),
            h.len(),
            workload::percentile(&hr, 0.5),
            workload::percentile(&hr, 0.99),
            hr.len()
        );
        let _ = raw
            .clone()
            .delete(format!("lockcore/{ns}"), Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await;
    });
}

fn rand_u32() -> u32 {
    (lockcore::raw::OwnerToken::random().as_u128() & 0xffff_ffff) as u32
}
