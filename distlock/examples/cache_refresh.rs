//! "Lock + cache": an expensive value is refreshed once across many
//! replicas. Each replica checks the cache; on a miss it takes the lock,
//! checks again (another replica may have filled it meanwhile), computes,
//! stores with its fencing token (a store that has seen a larger token
//! refuses the write: a replica whose lease was lost cannot overwrite a
//! newer value), and releases.
//!
//! Run: `cargo run -p distlock --example cache_refresh`
//! (any backend: `DISTLOCK_URL=redis://127.0.0.1:6379 cargo run -p distlock --features redis --example cache_refresh`)

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::fencing::FenceGate;

/// The shared cache, as a store that replicas reach over the network
/// would be: values by key, writes fenced by the lock's token.
#[derive(Default)]
struct Cache {
    values: Mutex<HashMap<String, String>>,
    gate: FenceGate,
}

impl Cache {
    fn get(&self, key: &str) -> Option<String> {
        self.values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Stores `value` unless a write with a larger token came first (the
    /// check and the write under one lock, as a store does them in one
    /// transaction).
    fn put(&self, key: &str, value: String, fence: Option<u64>) -> Result<(), String> {
        let mut values = self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(token) = fence {
            self.gate.check(key, token).map_err(|e| e.to_string())?;
        }
        values.insert(key.to_owned(), value);
        Ok(())
    }
}

/// One replica's read: the cached value, or a refresh under the lock.
async fn read(
    locker: &distlock::Locker,
    cache: &Cache,
    computed: &AtomicUsize,
    key: &str,
) -> distlock::Result<String> {
    if let Some(v) = cache.get(key) {
        return Ok(v);
    }
    let guard = locker
        .lock_timeout(&format!("cache/{key}"), Duration::from_secs(30))
        .await?;
    // Another replica may have refreshed it while this one waited.
    if let Some(v) = cache.get(key) {
        guard.release().await?;
        return Ok(v);
    }
    computed.fetch_add(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(200)).await; // the expensive part
    let value = format!("report built under token {:?}", guard.fence());
    if let Err(stale) = cache.put(key, value.clone(), guard.fence()) {
        println!("a newer value is there already: {stale}");
    }
    guard.release().await?;
    Ok(value)
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = std::env::var("DISTLOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    let cache = Arc::new(Cache::default());
    let computed = Arc::new(AtomicUsize::new(0));
    let key = format!("daily-report-{}", std::process::id());
    let mut replicas = tokio::task::JoinSet::new();
    for id in 0..8 {
        // Each replica has its own connection, as separate processes would.
        let locker = distlock::connect(&url).await?;
        let (cache, computed, key) = (cache.clone(), computed.clone(), key.clone());
        replicas.spawn(async move {
            let v = read(&locker, &cache, &computed, &key).await?;
            println!("replica {id}: {v}");
            Ok::<_, distlock::Error>(())
        });
    }
    while let Some(done) = replicas.join_next().await {
        match done {
            Ok(r) => r?,
            Err(e) => eprintln!("a replica's task failed: {e}"),
        }
    }
    let n = computed.load(Ordering::Relaxed);
    println!("computed {n} time(s) for 8 replicas");
    Ok(())
}
