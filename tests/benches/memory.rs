//! The in-memory backend's figures.
//!
//! Run: `cargo bench -p lockcore-conformance --bench memory`
//!
//! 1. 10,000 leases held at once with renewal on (ttl 3 s, so each lease is
//!    renewed every second) for 10 s: resident memory per lease, and the CPU
//!    the renewals cost (measured first, on a fresh heap).
//! 2. One task, uncontended acquire + release pairs per second (renewal on).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use lockcore::testing::bench as workload;
use lockcore::Locker;

fn main() {
    let rt = workload::runtime();
    rt.block_on(async {
        let locker = Locker::memory();
        let held = 10_000;
        let r = workload::hold_many(&locker, "bench", held, Duration::from_secs(3), Duration::from_secs(10))
            .await
            .unwrap();
        assert!(r.all_held, "a lease was lost");
        let renewals = r.leases as f64 * r.wall.as_secs_f64();
        println!(
            "memory: {} leases held with renewal (ttl 3 s) for {:.1} s: +{} KiB resident ({:.0} B per lease), \
             process RSS {} KiB; CPU {:.3} s = {:.2}% of one core (~{:.0} renewals, {:.2} µs each)",
            r.leases,
            r.wall.as_secs_f64(),
            r.rss_added_kib,
            r.rss_added_kib as f64 * 1024.0 / r.leases as f64,
            workload::rss_kib(),
            r.cpu.as_secs_f64(),
            100.0 * r.cpu.as_secs_f64() / r.wall.as_secs_f64(),
            renewals,
            r.cpu.as_secs_f64() * 1e6 / renewals,
        );
        workload::uncontended(&locker, "warm", 1, Duration::from_millis(500)).await.unwrap();
        let one = workload::uncontended(&locker, "bench", 1, Duration::from_secs(3)).await.unwrap();
        println!("memory: uncontended acquire+release, one task: {one:.0} pairs/s");
    });
}
