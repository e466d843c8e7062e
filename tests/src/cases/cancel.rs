//! Cancel safety: an acquire future dropped at any point leaves nothing on
//! the server, also when the drop lands inside a request or inside the
//! cleanup of an earlier step.

use std::time::Duration;

use lockcore::{Wait, DEFAULT_TTL};
use rand::RngExt;

use super::{acquire_within, must_try, nothing_left, opts, SLACK};
use crate::{Ctx, Dir, Proxies};

/// Dropping acquire futures at any point leaves nothing behind: the name is
/// free again within one cleanup round trip of the holder's release.
pub async fn cancel_safety_of_dropped_acquire(ctx: Ctx) {
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let name = ctx.name("cancel");
    // Waiters dropped while the name is held.
    let g = must_try(&a, &name).await;
    let waiting = tokio::time::timeout(Duration::from_millis(300), b.lock(&name)).await;
    assert!(waiting.is_err(), "acquired a held name");
    for i in 0..10u64 {
        let (b, name) = (b.clone(), name.clone());
        let task = tokio::spawn(async move { b.lock(&name).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(i * 7)).await;
        task.abort();
        let _ = task.await;
    }
    g.release().await.expect("release");
    acquire_within(&c, &name, SLACK)
        .await
        .release()
        .await
        .expect("release");
    // Acquisitions of a free name dropped at random points.
    for i in 0..20u64 {
        let (b, name) = (b.clone(), name.clone());
        let task = tokio::spawn(async move { b.lock(&name).await.map(drop) });
        tokio::time::sleep(Duration::from_micros(i * 250)).await;
        task.abort();
        let _ = task.await;
    }
    acquire_within(&c, &name, SLACK)
        .await
        .release()
        .await
        .expect("release");
}

/// `try_lock`, `lock_timeout` and `lock` futures dropped at random points,
/// 51 times, on a held and on a free name, with every request of the client
/// slowed down (through a proxy, where the harness can) so that the drops
/// land inside requests and inside the cleanup of a timed-out wait; then a
/// wait whose own cleanup is slower than the `Locker`'s grace after its
/// deadline. Leases are 30 s, so only a cleanup frees the name in time:
/// another client gets it within a few seconds, and nothing is left.
pub async fn dropped_at_random_points(ctx: Ctx) {
    const DROPS: usize = 51;
    let proxies = Proxies::new();
    let proxied = ctx.locker_via(&proxies).await;
    let delay = if proxied.is_some() {
        Duration::from_millis(15)
    } else {
        Duration::ZERO
    };
    let l = match proxied {
        Some(l) => l,
        None => ctx.locker().await,
    };
    let holder = ctx.locker().await;
    let name = ctx.name("drops");
    let short_wait = Duration::from_millis(300);
    // How far into an acquisition a drop may land: its requests, its wait,
    // and the cleanup after a timed-out wait.
    let horizon = short_wait + delay * 8 + Duration::from_millis(100);
    for i in 0..DROPS {
        let wait = match i % 3 {
            0 => Wait::Try,
            1 => Wait::For(short_wait),
            _ => Wait::Forever,
        };
        let held = (i / 3) % 2 == 0;
        let g = if held {
            proxies.delay(Dir::Both, Duration::ZERO);
            let g = acquire_within(&holder, &name, SLACK).await;
            Some(g)
        } else {
            None
        };
        proxies.delay(Dir::Both, delay);
        let at = rand::rng().random_range(Duration::ZERO..=horizon);
        let task = {
            let (l, name) = (l.clone(), name.clone());
            tokio::spawn(async move {
                l.acquire(&name, &opts(DEFAULT_TTL, wait, true))
                    .await
                    .map(drop)
            })
        };
        tokio::time::sleep(at).await;
        task.abort();
        let _ = task.await;
        if let Some(g) = g {
            g.release().await.expect("release");
        }
    }
    proxies.delay(Dir::Both, Duration::ZERO);
    if ctx.harness.can_proxy() {
        // A wait that queues, then times out while its cleanup is slower
        // than the Locker's grace: the Locker drops the backend's future
        // inside that cleanup.
        let g = acquire_within(&holder, &name, SLACK).await;
        let (l2, n2) = (l.clone(), name.clone());
        let waiting =
            tokio::spawn(async move { l2.lock_timeout(&n2, Duration::from_secs(1)).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxies.delay(Dir::Both, Duration::from_millis(900));
        let r = tokio::time::timeout(SLACK * 3, waiting)
            .await
            .expect("the wait ended")
            .expect("task");
        assert!(r.is_err(), "acquired a held name");
        proxies.delay(Dir::Both, Duration::ZERO);
        g.release().await.expect("release");
    }
    nothing_left(&ctx, &name, SLACK * 2).await;
}
