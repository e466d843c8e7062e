//! PostgreSQL backend figures beside the server's floor, in one run on one
//! server.
//!
//! Run (server from compose/):
//! `eval "$(compose/local env)"; cargo bench -p lockcore-postgres --bench postgres`
//!
//! 1. One task: uncontended acquire+release pairs/s, beside the same two
//!    statements ([`lockcore_postgres::lock_statements`]) run back to back
//!    on a raw sqlx connection (the floor), in alternating rounds.
//! 2. 32 tasks on distinct names, the same comparison with 32 raw
//!    connections.
//! 3. Contended hand-off latency (release sent → next holder acquired)
//!    with 8 clients on one name: p50 / p99, beside raw clients waiting in
//!    `pg_advisory_lock` and handing over with `pg_advisory_unlock`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::testing::bench as workload;
use sqlx::{AssertSqlSafe, Connection, PgConnection};

const RUN: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;

/// The statements of one acquire+release, on one raw connection.
async fn raw_pairs(url: &str, name: &str, until: Instant) -> u64 {
    let (try_lock, release) = lockcore_postgres::lock_statements("lockcore_locks");
    let mut c = PgConnection::connect(url).await.unwrap();
    let owner = "00000000000000000000000000000000";
    let mut n = 0;
    while Instant::now() < until {
        let (got, _, _): (bool, Option<i64>, Option<String>) =
            sqlx::query_as(AssertSqlSafe(try_lock.as_str()))
                .bind(name)
                .bind(owner)
                .bind(None::<&str>)
                .bind("30000")
                .bind(name)
                .fetch_one(&mut c)
                .await
                .unwrap();
        assert!(got, "a raw pair found {name} held");
        let (released, _): (bool, Option<String>) = sqlx::query_as(AssertSqlSafe(release.as_str()))
            .bind(name)
            .bind(owner)
            .bind(name)
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert!(released);
        n += 1;
    }
    n
}

/// Raw pairs/s of `tasks` connections on distinct names.
async fn raw(url: &str, prefix: &str, tasks: usize) -> f64 {
    let until = Instant::now() + RUN;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (url, name) = (url.to_owned(), format!("{prefix}/raw/{i}"));
            tokio::spawn(async move { raw_pairs(&url, &name, until).await })
        })
        .collect();
    let mut n = 0;
    for h in handles {
        n += h.await.unwrap();
    }
    n as f64 / RUN.as_secs_f64()
}

/// Hand-off latencies of raw clients on `name`: each waits in
/// `pg_advisory_lock`, and the holder hands over with `pg_advisory_unlock`.
async fn raw_handoffs(url: &str, name: &str, clients: usize) -> Vec<Duration> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let until = Instant::now() + RUN;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, name) = (url.to_owned(), name.to_owned());
        let (released_at, samples) = (released_at.clone(), samples.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = PgConnection::connect(&url).await.unwrap();
            while Instant::now() < until {
                sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
                    .bind(&name)
                    .execute(&mut c)
                    .await
                    .unwrap();
                if let Some(at) = released_at.lock().unwrap().take() {
                    samples.lock().unwrap().push(at.elapsed());
                }
                *released_at.lock().unwrap() = Some(Instant::now());
                sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
                    .bind(&name)
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut v = samples.lock().unwrap().clone();
    v.sort();
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let Ok(url) = std::env::var("LOCKTEST_POSTGRES_URL") else {
        eprintln!("LOCKTEST_POSTGRES_URL is unset: start compose/local and eval its env");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let prefix = format!("bench/{}", std::process::id());
        let locker = lockcore_postgres::connect(&url).await.unwrap();
        let (mut ours1, mut raw1, mut ours32, mut raw32) = (vec![], vec![], vec![], vec![]);
        for round in 0..ROUNDS {
            let p = format!("{prefix}/{round}");
            raw1.push(raw(&url, &format!("{p}/1"), 1).await);
            ours1.push(workload::uncontended(&locker, &format!("{p}/1"), 1, RUN).await.unwrap());
            raw32.push(raw(&url, &format!("{p}/32"), 32).await);
            ours32.push(workload::uncontended(&locker, &format!("{p}/32"), 32, RUN).await.unwrap());
        }
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(lockcore_postgres::connect(&url).await.unwrap());
        }
        let ours_h = workload::handoffs(clients, &format!("{prefix}/handoff"), RUN).await.unwrap();
        let raw_h = raw_handoffs(&url, &format!("{prefix}/raw-handoff"), 8).await;
        let sum = |v: &[f64]| v.iter().sum::<f64>();
        let ratios = |o: &[f64], r: &[f64]| {
            o.iter().zip(r).map(|(o, r)| format!("{:.2}", o / r)).collect::<Vec<_>>().join(", ")
        };
        println!("| figure | lockcore-postgres | floor: same statements, raw sqlx | ratio (per round; of the sums) |");
        println!("|---|---|---|---|");
        println!(
            "| 1 task, acquire+release pairs/s | {:.0} | {:.0} | {} ; {:.2} |",
            sum(&ours1) / ROUNDS as f64,
            sum(&raw1) / ROUNDS as f64,
            ratios(&ours1, &raw1),
            sum(&ours1) / sum(&raw1)
        );
        println!(
            "| 32 tasks, distinct names, pairs/s | {:.0} | {:.0} | {} ; {:.2} |",
            sum(&ours32) / ROUNDS as f64,
            sum(&raw32) / ROUNDS as f64,
            ratios(&ours32, &raw32),
            sum(&ours32) / sum(&raw32)
        );
        println!(
            "| hand-off p50 / p99, 8 clients | {:.2} / {:.2} ms ({} hand-offs) | {:.2} / {:.2} ms ({}, bare pg_advisory_lock / unlock) | |",
            ms(workload::percentile(&ours_h, 0.5)),
            ms(workload::percentile(&ours_h, 0.99)),
            ours_h.len(),
            ms(workload::percentile(&raw_h, 0.5)),
            ms(workload::percentile(&raw_h, 0.99)),
            raw_h.len()
        );
    });
}
