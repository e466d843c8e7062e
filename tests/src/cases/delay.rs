//! Lock-delay and multi-name locks: the safety and the shape users of
//! Chubby, Consul and Redisson rely on.

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Wait};

use super::{must_be_held, SLACK};
use crate::Ctx;

/// A holder that disappears without releasing (abandoned: no renewal, no
/// release, as a dead process) keeps the name taken for its ttl plus the
/// lock-delay, counted on the server: its own lost signal fires at the ttl,
/// another client is granted no earlier than ttl + delay after the grant
/// was sent, and its token is larger.
pub async fn lock_delay_after_an_unclean_end(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("delay/unclean");
    let (ttl, delay) = (Duration::from_secs(2), Duration::from_secs(3));
    let opts = LockOptions::new()
        .ttl(ttl)
        .lock_delay(delay)
        .wait(Wait::Try)
        .renew(false);
    let sent = Instant::now();
    let g = a
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    let fence = g.fence();
    let valid_until = g.valid_until().expect("held");
    assert!(
        valid_until <= Instant::now() + ttl,
        "the holder counts more than its ttl: {:?}",
        valid_until - Instant::now()
    );
    let lost = g.lost();
    g.abandon();
    // The holder learns of the loss at its validity deadline, well before
    // the name is free again.
    tokio::time::timeout_at((valid_until + delay / 2).into(), lost)
        .await
        .expect("the holder's lost fires at its ttl, not at ttl + delay");
    must_be_held(&b, &name).await;
    let next = b
        .acquire(
            &name,
            &LockOptions::new().wait(Wait::For(ttl + delay + SLACK * 2)),
        )
        .await
        .expect("granted after the delay")
        .expect("granted");
    let granted = Instant::now();
    assert!(
        granted >= sent + ttl + delay,
        "granted {:?} after the first grant was sent: before ttl + delay ({:?})",
        granted - sent,
        ttl + delay
    );
    assert!(
        granted >= valid_until + delay,
        "granted {:?} after the holder's validity ended: before the delay {delay:?}",
        granted.saturating_duration_since(valid_until)
    );
    if let (Some(old), Some(new)) = (fence, next.fence()) {
        assert!(new > old, "tokens did not rise: {old} then {new}");
    }
    next.release().await.expect("release");
}

/// A clean release frees the name at once, whatever the lock-delay; and
/// renewals keep the lease as without one.
pub async fn lock_delay_clean_release_frees_at_once(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("delay/clean");
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .lock_delay(Duration::from_secs(30))
        .wait(Wait::Try);
    let g = a
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    // Past two renewals: held, on the server, and the holder counts its
    // ttl from each renewal, nothing of the delay.
    let first = g.valid_until().expect("held");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    let renewed = g.valid_until().expect("held");
    assert!(renewed > first, "not renewed");
    assert!(
        renewed <= Instant::now() + Duration::from_secs(1),
        "a renewal counted more than the ttl: {:?}",
        renewed - Instant::now()
    );
    must_be_held(&b, &name).await;
    g.release().await.expect("release");
    let t = Instant::now();
    let next = b.try_lock(&name).await.expect("try").expect("free at once");
    assert!(t.elapsed() < SLACK);
    next.release().await.expect("release");
}

/// A waiter with a lock-delay longer than its ttl is granted with a full
/// ttl of validity (its grant renewed before it is handed out when the
/// backend kept the waiting lease at the server's pace), and keeps it.
pub async fn lock_delay_waited_grant_has_a_full_ttl(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("delay/waited");
    let ttl = Duration::from_secs(2);
    let held = b.try_lock(&name).await.expect("try").expect("free");
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            a.acquire(
                &name,
                &LockOptions::new()
                    .ttl(ttl)
                    .lock_delay(Duration::from_secs(6))
                    .wait(Wait::For(Duration::from_secs(30))),
            )
            .await
        }
    });
    // Long enough for a waiting lease to be kept alive a few times.
    tokio::time::sleep(Duration::from_secs(4)).await;
    held.release().await.expect("release");
    let g = waiter
        .await
        .expect("task")
        .expect("granted")
        .expect("granted");
    let left = g
        .valid_until()
        .expect("held when handed out")
        .saturating_duration_since(Instant::now());
    assert!(
        left > ttl / 2 && left <= ttl,
        "granted with {left:?} of a {ttl:?} ttl"
    );
    tokio::time::sleep(ttl + ttl / 2).await;
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    g.release().await.expect("release");
}

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

/// A backend that cannot enforce a lock-delay refuses it before asking the
/// server, and takes nothing.
pub async fn lock_delay_refused_where_not_enforced(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("delay/refused");
    let err = a
        .acquire(
            &name,
            &LockOptions::new().lock_delay(Duration::from_secs(5)),
        )
        .await
        .expect_err("no lock-delay here");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("lock-delay"), "{err}");
    b.try_lock(&name)
        .await
        .expect("try")
        .expect("nothing was taken")
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
