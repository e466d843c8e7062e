//! Redis backend figures beside the server's own ceiling, in one run.
//!
//! Run (servers from compose/):
//! `eval "$(compose/local env)"; cargo bench -p lockcore-redis --bench redis`
//!
//! 1. One task, uncontended acquire+release pairs/s, against the ceiling of
//!    the same two round trips (the acquire and release scripts) measured by
//!    `redis-benchmark -c 1`.
//! 2. 64 tasks on distinct names over one multiplexed connection, against
//!    `redis-benchmark -c 50` running the same scripts.
//! 3. Contended hand-off latency (release sent → next holder acquired) with
//!    8 clients on one name: p50 / p99 / max.
//! 4. RedLock over five masters, one task, pairs/s.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{LockOptions, Locker, Wait};

const RUN: Duration = Duration::from_secs(4);

const ACQUIRE: &str = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, redis.call('INCR', KEYS[2])} end return {0, redis.call('PTTL', KEYS[1])}";
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '1') return 1 end return 0";

/// Requests per second of one script, as `redis-benchmark` measures it.
fn redis_benchmark(port: &str, clients: u32, script: &str, args: &[&str]) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            port,
            "-c",
            &clients.to_string(),
            "-n",
            "40000",
            "-r",
            "100000",
            "--csv",
            "EVAL",
            script,
        ])
        .args(args)
        .output()
        .expect("redis-benchmark (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().last().unwrap_or_default();
    // The test name may hold commas: rps is the seventh field from the end.
    row.rsplit(',')
        .nth(6)
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}

fn ceiling(port: &str, clients: u32) -> f64 {
    let acq = redis_benchmark(
        port,
        clients,
        ACQUIRE,
        &[
            "2",
            "bench:{__rand_int__}",
            "bench:{__rand_int__}:f",
            "tok",
            "30000",
        ],
    );
    let rel = redis_benchmark(
        port,
        clients,
        RELEASE,
        &["1", "bench:{__rand_int__}", "tok", "bench:chan"],
    );
    1.0 / (1.0 / acq + 1.0 / rel)
}

async fn pairs_for(locker: &Locker, name: &str, until: Instant) -> u64 {
    let opts = LockOptions::new().wait(Wait::Try);
    let mut n = 0;
    while Instant::now() < until {
        let g = locker
            .acquire(name, &opts)
            .await
            .unwrap()
            .expect("uncontended");
        g.release().await.unwrap();
        n += 1;
    }
    n
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let url =
        std::env::var("LOCKTEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:16379".into());
    let port = url
        .rsplit(':')
        .next()
        .unwrap_or("6379")
        .trim_end_matches('/')
        .to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ns = format!("bench-{:x}", std::process::id());
        let locker = lockcore_redis::connect(&url).await.unwrap();

        // 1. One task.
        pairs_for(&locker, &format!("{ns}/warm"), Instant::now() + Duration::from_millis(300)).await;
        let t = Instant::now();
        let n = pairs_for(&locker, &format!("{ns}/one"), t + RUN).await;
        let ours1 = n as f64 / t.elapsed().as_secs_f64();
        let ceil1 = ceiling(&port, 1);

        // 2. 64 tasks on distinct names, one connection.
        let t = Instant::now();
        let until = t + RUN;
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (l, name) = (locker.clone(), format!("{ns}/many/{i}"));
                tokio::spawn(async move { pairs_for(&l, &name, until).await })
            })
            .collect();
        let mut total = 0;
        for task in tasks {
            total += task.await.unwrap();
        }
        let ours64 = total as f64 / t.elapsed().as_secs_f64();
        let ceil50 = ceiling(&port, 50);

        // 3. Hand-off latency, 8 clients on one name.
        let name = format!("{ns}/handoff");
        let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
        let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
        // Bumped by each new holder: a client that released waits for the
        // next holder before it contends again, so every hand-off goes to a
        // client that was waiting.
        let (turn, _) = tokio::sync::watch::channel(0u64);
        let turn = Arc::new(turn);
        let until = Instant::now() + RUN;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let l = lockcore_redis::connect(&url).await.unwrap();
            let (name, released_at, samples, turn) = (name.clone(), released_at.clone(), samples.clone(), turn.clone());
            tasks.push(tokio::spawn(async move {
                let mut seen = turn.subscribe();
                while Instant::now() < until {
                    let g = l.lock(&name).await.unwrap();
                    let now = Instant::now();
                    if let Some(r) = released_at.lock().unwrap().take() {
                        samples.lock().unwrap().push(now - r);
                    }
                    turn.send_modify(|n| *n += 1);
                    seen.mark_unchanged();
                    *released_at.lock().unwrap() = Some(Instant::now());
                    g.release().await.unwrap();
                    let _ = tokio::time::timeout(Duration::from_millis(200), seen.changed()).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let mut lat = samples.lock().unwrap().clone();
        lat.sort();

        // 4. RedLock over five.
        let redlock = std::env::var("LOCKTEST_REDLOCK_URLS").ok().map(|list| {
            let hosts: Vec<&str> = list.split(',').map(|u| u.trim().trim_start_matches("redis://")).collect();
            format!("redlock://{}", hosts.join(","))
        });
        let red = match redlock {
            Some(u) => {
                let rl = lockcore_redis::connect(&u).await.unwrap();
                let t = Instant::now();
                let n = pairs_for(&rl, &format!("{ns}/redlock"), t + RUN).await;
                Some(n as f64 / t.elapsed().as_secs_f64())
            }
            None => None,
        };

        println!("| figure | lockcore-redis | server ceiling (redis-benchmark) | ratio |");
        println!("|---|---|---|---|");
        println!("| 1 task, acquire+release pairs/s | {ours1:.0} | {ceil1:.0} (-c 1) | {:.2} |", ours1 / ceil1);
        println!("| 64 tasks, distinct names, one connection, pairs/s | {ours64:.0} | {ceil50:.0} (-c 50) | {:.2} |", ours64 / ceil50);
        println!(
            "| contended hand-off, 8 clients, {} hand-offs: p50 / p99 / max | {:.3} / {:.3} / {:.3} ms | | |",
            lat.len(),
            percentile(&lat, 0.5).as_secs_f64() * 1e3,
            percentile(&lat, 0.99).as_secs_f64() * 1e3,
            lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
        );
        if let Some(r) = red {
            println!("| RedLock over 5, 1 task, pairs/s | {r:.0} | | |");
        }
    });
}
