//! Owners: a guard on its own, tasks sharing one `Locker`, and explicit
//! reentrancy through the guard.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::testing::history::History;
use lockcore::{ErrorKind, LeaseKind, Wait};

use super::{acquire_within, must_be_held, must_try, opts, SHORT_TTL, SLACK, TRY_BOUND};
use crate::Ctx;

/// The `Locker` a guard came from may go: the guard alone keeps its lease
/// renewed (the server refuses the name to others after three ttls) and
/// releases it.
pub async fn guard_outlives_its_locker(ctx: Ctx) {
    let other = ctx.locker().await;
    let name = ctx.name("outlives");
    let g = ctx
        .locker()
        .await
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    // The Locker was a temporary and is gone. Time is the subject.
    tokio::time::sleep(SHORT_TTL * 3).await;
    must_be_held(&other, &name).await;
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    g.release().await.expect("release");
    must_try(&other, &name)
        .await
        .release()
        .await
        .expect("release");
}

/// Every acquisition is its own owner, whatever handle it went through:
/// tasks that share one `Locker` (an `Arc`, a `&` into `join!`, a `static`)
/// exclude each other as separate processes do. Four tasks, five critical
/// sections each, through one `Arc<Locker>`: never two inside at once, each
/// section its own lease (a history of them has no overlap, and tokens rise
/// where the backend fences), and while one is inside, another client is
/// refused the name by the server.
pub async fn tasks_sharing_one_locker_exclude(ctx: Ctx) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    let shared = Arc::new(ctx.locker().await);
    let other = Arc::new(ctx.locker().await);
    let name = ctx.name("shared-locker");
    let inside = Arc::new(AtomicBool::new(false));
    let history = History::new();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (l, other, name, inside, history) = (
            shared.clone(),
            other.clone(),
            name.clone(),
            inside.clone(),
            history.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = l.lock(&name).await.expect("lock");
                let id = history.acquired(&g);
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two tasks sharing one Locker were inside at once"
                );
                must_be_held(&other, &name).await;
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                history.ended(id, &g);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    history.check().expect("history");

    // One task, two calls through one `&Locker`: a `try` while the first
    // is held is refused, and a waiting call is served only after the
    // first is released, with a lease of its own.
    let l = &*shared;
    let g = must_try(l, &name).await;
    let t = Instant::now();
    let again = l.try_lock(&name).await.expect("try");
    assert!(
        again.is_none(),
        "a second try through the holder's Locker was granted (hold count {})",
        g.hold_count()
    );
    assert!(t.elapsed() < TRY_BOUND, "the try waited {:?}", t.elapsed());
    let first_fence = g.fence();
    let (second, ()) = tokio::join!(l.lock_timeout(&name, SLACK * 2), async {
        // The second call must still be waiting: the name is held.
        must_be_held(&other, &name).await;
        g.release().await.expect("release");
    });
    let second = second.expect("the waiting call got the released name");
    assert_eq!(second.hold_count(), 1);
    if ctx.caps.has_fencing() {
        assert!(
            second.fence() > first_fence,
            "the second call's lease did not get a larger token: {:?} after {:?}",
            second.fence(),
            first_fence
        );
    }
    second.release().await.expect("release");
    must_try(&other, &name)
        .await
        .release()
        .await
        .expect("release");
}

/// Reentrancy is explicit: a holder proves it holds by its guard, and
/// `reenter` takes another hold on the same lease (same token) at once;
/// the lease is released on the server when the last hold goes, in either
/// order. A lost lease cannot be re-entered.
pub async fn explicit_reentrancy_through_the_guard(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("reentrant");
    let g1 = must_try(&a, &name).await;
    let g2 = g1.reenter().expect("reenter a held lease");
    assert_eq!(g1.hold_count(), 2);
    assert_eq!(g2.hold_count(), 2);
    assert_eq!(g1.fence(), g2.fence());
    must_be_held(&a, &name).await;
    must_be_held(&b, &name).await;
    // The outer hold goes first: the inner one still holds the lease.
    g1.release().await.expect("outer release");
    must_be_held(&b, &name).await;
    assert!(g2.is_held());
    g2.release().await.expect("inner release");
    must_try(&b, &name).await.release().await.expect("release");

    // A dropped hold goes too; the lease goes with the last one.
    let g1 = must_try(&a, &name).await;
    let g2 = g1.reenter().expect("reenter");
    drop(g2);
    assert_eq!(g1.hold_count(), 1);
    must_be_held(&b, &name).await;
    g1.release().await.expect("release");
    must_try(&b, &name).await.release().await.expect("release");

    // An abandoned lease stays on the server for another hold's drop: it
    // ends by its ttl, session or connection, as if the holder had died,
    // never by a release (a ttl lease is still held there at once).
    let g1 = a
        .acquire(&name, &opts(Duration::from_secs(10), Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    let g2 = g1.reenter().expect("reenter");
    g1.abandon();
    assert!(!g2.is_held(), "a hold of an abandoned lease is held");
    drop(g2);
    if ctx.caps.lease == LeaseKind::Ttl {
        // The background release of a dropped hold would run now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        must_be_held(&b, &name).await;
    }
    acquire_within(&b, &name, Duration::from_secs(10) + SLACK * 2)
        .await
        .release()
        .await
        .expect("release");

    // A lost lease is not re-entered.
    let g = a
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    tokio::time::timeout(SHORT_TTL + SLACK, g.lost())
        .await
        .expect("lost fires");
    let err = g.reenter().expect_err("reentered a lost lease");
    assert_eq!(err.kind(), ErrorKind::Lost);
    let _ = g.release().await;
}
