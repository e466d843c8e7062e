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
//!
//! 5. One task beside the raw redis-rs floor of a lock cycle (`SET NX PX`,
//!    then the compare-and-delete script), in alternating thirds.
//!
//! Beside each, the peer in the same run on the same servers: rslock
//! (`LockManager::lock` + `unlock`) uncontended (in the same alternating
//! thirds as 5), in the forced hand-off (its default retries: 3, with a
//! random delay below 200 ms), and as RedLock over the same five masters
//! (alternating sixths).
//!
//! 6. Behind Sentinel (with `LOCKTEST_REDIS_SENTINEL_URL`): one task through
//!    `redis+sentinel://`, beside the same master reached by `redis://`,
//!    and with the replica-sync guard (`sync_replicas=1`), in alternating
//!    ninths.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::masters;
use lockcore::testing::bench as workload;

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

/// The raw redis-rs floor of one lock cycle, one task: `SET NX PX`, then
/// the compare-and-delete script (EVALSHA), on one multiplexed connection.
async fn raw_pairs(url: &str, name: &str, run: Duration) -> f64 {
    let client = redis::Client::open(url).expect("client");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < run {
        let ok: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg("tok")
            .arg("NX")
            .arg("PX")
            .arg(30000)
            .query_async(&mut c)
            .await
            .expect("SET");
        assert!(ok.is_some(), "the raw key was held");
        let _: i64 = release
            .key(name)
            .arg("tok")
            .invoke_async(&mut c)
            .await
            .expect("release");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// rslock acquire+release pairs/s on one name, one task.
async fn rslock_pairs(lm: &rslock::LockManager, name: &str, run: Duration) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < run {
        let l = lm
            .lock(name, Duration::from_secs(30))
            .await
            .expect("rslock lock");
        lm.unlock(&l).await;
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// rslock's forced hand-off, as `lockcore::testing::bench::handoffs` does it: one
/// manager per client, a client that released waits for the next holder.
async fn rslock_handoffs(
    urls: Vec<String>,
    clients: usize,
    name: &str,
    run: Duration,
) -> Vec<Duration> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let turn = Arc::new(tokio::sync::watch::channel(0u64).0);
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let lm = rslock::LockManager::new(urls.clone());
        let (name, released_at, samples, turn) = (
            name.to_owned(),
            released_at.clone(),
            samples.clone(),
            turn.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut seen = turn.subscribe();
            while Instant::now() < until {
                let Ok(l) = lm.lock(name.as_str(), Duration::from_secs(30)).await else {
                    continue; // its retries ran out: try again, as its acquire() does
                };
                let now = Instant::now();
                if let Some(r) = released_at.lock().unwrap().take() {
                    samples.lock().unwrap().push(now - r);
                }
                turn.send_modify(|n| *n += 1);
                seen.mark_unchanged();
                *released_at.lock().unwrap() = Some(Instant::now());
                lm.unlock(&l).await;
                let _ = tokio::time::timeout(Duration::from_millis(200), seen.changed()).await;
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

fn main() {
    let url =
        std::env::var("LOCKTEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:16379".into());
    let port = url
        .rsplit(':')
        .next()
        .unwrap_or("6379")
        .trim_end_matches('/')
        .to_owned();
    let rt = workload::runtime();
    rt.block_on(async {
        let ns = format!("bench-{:x}", std::process::id());
        let locker = lockcore_redis::connect(&url).await.unwrap();
        workload::uncontended(&locker, &ns, 1, Duration::from_millis(300)).await.unwrap();
        let ours1 = workload::uncontended(&locker, &ns, 1, RUN).await.unwrap();
        let ceil1 = ceiling(&port, 1);
        let ours64 = workload::uncontended(&locker, &ns, 64, RUN).await.unwrap();
        let ceil50 = ceiling(&port, 50);
        let mut clients = Vec::new();
        for _ in 0..8 {
            clients.push(lockcore_redis::connect(&url).await.unwrap());
        }
        let lat = workload::handoffs(clients, &format!("{ns}/handoff"), RUN).await.unwrap();
        let peer = rslock::LockManager::new(masters(&url));
        // lockcore, the raw redis-rs cycle and rslock in alternating
        // thirds, so that drift in the server and the machine's load weigh
        // on all three alike.
        let (mut ours_alt, mut raw1, mut peer1) = (0.0, 0.0, 0.0);
        for _ in 0..3 {
            ours_alt += workload::uncontended(&locker, &ns, 1, RUN / 3).await.unwrap() / 3.0;
            raw1 += raw_pairs(&masters(&url)[0], &format!("{ns}/raw"), RUN / 3).await / 3.0;
            peer1 += rslock_pairs(&peer, &format!("{ns}/rslock/one"), RUN / 3).await / 3.0;
        }
        let peer_lat = rslock_handoffs(masters(&url), 8, &format!("{ns}/rslock/handoff"), RUN).await;
        // RedLock: ours and rslock's in alternating sixths, so that drift
        // in the servers and the machine's load weigh on both alike.
        let red = match std::env::var("LOCKTEST_REDLOCK_URL") {
            Ok(url) => {
                let rl = lockcore_redis::connect(&url).await.unwrap();
                let peer = rslock::LockManager::new(masters(&url));
                let (mut ours, mut theirs) = (0.0, 0.0);
                for _ in 0..6 {
                    ours += workload::uncontended(&rl, &ns, 1, RUN / 6).await.unwrap() / 6.0;
                    theirs += rslock_pairs(&peer, &format!("{ns}/rslock/redlock"), RUN / 6).await / 6.0;
                }
                Some((ours, theirs))
            }
            Err(_) => None,
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("| figure | lockcore-redis | server ceiling (redis-benchmark) | ratio |");
        println!("|---|---|---|---|");
        println!("| 1 task, acquire+release pairs/s | {ours1:.0} | {ceil1:.0} (-c 1) | {:.2} |", ours1 / ceil1);
        println!("| 64 tasks, distinct names, one connection, pairs/s | {ours64:.0} | {ceil50:.0} (-c 50) | {:.2} |", ours64 / ceil50);
        println!(
            "| contended hand-off, 8 clients, {} hand-offs: p50 / p99 / max | {:.3} / {:.3} / {:.3} ms | | |",
            lat.len(),
            ms(workload::percentile(&lat, 0.5)),
            ms(workload::percentile(&lat, 0.99)),
            ms(workload::percentile(&lat, 1.0)),
        );
        println!();
        println!("| figure, same servers, same run | lockcore-redis | rslock 0.10 | ratio |");
        println!("|---|---|---|---|");
        println!("| 1 task, acquire+release pairs/s (alternating thirds) | {ours_alt:.0} | {peer1:.0} | {:.2} |", ours_alt / peer1);
        let rate = |l: &[Duration]| l.len() as f64 / RUN.as_secs_f64();
        println!(
            "| forced hand-off, 8 clients: hand-offs/s, p99 | {:.0}/s, {:.3} ms | {:.0}/s, {:.3} ms | {:.1} |",
            rate(&lat),
            ms(workload::percentile(&lat, 0.99)),
            rate(&peer_lat),
            ms(workload::percentile(&peer_lat, 0.99)),
            rate(&lat) / rate(&peer_lat).max(1e-9),
        );
        if let Some((r, p)) = red {
            println!("| RedLock over 5, 1 task, pairs/s | {r:.0} | {p:.0} | {:.2} |", r / p);
        }
        println!();
        println!("| figure, same server, alternating thirds | lockcore-redis | raw redis-rs: SET NX PX + EVALSHA release | ratio |");
        println!("|---|---|---|---|");
        println!("| 1 task, acquire+release pairs/s | {ours_alt:.0} | {raw1:.0} | {:.2} |", ours_alt / raw1);
        if let Ok(sentinels) = std::env::var("LOCKTEST_REDIS_SENTINEL_URL") {
            sentinel(&sentinels, &ns).await;
        }
    });
}

/// Section 6: Sentinel beside the same master by `redis://`, and the cost
/// of the replica-sync guard, in alternating ninths.
async fn sentinel(sentinels: &str, ns: &str) {
    let u = lockcore::raw::address::ServerUrl::parse(sentinels, 26379).unwrap();
    let asked = redis::Client::open(format!("redis://{}", u.hosts[0])).unwrap();
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(&u.path)
        .query_async(&mut asked.get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    let direct = lockcore_redis::connect(&format!("redis://{host}:{port}"))
        .await
        .unwrap();
    let through = lockcore_redis::connect(sentinels).await.unwrap();
    let guarded =
        lockcore_redis::connect(&format!("{sentinels}?sync_replicas=1&sync_timeout_ms=500"))
            .await
            .unwrap();
    let (mut d, mut t, mut g) = (0.0, 0.0, 0.0);
    for _ in 0..9 {
        d += workload::uncontended(&direct, ns, 1, RUN / 9)
            .await
            .unwrap()
            / 9.0;
        t += workload::uncontended(&through, ns, 1, RUN / 9)
            .await
            .unwrap()
            / 9.0;
        g += workload::uncontended(&guarded, ns, 1, RUN / 9)
            .await
            .unwrap()
            / 9.0;
    }
    println!();
    println!("| figure, same master, alternating ninths | redis+sentinel:// | redis:// to the master | ratio | with sync_replicas=1 | its ratio to redis+sentinel:// |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| 1 task, acquire+release pairs/s | {t:.0} | {d:.0} | {:.2} | {g:.0} | {:.2} |",
        t / d,
        g / t
    );
}
