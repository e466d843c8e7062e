//! A worker process: its faults, its contention, its journal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{LockOptions, Locker, Wait};

use crate::{ClientPause, Dir, Harness, Proxies};

use lockcore::testing::rng::Rng;

use super::clock::*;
use super::journal::*;

/// harness `harness` is; the plan comes from `LOCKTEST_WORKER_PLAN`.
pub(crate) async fn worker(harness: Arc<dyn Harness>) -> Result<(), String> {
    let plan_text = std::env::var(PLAN_VAR).map_err(|_| format!("{PLAN_VAR} is unset"))?;
    let plan: HashMap<&str, &str> = plan_text
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let get = |k: &str| {
        plan.get(k)
            .copied()
            .ok_or_else(|| format!("the plan has no {k}"))
    };
    let num = |k: &str| -> Result<u64, String> {
        get(k)?.parse().map_err(|e| format!("the plan's {k}: {e}"))
    };
    let run_for = Duration::from_millis(num("secs")?);
    let ttl = Duration::from_millis(num("ttl_ms")?);
    let seed = num("seed")?;
    let faults = num("faults")? == 1;
    let names: Vec<String> = get("names")?.split(',').map(str::to_owned).collect();
    let file = std::fs::File::create(get("journal")?).map_err(|e| e.to_string())?;
    let journal = Arc::new(JournalFile {
        file: Mutex::new(file),
        clock: Clock::now(),
        next: AtomicU64::new(0),
    });
    let until = Instant::now() + run_for;
    let proxies = Proxies::new();
    let pause = ClientPause::new();
    let base = if faults && harness.can_proxy() {
        match harness.connect_via(&proxies).await {
            Some(Ok(l)) => l,
            Some(Err(e)) => return Err(format!("connecting through a proxy: {e}")),
            None => harness.connect().await.map_err(|e| e.to_string())?,
        }
    } else {
        harness.connect().await.map_err(|e| e.to_string())?
    };
    let locker = if faults { pause.wrap(&base) } else { base };
    let errors = Arc::new(AtomicU64::new(0));
    let rng = Arc::new(Rng::new(seed));
    let mut tasks = Vec::new();
    for t in 0..3u64 {
        tasks.push(tokio::spawn(contend(
            locker.clone(),
            names.clone(),
            ttl,
            until,
            seed.wrapping_add(t),
            journal.clone(),
            errors.clone(),
        )));
    }
    if faults {
        let (proxies, pause, rng) = (proxies.clone(), pause.clone(), rng.clone());
        // A connection-kept lease ends on the server the moment its
        // connection is reset, before its holder can know (the known limit
        // of LeaseKind::Connection): no resets there.
        let resets = locker.capabilities().lease != lockcore::LeaseKind::Connection;
        tasks.push(tokio::spawn(async move {
            inject(&proxies, &pause, ttl, until, &rng, resets).await;
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("a worker task failed: {e}"))?;
    }
    proxies.heal();
    pause.resume();
    lockcore::cleanup::flush(Duration::from_secs(10)).await;
    journal.line(&format!("X\t{}\n", errors.load(Ordering::Relaxed)));
    Ok(())
}

/// Faults this worker's own client now and then.
pub(crate) async fn inject(
    proxies: &Proxies,
    pause: &ClientPause,
    ttl: Duration,
    until: Instant,
    rng: &Rng,
    resets: bool,
) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2000) + rng.millis(4000)).await;
        let span = rng.millis(ttl_ms * 2);
        match rng.below(4) {
            0 => {
                proxies.blackhole(Dir::Both);
                tokio::time::sleep(span).await;
                proxies.heal();
            }
            1 => {
                proxies.delay(Dir::Down, Duration::from_millis(50) + rng.millis(250));
                tokio::time::sleep(span).await;
                proxies.heal();
            }
            2 if resets => proxies.reset(),
            _ => {
                pause.pause();
                tokio::time::sleep(span).await;
                pause.resume();
            }
        }
    }
}

/// One contending task of a worker.
pub(crate) async fn contend(
    locker: Locker,
    names: Vec<String>,
    ttl: Duration,
    until: Instant,
    seed: u64,
    journal: Arc<JournalFile>,
    errors: Arc<AtomicU64>,
) {
    let rng = Rng::new(seed);
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    while Instant::now() < until {
        let name = &names[usize::try_from(rng.below(names.len() as u64)).unwrap_or(0)];
        let wait = match rng.below(3) {
            0 => Wait::Try,
            1 => Wait::For(rng.millis(2000)),
            _ => Wait::For(until.saturating_duration_since(Instant::now()) + ttl),
        };
        let opts = LockOptions::new().ttl(ttl).wait(wait);
        let acquire = locker.acquire(name, &opts);
        let outcome = if rng.below(5) == 0 {
            // Cut off at a random point.
            match tokio::time::timeout(rng.millis(500), acquire).await {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            acquire.await
        };
        let guard = match outcome {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) if e.kind() == lockcore::ErrorKind::Timeout => continue,
            Err(e) => {
                if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    journal.line(&format!(
                        "R\t{:?}\t{}\n",
                        e.kind(),
                        e.to_string().replace(['\t', '\n'], " ")
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acquired = lockcore::raw::now();
        let id = journal.next.fetch_add(1, Ordering::Relaxed);
        let fence = guard
            .fence()
            .map_or_else(|| "-".to_owned(), |f| f.to_string());
        journal.line(&format!(
            "A\t{id}\t{name}\t{fence}\t{}\n",
            journal.clock.ns(acquired)
        ));
        // Mostly short holds, now and then one past several renewals.
        let hold = if rng.below(5) == 0 {
            rng.millis(ttl_ms * 2)
        } else {
            rng.millis(30)
        };
        let lost = tokio::select! {
            () = guard.lost() => true,
            () = tokio::time::sleep(hold) => false,
        };
        let ended = guard.validity_end(lockcore::raw::now());
        let how = if lost || !guard.is_held() {
            format!("lost: {}", guard.lost_reason().unwrap_or("?"))
        } else {
            "released".to_owned()
        };
        journal.line(&format!("E\t{id}\t{}\t{how}\n", journal.clock.ns(ended)));
        match rng.below(4) {
            0 => drop(guard),
            1 => guard.abandon(),
            _ => {
                let _ = guard.release().await;
            }
        }
    }
}
