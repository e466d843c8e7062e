//! Several tasks contend for one lock on the embedded in-memory backend:
//! fencing tokens, `try`, wait with a timeout, and the lost signal.
//!
//! Run: `cargo run -p distlock --example quickstart`
//! (any backend: `DISTLOCK_URL=redis://127.0.0.1:6379 cargo run -p distlock --features redis --example quickstart`)

use std::time::Duration;

use distlock::{LockOptions, Wait};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let url = std::env::var("DISTLOCK_URL").unwrap_or_else(|_| "memory://".to_owned());
    let locker = distlock::connect(&url).await?;
    println!("backend: {} ({url})", locker.backend_name());

    // 1. Four workers contend; each holds the lock in turn.
    let mut workers = Vec::new();
    for id in 0..4 {
        let locker = locker.clone(); // each clone is its own owner
        workers.push(tokio::spawn(async move {
            let guard = locker.lock("quickstart/report").await?;
            println!(
                "worker {id} holds the lock with fencing token {:?}",
                guard.fence()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await
        }));
    }
    for w in workers {
        w.await.map_err(|e| {
            distlock::Error::backend_error("quickstart", format!("worker task: {e}"))
        })??;
    }

    // 2. try: contention is Ok(None), not an error.
    let holder = locker.clone();
    let held = holder.lock("quickstart/report").await?;
    match locker.try_lock("quickstart/report").await? {
        Some(_) => println!("try: acquired (unexpected)"),
        None => println!("try: held by another owner -> Ok(None)"),
    }

    // 3. wait with a timeout.
    match locker
        .lock_timeout("quickstart/report", Duration::from_millis(300))
        .await
    {
        Err(e) if e.kind() == distlock::ErrorKind::Timeout => println!("wait 300ms: {e}"),
        other => println!("wait 300ms: unexpected {other:?}"),
    }
    held.release().await?;

    // 4. lost: without renewal, a lease ends after its ttl and the guard says so.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .renew(false)
        .wait(Wait::Try);
    let Some(guard) = locker.acquire("quickstart/short", &opts).await? else {
        println!("quickstart/short is held by someone else");
        return Ok(());
    };
    println!("holding quickstart/short for its 1 s ttl without renewal...");
    guard.lost().await;
    println!(
        "lost signal fired: is_held() = {}, reason: {}",
        guard.is_held(),
        guard.lost_reason().unwrap_or("?")
    );
    match guard.release().await {
        Err(e) => println!("release of the lost lease: {e}"),
        Ok(()) => println!("release: ok (unexpected)"),
    }
    Ok(())
}
