//! Workloads for benchmarks, shared by every backend's bench and by
//! `distlock bench` (feature `bench`): uncontended pairs, contended
//! hand-offs, many leases held, semaphore permits and read-write hand-offs.
//!
//! They measure through the full [`Locker`] path (validation, reentrancy
//! map, watchdog, guard), as an application uses it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt};

use crate::locker::Locker;
use crate::options::{LockOptions, Wait};
use crate::primitives::rwlock::RwLock;
use crate::primitives::semaphore::Semaphore;
use crate::raw::sync::lock;

/// The runtime benchmarks run on: multi-threaded, two workers (the
/// machine's cores), timers and I/O on.
///
/// # Panics
///
/// When the runtime cannot be built (benchmark code only).
#[allow(clippy::expect_used)]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Acquire+release pairs on `name` until `until`; returns how many.
///
/// # Errors
///
/// The first error of an acquisition or release.
pub async fn pairs(locker: &Locker, name: &str, until: Instant) -> crate::error::Result<u64> {
    let opts = LockOptions::new().wait(Wait::Try);
    let mut n = 0;
    while Instant::now() < until {
        if let Some(g) = locker.acquire(name, &opts).await? {
            g.release().await?;
            n += 1;
        }
    }
    Ok(n)
}

/// Uncontended pairs per second: `tasks` tasks, each on its own name,
/// sharing `locker`'s connection (every acquisition is its own owner).
pub async fn uncontended(
    locker: &Locker,
    prefix: &str,
    tasks: usize,
    run: Duration,
) -> crate::error::Result<f64> {
    let start = Instant::now();
    let until = start + run;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (l, name) = (locker.clone(), format!("{prefix}/uncontended/{i}"));
            tokio::spawn(async move { pairs(&l, &name, until).await })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h
            .await
            .map_err(|e| crate::error::Error::backend_error("bench", format!("task: {e}")))??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// A release to run: what a [`Take`] returns with what it took.
pub type Release = BoxFuture<'static, crate::error::Result<()>>;

/// One contender's way to take the contended thing with the options given
/// (a lock, a read or write lock): its release, or `None` when the wait
/// ended without it.
pub type Take = Arc<
    dyn Fn(LockOptions) -> BoxFuture<'static, crate::error::Result<Option<Release>>> + Send + Sync,
>;

/// A [`Take`] of lock `name` through `locker`.
pub fn take_lock(locker: Locker, name: &str) -> Take {
    let name = name.to_owned();
    Arc::new(move |opts| {
        let (l, name) = (locker.clone(), name.clone());
        async move {
            Ok(l.acquire(&name, &opts)
                .await?
                .map(|g| -> Release { Box::pin(g.release()) }))
        }
        .boxed()
    })
}

/// Hand-off latencies (release sent → next holder acquired) with one client
/// per `lockers` entry contending for `name` for `run`. A client that
/// released waits for the next holder before contending again, so every
/// hand-off goes to a client that was waiting.
pub async fn handoffs(
    lockers: Vec<Locker>,
    name: &str,
    run: Duration,
) -> crate::error::Result<Vec<Duration>> {
    handoffs_of(
        lockers.into_iter().map(|l| take_lock(l, name)).collect(),
        run,
    )
    .await
}

/// Reader/writer hand-off latencies on read-write lock `name`: one writer
/// (through `writer`) and one reader (through `reader`) take turns for
/// `run`, each waiting while the other holds, as in [`handoffs`].
///
/// # Errors
///
/// An invalid name; the first error of an acquisition or release.
pub async fn rw_handoffs(
    writer: &Locker,
    reader: &Locker,
    name: &str,
    run: Duration,
) -> crate::error::Result<Vec<Duration>> {
    let (w, r) = (RwLock::new(writer, name)?, RwLock::new(reader, name)?);
    let write: Take = Arc::new(move |opts| {
        let w = w.clone();
        async move {
            Ok(w.write(&opts)
                .await?
                .map(|g| -> Release { Box::pin(g.release()) }))
        }
        .boxed()
    });
    let read: Take = Arc::new(move |opts| {
        let r = r.clone();
        async move {
            Ok(r.read(&opts)
                .await?
                .map(|g| -> Release { Box::pin(g.release()) }))
        }
        .boxed()
    });
    handoffs_of(vec![write, read], run).await
}

/// Permit hand-off latencies to a queued waiter on a full semaphore of
/// `permits` on `name`: `permits - 1` permits are held through `holder` for
/// the whole run, and two clients (`a` and `b`) take turns on the last one.
/// In each turn the holder of the last permit keeps it for 20 ms while the
/// other waits, so that the waiter is queued, then releases it; the
/// sample is from the release's start to the waiter's grant. A waiter
/// learns of the one permit freed among many held ones.
///
/// # Errors
///
/// An invalid name or count; the first error of an acquisition or release.
pub async fn permit_handoffs(
    holder: &Locker,
    a: &Locker,
    b: &Locker,
    name: &str,
    permits: u32,
    run: Duration,
) -> crate::error::Result<Vec<Duration>> {
    let sem = Semaphore::new(holder, name, permits)?;
    let none_free = || {
        crate::error::Error::new(
            crate::error::ErrorKind::Backend,
            holder.backend_name(),
            format!("a semaphore of {permits} permits with {permits} - 1 held had none free"),
        )
    };
    let mut held = Vec::new();
    for _ in 1..permits {
        held.push(sem.try_acquire().await?.ok_or_else(none_free)?);
    }
    let sems = [
        Semaphore::new(a, name, permits)?,
        Semaphore::new(b, name, permits)?,
    ];
    let until = Instant::now() + run;
    let mut samples = Vec::new();
    let mut last = sems[0].try_acquire().await?.ok_or_else(none_free)?;
    let mut turn = 1;
    while Instant::now() < until {
        let waiter = sems[turn % 2].clone();
        let wait = tokio::spawn(async move {
            let p = waiter.acquire_timeout(Duration::from_secs(30)).await;
            (p, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = Instant::now();
        last.release().await?;
        let (p, got) = wait
            .await
            .map_err(|e| crate::error::Error::backend_error("bench", format!("task: {e}")))?;
        last = p?;
        samples.push(got.saturating_duration_since(released));
        turn += 1;
    }
    last.release().await?;
    for p in held {
        p.release().await?;
    }
    samples.sort();
    Ok(samples)
}

/// Permits acquired and released per second by one task on a semaphore of
/// `permits` on `name` (uncontended: every attempt finds a free permit),
/// and beside it the same task's lock pairs per second on `name/lock`,
/// measured in alternating thirds of `run` so that both see the same load.
/// Returns `(permits per second, lock pairs per second)`.
///
/// # Errors
///
/// An invalid name or count; the first error of an acquisition or release.
pub async fn permit_pairs(
    locker: &Locker,
    name: &str,
    permits: u32,
    run: Duration,
) -> crate::error::Result<(f64, f64)> {
    let sem = Semaphore::new(locker, name, permits)?;
    let lock_name = format!("{name}/lock");
    let slice = run / 6;
    let (mut n_permits, mut t_permits) = (0u64, Duration::ZERO);
    let (mut n_locks, mut t_locks) = (0u64, Duration::ZERO);
    for _ in 0..3 {
        let start = Instant::now();
        let until = start + slice;
        while Instant::now() < until {
            if let Some(p) = sem.try_acquire().await? {
                p.release().await?;
                n_permits += 1;
            }
        }
        t_permits += start.elapsed();
        let start = Instant::now();
        n_locks += pairs(locker, &lock_name, start + slice).await?;
        t_locks += start.elapsed();
    }
    Ok((
        n_permits as f64 / t_permits.as_secs_f64().max(1e-9),
        n_locks as f64 / t_locks.as_secs_f64().max(1e-9),
    ))
}

/// Hand-off latencies among `contenders` (see [`handoffs`]).
///
/// # Errors
///
/// The first error of an acquisition or release.
pub async fn handoffs_of(
    contenders: Vec<Take>,
    run: Duration,
) -> crate::error::Result<Vec<Duration>> {
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let turn = Arc::new(tokio::sync::watch::channel(0u64).0);
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for take in contenders {
        let (released_at, samples, turn) = (released_at.clone(), samples.clone(), turn.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = turn.subscribe();
            while Instant::now() < until {
                let opts = LockOptions::new()
                    .wait(Wait::For(until.saturating_duration_since(Instant::now())));
                let release = match take(opts).await {
                    Ok(Some(r)) => r,
                    Ok(None) => break,
                    Err(e) if e.kind() == crate::error::ErrorKind::Timeout => break,
                    Err(e) => return Err(e),
                };
                let now = Instant::now();
                if let Some(r) = lock(&released_at).take() {
                    lock(&samples).push(now - r);
                }
                turn.send_modify(|n| *n += 1);
                seen.mark_unchanged();
                *lock(&released_at) = Some(Instant::now());
                release.await?;
                let _ = tokio::time::timeout(Duration::from_millis(200), seen.changed()).await;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| crate::error::Error::backend_error("bench", format!("task: {e}")))??;
    }
    let mut v = lock(&samples).clone();
    v.sort();
    Ok(v)
}

/// The `p` quantile (0..=1) of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What holding many leases with renewal cost.
#[derive(Debug, Clone, Copy)]
pub struct HeldReport {
    /// Leases held.
    pub leases: usize,
    /// Resident memory added by taking them, KiB.
    pub rss_added_kib: u64,
    /// CPU time (user + system) of this process while holding them.
    pub cpu: Duration,
    /// Wall time they were held.
    pub wall: Duration,
    /// Whether every lease was still held at the end.
    pub all_held: bool,
}

/// Holds `k` names with renewal on (ttl `ttl`) for `run`, then releases them.
pub async fn hold_many(
    locker: &Locker,
    prefix: &str,
    k: usize,
    ttl: Duration,
    run: Duration,
) -> crate::error::Result<HeldReport> {
    let before = rss_kib();
    let opts = LockOptions::new().ttl(ttl).wait(Wait::Try);
    let mut guards = Vec::with_capacity(k);
    for i in 0..k {
        if let Some(g) = locker.acquire(&format!("{prefix}/held/{i}"), &opts).await? {
            guards.push(g);
        }
    }
    let added = rss_kib().saturating_sub(before);
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    tokio::time::sleep(run).await;
    let report = HeldReport {
        leases: guards.len(),
        rss_added_kib: added,
        cpu: cpu_time().saturating_sub(cpu0),
        wall: t0.elapsed(),
        all_held: guards.iter().all(|g| g.is_held()),
    };
    for g in guards {
        g.release().await?;
    }
    Ok(report)
}

/// Resident set size of this process in KiB (Linux; 0 elsewhere).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User + system CPU time of this process (Linux; zero elsewhere).
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    Duration::from_millis(cpu_ticks(&stat) * 10) // USER_HZ is 100 on Linux
}

/// utime + stime, in clock ticks, of a `/proc/PID/stat` line: the 14th and
/// 15th fields, counted by position after the command name (in
/// parentheses), since some fields before them can be negative (`tpgid` is
/// -1 without a controlling terminal).
fn cpu_ticks(stat: &str) -> u64 {
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    // After the name: state, ppid, pgrp, session, tty_nr, tpgid, flags,
    // minflt, cminflt, majflt, cmajflt, utime, stime.
    let field = |i: usize| -> u64 {
        rest.split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

#[cfg(test)]
mod tests {
    use super::cpu_ticks;

    #[test]
    fn cpu_ticks_by_position_without_a_terminal() {
        // tty_nr 0 and tpgid -1: a process without a controlling terminal.
        let stat = "4242 (dist lock) S 1 4242 4242 0 -1 4194560 1500 0 0 0 700 30 5 6 20 0 9 0";
        assert_eq!(cpu_ticks(stat), 730);
        let with_tty = "4242 (x) S 1 4242 4242 34816 4242 4194560 1500 0 0 0 700 30 5 6 20 0 9 0";
        assert_eq!(cpu_ticks(with_tty), 730);
    }
}
