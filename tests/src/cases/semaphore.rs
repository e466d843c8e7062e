//! Semaphores ([`lockcore::Semaphore`]): never more than N permits held,
//! full as the server sees it, a release wakes a waiter, and dropped waits
//! leave nothing behind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Semaphore, Wait};

use super::{must_be_held, until_waiters, SLACK};
use crate::Ctx;

fn sem(l: &lockcore::Locker, name: &str, n: u32) -> Semaphore {
    Semaphore::new(l, name, n).expect("semaphore")
}

/// Clients on their own connections take permits of a 3-permit semaphore in
/// a loop: never more than 3 inside at once, and every round completes.
pub async fn semaphore_never_more_than_n(ctx: Ctx) {
    const N: u32 = 3;
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 6;
    let name = ctx.name("sem-bound");
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let s = sem(&ctx.locker().await, &name, N);
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let p = s
                    .acquire_timeout(Duration::from_secs(60))
                    .await
                    .expect("a permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= N, "{now} permits of {N} held at once");
                // Long enough beside a server's admission round trips for
                // holds to overlap on a loaded machine.
                tokio::time::sleep(Duration::from_millis(25)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                p.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    assert!(most.load(Ordering::SeqCst) >= 2, "the permits were shared");
}

/// With every permit held, the server refuses another client at once (a
/// `try` on the semaphore and on each slot's lock); a release makes exactly
/// one permit free.
pub async fn semaphore_full_on_the_server(ctx: Ctx) {
    let name = ctx.name("sem-full");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (sa, sb) = (sem(&a, &name, 2), sem(&b, &name, 2));
    let p1 = sa.try_acquire().await.unwrap().expect("first permit");
    let p2 = sa.try_acquire().await.unwrap().expect("second permit");
    assert!(sb.try_acquire().await.unwrap().is_none(), "a third permit");
    let built = ctx.caps.semaphore_layout == lockcore::Layout::Built;
    if built {
        assert_ne!(p1.slot(), p2.slot(), "two permits on one slot");
        for i in 0..2 {
            must_be_held(&b, &sb.slot_name(i)).await;
        }
    }
    let freed = p1.slot();
    p1.release().await.unwrap();
    let p3 = sb.try_acquire().await.unwrap().expect("the freed permit");
    assert_eq!(p3.slot(), freed);
    assert!(sb.try_acquire().await.unwrap().is_none(), "full again");
    p2.release().await.unwrap();
    p3.release().await.unwrap();
}

/// A waiter for a full semaphore gets the permit a release frees, soon.
pub async fn semaphore_release_wakes_a_waiter(ctx: Ctx) {
    let name = ctx.name("sem-wake");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let sa = sem(&a, &name, 1);
    let held = sa.try_acquire().await.unwrap().expect("permit");
    let sb = sem(&b, &name, 1);
    let waiter = tokio::spawn(async move {
        let p = sb.acquire_timeout(SLACK * 10).await.expect("woken");
        (Instant::now(), p)
    });
    if ctx.caps.semaphore_layout == lockcore::Layout::Built {
        until_waiters(&a, &sa.slot_name(0), 1).await;
    }
    // A native layout's queue is not a lock that `inspect` shows: there the
    // release may come before the waiter queued, which the bound covers.
    let released = Instant::now();
    held.release().await.unwrap();
    let (got, p) = waiter.await.expect("waiter");
    assert!(
        got.duration_since(released) < SLACK,
        "woken {:?} after the release",
        got.duration_since(released)
    );
    p.release().await.unwrap();
}

/// Waits on a full semaphore that time out or are dropped leave no permit
/// held or queued: afterwards another client takes every permit at once.
pub async fn semaphore_dropped_waits_leave_nothing(ctx: Ctx) {
    let name = ctx.name("sem-drop");
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let sa = sem(&a, &name, 2);
    let held = [
        sa.try_acquire().await.unwrap().expect("permit"),
        sa.try_acquire().await.unwrap().expect("permit"),
    ];
    let sb = sem(&b, &name, 2);
    // One wait that times out, and three dropped at different points.
    let e = sb
        .acquire_timeout(Duration::from_secs(1))
        .await
        .expect_err("no permit came free");
    assert_eq!(e.kind(), ErrorKind::Timeout);
    for ms in [0, 50, 400] {
        let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(30)));
        let _ = tokio::time::timeout(Duration::from_millis(ms), sb.acquire(&opts)).await;
    }
    for p in held {
        p.release().await.unwrap();
    }
    let sc = sem(&c, &name, 2);
    let t = Instant::now();
    let mut got = Vec::new();
    while got.len() < 2 {
        match sc.try_acquire().await.unwrap() {
            Some(p) => got.push(p),
            // A dropped wait's cleanup is one round trip away.
            None if t.elapsed() < SLACK => tokio::time::sleep(Duration::from_millis(20)).await,
            None => panic!("a dropped wait still holds or queues on a permit"),
        }
    }
    for p in got {
        p.release().await.unwrap();
    }
}

/// In a native layout, each permit's token is above every earlier one's,
/// whichever permits are held beside it.
pub async fn semaphore_tokens_rise_across_permits(ctx: Ctx) {
    let name = ctx.name("sem-fence");
    let s = sem(&ctx.locker().await, &name, 2);
    let mut last = 0;
    let mut kept = s.try_acquire().await.unwrap().expect("permit");
    for _ in 0..4 {
        let p = s.try_acquire().await.unwrap().expect("the other permit");
        let f = p.fence().expect("a token");
        assert!(
            f > last && f > kept.fence().unwrap_or(0),
            "token {f} after {last}"
        );
        last = f;
        kept.release().await.unwrap();
        kept = p;
    }
    kept.release().await.unwrap();
}

/// Where the two backends of a migration lay a semaphore out differently,
/// there is none: a clear error, before any server is asked.
pub async fn semaphore_refused_where_layouts_differ(ctx: Ctx) {
    let l = ctx.locker().await;
    let e = Semaphore::new(&l, &ctx.name("sem-refused"), 2).expect_err("a semaphore");
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("semaphore"), "{e}");
}

/// In a native layout, clients that try at the same moment on a semaphore
/// with a permit for each all get one: a try is refused only when the
/// permits are held, not because another client is acquiring.
pub async fn semaphore_concurrent_tries_share(ctx: Ctx) {
    const CLIENTS: usize = 4;
    let name = ctx.name("sem-tries");
    let mut sems = Vec::new();
    for _ in 0..CLIENTS {
        sems.push(sem(&ctx.locker().await, &name, CLIENTS as u32));
    }
    for round in 0..3 {
        let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
        let tries: Vec<_> = sems
            .iter()
            .map(|s| {
                let (s, start) = (s.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    s.try_acquire().await.expect("try")
                })
            })
            .collect();
        let mut held = Vec::new();
        for t in tries {
            held.push(t.await.expect("task").unwrap_or_else(|| {
                panic!("round {round}: a try was refused with a permit free for it")
            }));
        }
        for p in held {
            p.release().await.unwrap();
        }
    }
}

/// A client that finds the semaphore full by its own count, held by
/// clients that count more, is told so: an error, not a refusal or a
/// wait.
pub async fn semaphore_mismatched_counts_are_an_error(ctx: Ctx) {
    let name = ctx.name("sem-mismatch");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let two = sem(&a, &name, 2);
    let held = [
        two.try_acquire().await.unwrap().expect("permit"),
        two.try_acquire().await.unwrap().expect("permit"),
    ];
    let one = sem(&b, &name, 1);
    let e = one.try_acquire().await.expect_err("a mismatched count");
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("count"), "{e}");
    let e = one
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect_err("a mismatched count");
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    for p in held {
        p.release().await.unwrap();
    }
    // Nothing of the refused client stays: the count of 2 is whole.
    let again = [
        two.try_acquire().await.unwrap().expect("permit"),
        two.try_acquire().await.unwrap().expect("permit"),
    ];
    for p in again {
        p.release().await.unwrap();
    }
}
