//! The cost of held leases beside the floor of the same renewal traffic
//! sent with the redis crate alone, in one run.
//!
//! Run (servers from compose/):
//! `eval "$(compose/local env)"; cargo bench -p lockcore-redis --bench held_floor`
//!
//! One process, alternating (two rounds of each, 20 s each, the same
//! runtime): lockcore holds 10,000 locks with ttl 3 s, renewed every
//! second (`testing::bench::hold_many`); the floor sets 10,000 keys with
//! `PX 3000` and then, every 32 ms (lockcore's grid step at that ttl),
//! renews the next 320 of them round-robin, each key once a second, in
//! calls of up to 256 keys of the same compare-and-`PEXPIRE` script on one
//! multiplexed connection (lockcore's batched renewal). It keeps no
//! lease state: no validity, no lost signal, no timer a key. The figure is
//! the process's CPU (user and system) over the held phase, as a share of
//! one core. With `LOCKTEST_REDLOCK_URL` set, the same on its masters (the
//! floor sends every call to each master at once and waits for all).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lockcore::testing::bench as workload;
use redis::aio::MultiplexedConnection;

const HELD: usize = 10_000;
const TTL: Duration = Duration::from_secs(3);
const RUN: Duration = Duration::from_secs(20);
const STEP: Duration = Duration::from_millis(32);
const PER_CALL: usize = 256;

/// The backend's batched renewal script (`scripts::RENEW_MANY`).
const RENEW_MANY: &str = r"local r = {}
for i, k in ipairs(KEYS) do
  local v = redis.pcall('GET', k)
  if v == ARGV[2 * i - 1] then
    r[i] = redis.call('PEXPIRE', k, ARGV[2 * i])
  elseif not v then
    r[i] = -1
  else
    r[i] = 0
  end
end
return r";

/// The raw traffic of `HELD` renewed keys on each of `servers` for `RUN`;
/// returns the process's CPU over it as a share of one core, in %.
async fn floor(servers: &[String], ns: &str) -> f64 {
    let mut conns: Vec<MultiplexedConnection> = Vec::new();
    for s in servers {
        let client = redis::Client::open(s.as_str()).expect("client");
        conns.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connection"),
        );
    }
    let keys: Vec<(String, String)> = (0..HELD)
        .map(|i| {
            (
                format!("{ns}/floor/{i}"),
                format!("{ns}-floor-token-{i:08}"),
            )
        })
        .collect();
    let ttl_ms = TTL.as_millis().to_string();
    for c in &mut conns {
        for chunk in keys.chunks(1000) {
            let mut p = redis::pipe();
            for (k, t) in chunk {
                p.cmd("SET").arg(k).arg(t).arg("PX").arg(&ttl_ms).ignore();
            }
            let () = p.query_async(c).await.expect("SET");
        }
    }
    let script = redis::Script::new(RENEW_MANY);
    let per_step = HELD * STEP.as_millis() as usize / 1000;
    let mut tick = tokio::time::interval(STEP);
    let (cpu0, t0) = (workload::cpu_time(), Instant::now());
    let mut next = 0;
    while t0.elapsed() < RUN {
        tick.tick().await;
        let due: Vec<&(String, String)> = (0..per_step).map(|j| &keys[(next + j) % HELD]).collect();
        next = (next + per_step) % HELD;
        for chunk in due.chunks(PER_CALL) {
            let calls = conns.iter().map(|c| {
                let mut inv = script.prepare_invoke();
                for (k, t) in chunk {
                    inv.key(k).arg(t).arg(&ttl_ms);
                }
                let mut c = c.clone();
                async move {
                    let r: Vec<i64> = inv.invoke_async(&mut c).await.expect("renew");
                    assert!(r.iter().all(|&x| x == 1), "a floor key was lost");
                }
            });
            join_all(calls).await;
        }
    }
    let cpu = workload::cpu_time().saturating_sub(cpu0).as_secs_f64();
    let wall = t0.elapsed().as_secs_f64();
    for c in &mut conns {
        for chunk in keys.chunks(1000) {
            let mut p = redis::pipe();
            for (k, _) in chunk {
                p.cmd("DEL").arg(k).ignore();
            }
            let () = p.query_async(c).await.expect("DEL");
        }
    }
    cpu / wall * 100.0
}

/// lockcore holding `HELD` locks for `RUN`: the process's CPU over the held
/// phase as a share of one core, in %.
async fn ours(url: &str, ns: &str) -> f64 {
    let locker = lockcore_redis::connect(url).await.unwrap();
    let r = workload::hold_many(&locker, ns, HELD, TTL, RUN)
        .await
        .unwrap();
    assert!(r.all_held, "a lease was lost");
    r.cpu.as_secs_f64() / r.wall.as_secs_f64() * 100.0
}

/// The masters of a `redis://` or `redlock://` URL, as `redis://` URLs.
fn servers(url: &str) -> Vec<String> {
    match url.strip_prefix("redlock://") {
        Some(hosts) => hosts
            .split('?')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(|h| format!("redis://{h}"))
            .collect(),
        None => vec![url.to_owned()],
    }
}

fn main() {
    let url =
        std::env::var("LOCKTEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:16379".into());
    let mut urls = vec![("Redis", url)];
    if let Ok(u) = std::env::var("LOCKTEST_REDLOCK_URL") {
        urls.push(("RedLock", u));
    }
    let rt = workload::runtime();
    rt.block_on(async {
        let ns = format!("bench-{:x}", std::process::id());
        println!("| 10,000 held, ttl 3 s, 20 s, CPU of one core | lockcore | floor: the same renewal calls, redis crate alone | ratio |");
        println!("|---|---|---|---|");
        for (label, url) in urls {
            let masters = servers(&url);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..2 {
                a.push(ours(&url, &ns).await);
                b.push(floor(&masters, &ns).await);
            }
            let (sa, sb): (f64, f64) = (a.iter().sum(), b.iter().sum());
            let show = |v: &[f64]| v.iter().map(|x| format!("{x:.2} %")).collect::<Vec<_>>().join(", ");
            println!(
                "| {label}, {} server(s) | {} | {} | {:.2} |",
                masters.len(),
                show(&a),
                show(&b),
                sa / sb
            );
        }
    });
}
