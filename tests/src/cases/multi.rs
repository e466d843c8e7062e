//! Multi-name locks (Redisson's `MultiLock`): all or none, in one global
//! order, cancel safe.

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Wait};
use rand::RngExt;

use super::{acquire_within, must_be_held, must_try, nothing_left, opts, SLACK, TRY_BOUND};
use crate::{Ctx, Dir, Proxies};

/// A multi-acquire whose early name is lost while a later one is awaited
/// gives `Lost` and releases everything: all or none.
pub async fn lock_all_lost_while_waiting_is_refused(ctx: Ctx) {
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let (x, y) = (ctx.name("early/x"), ctx.name("early/y"));
    let held = b.try_lock(&y).await.expect("try").expect("free");
    let multi = tokio::spawn({
        let (x, y) = (x.clone(), y.clone());
        async move {
            a.acquire_all(
                &[&x, &y],
                &LockOptions::new()
                    .ttl(Duration::from_secs(1))
                    .wait(Wait::For(Duration::from_secs(30))),
            )
            .await
        }
    });
    // x is taken first (sorted), then y awaited.
    let deadline = Instant::now() + SLACK;
    loop {
        match c.try_lock(&x).await.expect("try") {
            None => break,
            Some(g) => g.release().await.expect("release"),
        }
        assert!(Instant::now() < deadline, "x was never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        ctx.harness.revoke(&x).await.expect("revoke"),
        "x was not held"
    );
    // The multi-acquire's renewal of x (every third of its 1 s ttl) finds
    // it gone before y is released.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.release().await.expect("release");
    match multi.await.expect("task") {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Lost, "{e}"),
        Ok(Some(g)) => panic!("granted with x lost (x held: {})", g.guards()[0].is_held()),
        Ok(None) => panic!("no grant and no error"),
    }
    c.try_lock(&y)
        .await
        .expect("try")
        .expect("y was released")
        .release()
        .await
        .expect("release");
}

/// Two callers take overlapping sets of names in opposite orders, many
/// times: neither deadlocks (each finishes within the bound), and while
/// each holds its set, the server refuses every name of it to a third
/// client.
pub async fn lock_all_in_opposite_orders_never_deadlocks(ctx: Ctx) {
    let names = [
        ctx.name("multi/a"),
        ctx.name("multi/b"),
        ctx.name("multi/c"),
    ];
    let forward = vec![names[0].clone(), names[1].clone(), names[2].clone()];
    let backward = vec![names[2].clone(), names[1].clone()];
    let third = ctx.locker().await;
    let mut tasks = Vec::new();
    for set in [forward, backward] {
        let l = ctx.locker().await;
        let third = third.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let g = l.lock_all(&set).await.expect("lock_all");
                for n in &set {
                    must_be_held(&third, n).await;
                }
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a multi-locker deadlocked")
            .expect("task");
    }
}

/// All or none: a multi-acquire that finds one name held takes none
/// (`try`), or gives up at its deadline and releases what it took
/// (`Wait::For`); each name's token is exposed; a dropped multi-acquire
/// leaves nothing held.
pub async fn lock_all_is_all_or_none(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (x, y, z) = (ctx.name("all/x"), ctx.name("all/y"), ctx.name("all/z"));
    let held = b.try_lock(&y).await.expect("try").expect("free");
    assert!(a.try_lock_all(&[&x, &y, &z]).await.expect("try").is_none());
    let err = a
        .acquire_all(
            &[&z, &y, &x],
            &LockOptions::new().wait(Wait::For(Duration::from_millis(500))),
        )
        .await
        .expect_err("y stays held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // A dropped one, mid-wait.
    let dropped = tokio::time::timeout(Duration::from_millis(300), a.lock_all(&[&x, &y, &z])).await;
    assert!(dropped.is_err(), "y is held: the multi-lock cannot finish");
    // Nothing of those attempts is held: x and z are free at once.
    let c = ctx.locker().await;
    let free = c
        .acquire_all(&[&x, &z], &LockOptions::new().wait(Wait::For(SLACK)))
        .await
        .expect("x and z were released")
        .expect("granted");
    if ctx.caps.has_fencing() {
        assert!(free.fence(&x).is_some() && free.fence(&z).is_some());
    }
    assert_eq!(free.names().collect::<Vec<_>>(), {
        let mut v = vec![x.as_str(), z.as_str()];
        v.sort_unstable();
        v
    });
    free.release().await.expect("release");
    held.release().await.expect("release");
}

/// The multi-guard's lost fires when any one of its leases is lost (one
/// name revoked on the server), while the other names stay held.
pub async fn lock_all_lost_when_any_lease_is(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (x, y) = (ctx.name("lost/x"), ctx.name("lost/y"));
    let g = a
        .acquire_all(
            &[&x, &y],
            &LockOptions::new()
                .ttl(Duration::from_secs(1))
                .wait(Wait::Try),
        )
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        ctx.harness.revoke(&y).await.expect("revoke"),
        "y was not held"
    );
    tokio::time::timeout(Duration::from_secs(1) + SLACK, g.lost())
        .await
        .expect("the multi-guard's lost fires when y is lost");
    assert!(!g.is_held());
    must_be_held(&b, &x).await;
    let _ = g.release().await;
}

/// Multi-acquires over three names dropped at random points, 30 times:
/// with every name free (the path a backend may take in one request), with
/// the middle one held, and waiting; every client request slowed down
/// (through a proxy, where the harness can) so that the drops land inside
/// requests. Leases are 30 s, so only a cleanup frees the names in time:
/// another client gets each within a few seconds, and nothing is left.
pub async fn lock_all_dropped_at_random_points(ctx: Ctx) {
    const DROPS: usize = 30;
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
    let names = [
        ctx.name("drops-all/a"),
        ctx.name("drops-all/b"),
        ctx.name("drops-all/c"),
    ];
    let horizon = Duration::from_millis(300) + delay * 12 + Duration::from_millis(100);
    for i in 0..DROPS {
        let wait = match i % 3 {
            0 => Wait::Try,
            1 => Wait::For(Duration::from_millis(300)),
            _ => Wait::Forever,
        };
        let held = (i / 3) % 2 == 1;
        proxies.delay(Dir::Both, Duration::ZERO);
        let g = if held {
            Some(acquire_within(&holder, &names[1], SLACK).await)
        } else {
            None
        };
        proxies.delay(Dir::Both, delay);
        let at = rand::rng().random_range(Duration::ZERO..=horizon);
        let task = {
            let (l, names) = (l.clone(), names.clone());
            tokio::spawn(async move {
                l.acquire_all(&names, &opts(Duration::from_secs(30), wait, true))
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
    for name in &names {
        nothing_left(&ctx, name, SLACK * 2).await;
    }
}

/// A try of several free names takes them all, each with its own lease
/// and a token larger than the one before it on that name; a try over a
/// set with one name held takes none of them, and says so at once.
pub async fn lock_all_try_is_all_or_none(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let names = [
        ctx.name("try-all/a"),
        ctx.name("try-all/b"),
        ctx.name("try-all/c"),
    ];
    let before: Vec<Option<u64>> = {
        let mut v = Vec::new();
        for n in &names {
            let g = must_try(&b, n).await;
            v.push(g.fence());
            g.release().await.expect("release");
        }
        v
    };
    let m = a
        .try_lock_all(&names)
        .await
        .expect("try all")
        .expect("all free");
    for (n, old) in names.iter().zip(&before) {
        must_be_held(&b, n).await;
        if let (Some(old), Some(new)) = (old, m.fence(n)) {
            assert!(new > *old, "{n}: token {new} after {old}");
        }
    }
    // One lease each: releasing one guard frees that name only.
    let mut guards = m.into_guards();
    let first = guards.remove(0);
    first.release().await.expect("release");
    must_try(&b, &names[0])
        .await
        .release()
        .await
        .expect("release");
    for n in &names[1..] {
        must_be_held(&b, n).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
    let held = must_try(&b, &names[1]).await;
    let t = Instant::now();
    assert!(
        a.try_lock_all(&names).await.expect("try all").is_none(),
        "took a set with a held name"
    );
    assert!(t.elapsed() < TRY_BOUND, "a try waited {:?}", t.elapsed());
    for n in [&names[0], &names[2]] {
        must_try(&b, n).await.release().await.expect("release");
    }
    held.release().await.expect("release");
}
