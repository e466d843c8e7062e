//! The cost of held leases beside the floor of the same renewal traffic
//! sent with the redis crate alone, in one run.
//!
//! Run (servers from compose/):
//! `eval "$(compose/local env)"; cargo bench -p lockcore-redis --bench held_floor`
//!
//! One process, alternating (two rounds of each, 20 s each, the same
//! runtime): lockcore holds 10,000 locks with ttl 3 s, renewed every
//! second; the floor sets 10,000 keys with `PX 3000` and then, on each
//! server in a task of its own, every 32 ms (lockcore's grid step at that
//! ttl) renews the next 320 of them round-robin, each key about once a
//! second, in calls of up to 256 keys of the backend's own batched
//! renewal script (its text read from `src/scripts.rs`), each call built
//! at its size as the backend builds it, on one multiplexed connection a
//! server. The floor keeps no lease state: no validity, no lost signal,
//! no queue entry or answer a key. The figures are the process's CPU
//! (user and system) over the held phase, as a share of one core, and
//! what the servers counted meanwhile (`INFO commandstats`): script calls
//! and key renewals (`PEXPIRE`) a second, summed over the servers. With
//! `LOCKTEST_REDLOCK_URL` set, the same on its masters.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::masters;
use lockcore::options::{LockOptions, Wait};
use lockcore::testing::bench as workload;
use redis::aio::MultiplexedConnection;

const HELD: usize = 10_000;
const TTL: Duration = Duration::from_secs(3);
const RUN: Duration = Duration::from_secs(20);
const STEP: Duration = Duration::from_millis(32);
const PER_CALL: usize = 256;

/// The backend's batched renewal script (`RENEW_MANY`), read from its
/// source so that the two cannot differ.
fn renew_many() -> &'static str {
    let src = include_str!("../src/scripts.rs");
    let from = src
        .find("static RENEW_MANY")
        .expect("RENEW_MANY in scripts.rs");
    let rest = &src[from..];
    let start = rest.find("r\"").expect("the script's text") + 2;
    let len = rest[start..].find('"').expect("the script's end");
    let script = &rest[start..start + len];
    assert!(
        script.starts_with("local r = {}") && script.ends_with("return r"),
        "not the batched renewal script: {script}"
    );
    script
}

/// What the servers counted: script calls and `PEXPIRE`s, summed.
async fn counted(conns: &mut [MultiplexedConnection]) -> (u64, u64) {
    let (mut calls, mut renewals) = (0, 0);
    for c in conns {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(c)
            .await
            .expect("INFO");
        let calls_of = |cmd: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
                .and_then(|v| v.split(',').next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // A script run by its text (after `NOSCRIPT`) counts as `eval`.
        calls += calls_of("evalsha") + calls_of("eval");
        renewals += calls_of("pexpire");
    }
    (calls, renewals)
}

/// One phase's figures: CPU of one core in %, script calls a second,
/// key renewals a second.
#[derive(Clone, Copy)]
struct Phase {
    cpu: f64,
    calls: f64,
    renewals: f64,
}

/// Measures `RUN` of whatever runs meanwhile.
async fn measure(stats: &mut [MultiplexedConnection], until: impl std::future::Future) -> Phase {
    let (c0, r0) = counted(stats).await;
    let (cpu0, t0) = (workload::cpu_time(), Instant::now());
    until.await;
    let cpu = workload::cpu_time().saturating_sub(cpu0).as_secs_f64();
    let wall = t0.elapsed().as_secs_f64();
    let (c1, r1) = counted(stats).await;
    Phase {
        cpu: cpu / wall * 100.0,
        calls: c1.checked_sub(c0).expect("the servers' counts were reset") as f64 / wall,
        renewals: r1.checked_sub(r0).expect("the servers' counts were reset") as f64 / wall,
    }
}

/// One server's floor traffic until `end`.
async fn renew_on(
    mut conn: MultiplexedConnection,
    keys: &[(String, String)],
    sha: &str,
    end: Instant,
) {
    let ttl_ms = TTL.as_millis() as u64;
    let per_step = HELD * STEP.as_millis() as usize / 1000;
    let mut tick = tokio::time::interval(STEP);
    let mut next = 0;
    while Instant::now() < end {
        tick.tick().await;
        let due: Vec<&(String, String)> = (0..per_step).map(|j| &keys[(next + j) % HELD]).collect();
        next = (next + per_step) % HELD;
        for chunk in due.chunks(PER_CALL) {
            // Each key, its token and its ttl (at most 20 digits).
            let bytes: usize = chunk.iter().map(|(k, t)| k.len() + t.len() + 20).sum();
            let mut call = redis::Cmd::with_capacity(3 + 3 * chunk.len(), 64 + bytes);
            call.arg("EVALSHA").arg(sha).arg(chunk.len());
            for (k, _) in chunk {
                call.arg(k);
            }
            for (_, t) in chunk {
                call.arg(t).arg(ttl_ms);
            }
            let r: Vec<i64> = call.query_async(&mut conn).await.expect("renew");
            assert!(r.iter().all(|&x| x == 1), "a floor key was lost");
        }
    }
}

/// The floor: `HELD` keys renewed on each of `servers` for `RUN`.
async fn floor(servers: &[String], ns: &str, stats: &mut [MultiplexedConnection]) -> Phase {
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
    let mut sha = String::new();
    for c in &mut conns {
        sha = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(renew_many())
            .query_async(c)
            .await
            .expect("SCRIPT LOAD");
        for chunk in keys.chunks(1000) {
            let mut p = redis::pipe();
            for (k, t) in chunk {
                p.cmd("SET").arg(k).arg(t).arg("PX").arg(&ttl_ms).ignore();
            }
            let () = p.query_async(c).await.expect("SET");
        }
    }
    let end = Instant::now() + RUN;
    let tasks = futures_util::future::join_all(conns.iter().map(|c| {
        let (c, keys, sha) = (c.clone(), keys.clone(), sha.clone());
        tokio::spawn(async move { renew_on(c, &keys, &sha, end).await })
    }));
    let phase = measure(stats, async {
        for t in tasks.await {
            t.expect("a floor task");
        }
    })
    .await;
    for c in &mut conns {
        for chunk in keys.chunks(1000) {
            let mut p = redis::pipe();
            for (k, _) in chunk {
                p.cmd("DEL").arg(k).ignore();
            }
            let () = p.query_async(c).await.expect("DEL");
        }
    }
    phase
}

/// lockcore holding `HELD` locks with renewal for `RUN`.
async fn ours(url: &str, ns: &str, stats: &mut [MultiplexedConnection]) -> Phase {
    let locker = lockcore_redis::connect(url).await.unwrap();
    let opts = LockOptions::new().ttl(TTL).wait(Wait::Try);
    let mut guards = Vec::with_capacity(HELD);
    for i in 0..HELD {
        let g = locker
            .acquire(&format!("{ns}/held/{i}"), &opts)
            .await
            .unwrap();
        guards.push(g.expect("a free name"));
    }
    let phase = measure(stats, tokio::time::sleep(RUN)).await;
    assert!(guards.iter().all(|g| g.is_held()), "a lease was lost");
    for g in guards {
        g.release().await.unwrap();
    }
    phase
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
        println!("10,000 held, ttl 3 s, 20 s a phase; per phase: CPU of one core, script calls/s, key renewals/s (servers' INFO commandstats, summed)");
        println!();
        println!("| backend | lockcore | floor: the same calls, redis crate alone | CPU ratio (of the sums) |");
        println!("|---|---|---|---|");
        for (label, url) in urls {
            let masters = masters(&url);
            let mut stats = Vec::new();
            for s in &masters {
                let client = redis::Client::open(s.as_str()).expect("client");
                stats.push(client.get_multiplexed_async_connection().await.expect("connection"));
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..2 {
                a.push(ours(&url, &ns, &mut stats).await);
                b.push(floor(&masters, &ns, &mut stats).await);
            }
            let sum = |v: &[Phase]| v.iter().map(|p| p.cpu).sum::<f64>();
            let show = |v: &[Phase]| {
                v.iter()
                    .map(|p| format!("{:.2} % ({:.0} calls/s, {:.0} renewals/s)", p.cpu, p.calls, p.renewals))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            println!(
                "| {label}, {} server(s) | {} | {} | {:.2} |",
                masters.len(),
                show(&a),
                show(&b),
                sum(&a) / sum(&b)
            );
        }
    });
}
