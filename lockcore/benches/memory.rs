//! Benchmarks of the in-memory backend through the full `Locker` path
//! (validation, reentrancy map, watchdog, guard).
//!
//! Run: `cargo bench -p lockcore --bench memory` (optionally `-- PAIRS HELD SECONDS`).
//!
//! 1. One task, uncontended: acquire + release pairs per second, with the
//!    watchdog on (the default) and off.
//! 2. `HELD` leases held at once with renewal on (ttl 3 s, so each lease is
//!    renewed every second): resident memory per lease, and the CPU time the
//!    renewals cost over `SECONDS`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use lockcore::{LockOptions, Locker, Wait};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .filter(|a| !a.starts_with("--"))
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Resident set size in KiB, from /proc.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here
    // (state is not numeric and is skipped).
    let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

async fn pairs(locker: &Locker, n: u64, renew: bool) -> f64 {
    let opts = LockOptions::new().wait(Wait::Try).renew(renew);
    let t = Instant::now();
    for _ in 0..n {
        let g = locker.acquire("bench/pair", &opts).await.unwrap().unwrap();
        g.release().await.unwrap();
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let n_pairs = arg(1, 500_000);
    let n_held = arg(2, 10_000) as usize;
    let seconds = arg(3, 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = Locker::memory();
        // Warm up.
        pairs(&locker, 10_000, true).await;
        let with = pairs(&locker, n_pairs, true).await;
        let without = pairs(&locker, n_pairs, false).await;
        println!("memory: uncontended acquire+release, one task, {n_pairs} pairs");
        println!("  renewal on : {with:>12.0} pairs/s");
        println!("  renewal off: {without:>12.0} pairs/s");

        let before = rss_kib();
        let opts = LockOptions::new().ttl(Duration::from_secs(3)).wait(Wait::Try);
        let mut guards = Vec::with_capacity(n_held);
        for i in 0..n_held {
            guards.push(locker.acquire(&format!("bench/held/{i}"), &opts).await.unwrap().unwrap());
        }
        let after = rss_kib();
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let cpu = cpu_time() - cpu0;
        let wall = t0.elapsed();
        assert!(guards.iter().all(|g| g.is_held()), "a lease was lost");
        let renewals = n_held as f64 * wall.as_secs_f64() / 1.0;
        println!("memory: {n_held} leases held with renewal on (ttl 3 s, renewed every 1 s), {seconds} s");
        println!(
            "  memory: {} KiB more resident ({:.0} bytes per lease); process RSS {} KiB",
            after.saturating_sub(before),
            after.saturating_sub(before) as f64 * 1024.0 / n_held as f64,
            after
        );
        println!(
            "  cpu: {:.3} s over {:.1} s = {:.2}% of one core (~{:.0} renewals, {:.1} µs each)",
            cpu.as_secs_f64(),
            wall.as_secs_f64(),
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
            renewals,
            cpu.as_secs_f64() * 1e6 / renewals
        );
        for g in guards {
            g.release().await.unwrap();
        }
    });
}
