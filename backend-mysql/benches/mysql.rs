//! MySQL backend figures beside the server's floor, in one run on one server.
//!
//! Run (server from compose/):
//! `eval "$(compose/local env)"; cargo bench -p lockcore-mysql --bench mysql`
//!
//! 1. One task: uncontended acquire+release pairs/s, beside the same
//!    statements run back to back by raw sqlx connections (the floor).
//! 2. 32 tasks on distinct names, same comparison with 32 raw pairs.
//! 3. One task with `fencing=none`, beside raw sqlx running `START
//!    TRANSACTION`, `SELECT ... FOR UPDATE` and `COMMIT`.
//! 4. Contended hand-off latency (release sent → next holder acquired) with
//!    8 clients on one name: p50 / p99, beside raw clients handing a
//!    `FOR UPDATE` row over by `ROLLBACK`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::testing::bench as workload;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection};

const RUN: Duration = Duration::from_secs(3);

/// The statements of one acquire+release, run by raw connections.
async fn raw_pairs_for(url: &str, name: &str, until: Instant) -> u64 {
    let mut hold = MySqlConnection::connect(url).await.unwrap();
    let mut aux = MySqlConnection::connect(url).await.unwrap();
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut hold)
        .await
        .unwrap();
    sqlx::query("INSERT IGNORE INTO lockcore_locks (name) VALUES (?)")
        .bind(name.as_bytes())
        .execute(&mut aux)
        .await
        .unwrap();
    let mut n = 0;
    while Instant::now() < until {
        sqlx::raw_sql("SET SESSION wait_timeout = 30, innodb_lock_wait_timeout = 1; START TRANSACTION; SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
            .fetch_all(&mut hold)
            .await
            .unwrap();
        sqlx::query("SELECT 1 FROM `lockcore_locks` WHERE `name` = ? FOR UPDATE NOWAIT")
            .bind(name.as_bytes())
            .fetch_optional(&mut hold)
            .await
            .unwrap()
            .expect("row");
        sqlx::query(
            "INSERT INTO `lockcore_locks_fence` (`name`, `fence`, `holder_conn`, `owner`) VALUES (?, LAST_INSERT_ID(1), ?, ?) \
             ON DUPLICATE KEY UPDATE `fence` = LAST_INSERT_ID(`fence` + 1), `holder_conn` = VALUES(`holder_conn`), `owner` = VALUES(`owner`)",
        )
        .bind(name.as_bytes())
        .bind(1u64)
        .bind("00000000000000000000000000000000")
        .execute(&mut aux)
        .await
        .unwrap();
        sqlx::query("SELECT 1").fetch_one(&mut hold).await.unwrap();
        sqlx::raw_sql("ROLLBACK; SET SESSION wait_timeout = DEFAULT")
            .execute(&mut hold)
            .await
            .unwrap();
        n += 1;
    }
    n
}

/// A plain row lock taken and let go, with raw sqlx: the floor of a lock
/// without fencing.
async fn raw_plain_pairs_for(url: &str, name: &str, until: Instant) -> u64 {
    let mut c = MySqlConnection::connect(url).await.unwrap();
    sqlx::query("INSERT IGNORE INTO lockcore_locks (name) VALUES (?)")
        .bind(name.as_bytes())
        .execute(&mut c)
        .await
        .unwrap();
    let mut n = 0;
    while Instant::now() < until {
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::query("SELECT 1 FROM `lockcore_locks` WHERE `name` = ? FOR UPDATE")
            .bind(name.as_bytes())
            .fetch_optional(&mut c)
            .await
            .unwrap()
            .expect("row");
        sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        n += 1;
    }
    n
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Hand-offs between 8 clients: each records (acquired − previous release).
async fn handoff<F, Fut>(clients: usize, run_client: F) -> Vec<Duration>
where
    F: Fn(Arc<Mutex<Option<Instant>>>, Arc<Mutex<Vec<Duration>>>, Instant) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let until = Instant::now() + RUN;
    let tasks: Vec<_> = (0..clients)
        .map(|_| tokio::spawn(run_client(released_at.clone(), samples.clone(), until)))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mut lat = samples.lock().unwrap().clone();
    lat.sort();
    lat
}

fn record(released_at: &Mutex<Option<Instant>>, samples: &Mutex<Vec<Duration>>) {
    let now = Instant::now();
    if let Some(r) = released_at.lock().unwrap().take() {
        samples.lock().unwrap().push(now - r);
    }
}

fn main() {
    let url = std::env::var("LOCKTEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://lockcore:lockcore@127.0.0.1:13306/lockcore".into());
    let rt = workload::runtime();
    rt.block_on(async {
        let ns = format!("bench-{:x}", std::process::id());
        let locker = lockcore_mysql::connect(&format!("{url}?pool_size=40&aux_pool_size=8"))
            .await
            .unwrap();

        // Each figure alternates with its floor in thirds, so that the
        // server's drift over the run weighs on both alike.
        let third = RUN / 3;
        let plain = lockcore_mysql::connect(&format!("{url}?fencing=none&ensure_schema=false"))
            .await
            .unwrap();
        workload::uncontended(&locker, &format!("{ns}/warm"), 1, Duration::from_millis(300)).await.unwrap();
        workload::uncontended(&plain, &format!("{ns}/warm-plain"), 1, Duration::from_millis(300)).await.unwrap();
        let (mut ours1, mut raw1, mut ours32, mut raw32, mut plain1, mut raw_plain1) =
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for _ in 0..3 {
            // 1. One task.
            ours1 += workload::uncontended(&locker, &format!("{ns}/one"), 1, third).await.unwrap() / 3.0;
            let t = Instant::now();
            raw1 += raw_pairs_for(&url, &format!("{ns}/raw-one"), t + third).await as f64 / t.elapsed().as_secs_f64() / 3.0;

            // 2. 32 tasks on distinct names.
            ours32 += workload::uncontended(&locker, &format!("{ns}/many"), 32, third).await.unwrap() / 3.0;
            let t = Instant::now();
            let until = t + third;
            let tasks: Vec<_> = (0..32)
                .map(|i| {
                    let (url, name) = (url.clone(), format!("{ns}/raw-many/{i}"));
                    tokio::spawn(async move { raw_pairs_for(&url, &name, until).await })
                })
                .collect();
            let mut total = 0;
            for task in tasks {
                total += task.await.unwrap();
            }
            raw32 += total as f64 / t.elapsed().as_secs_f64() / 3.0;

            // 3. One task without fencing.
            plain1 += workload::uncontended(&plain, &format!("{ns}/plain"), 1, third).await.unwrap() / 3.0;
            let t = Instant::now();
            raw_plain1 += raw_plain_pairs_for(&url, &format!("{ns}/raw-plain"), t + third).await as f64 / t.elapsed().as_secs_f64() / 3.0;
        }

        // 4. Hand-off, 8 clients on one name.
        let name = format!("{ns}/handoff");
        let mut lockers = Vec::new();
        for _ in 0..8 {
            lockers.push(lockcore_mysql::connect(&format!("{url}?ensure_schema=false")).await.unwrap());
        }
        let ours = workload::handoffs(lockers, &name, RUN).await.unwrap();
        let raw_name = format!("{ns}/raw-handoff");
        {
            let mut c = MySqlConnection::connect(&url).await.unwrap();
            sqlx::query("INSERT IGNORE INTO lockcore_locks (name) VALUES (?)")
                .bind(raw_name.as_bytes())
                .execute(&mut c)
                .await
                .unwrap();
        }
        let raw = handoff(8, |released_at, samples, until| {
            let (url, name) = (url.clone(), raw_name.clone());
            async move {
                let mut c = MySqlConnection::connect(&url).await.unwrap();
                sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 30")
                    .execute(&mut c)
                    .await
                    .unwrap();
                while Instant::now() < until {
                    sqlx::raw_sql("START TRANSACTION").execute(&mut c).await.unwrap();
                    sqlx::query("SELECT 1 FROM `lockcore_locks` WHERE `name` = ? FOR UPDATE")
                        .bind(name.as_bytes())
                        .fetch_optional(&mut c)
                        .await
                        .unwrap();
                    record(&released_at, &samples);
                    *released_at.lock().unwrap() = Some(Instant::now());
                    sqlx::raw_sql(AssertSqlSafe("ROLLBACK")).execute(&mut c).await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
        })
        .await;

        println!("| figure | lockcore-mysql | floor: same statements, raw sqlx | ratio |");
        println!("|---|---|---|---|");
        println!("| 1 task, acquire+release pairs/s | {ours1:.0} | {raw1:.0} | {:.2} |", ours1 / raw1);
        println!("| 32 tasks, distinct names, pairs/s | {ours32:.0} | {raw32:.0} | {:.2} |", ours32 / raw32);
        println!("| 1 task, `fencing=none`, pairs/s (floor: START TRANSACTION, FOR UPDATE, COMMIT) | {plain1:.0} | {raw_plain1:.0} | {:.2} |", plain1 / raw_plain1);
        println!(
            "| hand-off, 8 clients, p50 / p99 ms ({} / {} hand-offs) | {:.3} / {:.3} | {:.3} / {:.3} | |",
            ours.len(),
            raw.len(),
            ms(workload::percentile(&ours, 0.5)),
            ms(workload::percentile(&ours, 0.99)),
            ms(workload::percentile(&raw, 0.5)),
            ms(workload::percentile(&raw, 0.99)),
        );
    });
}
