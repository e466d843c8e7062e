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
    let lost = g.lost();
    g.abandon();
    tokio::time::timeout(ttl + SLACK, lost)
        .await
        .expect("the holder's lost fires at its ttl");
    let lost_at = Instant::now();
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
        granted.duration_since(lost_at) + Duration::from_millis(200) >= delay,
        "the cut-off holder had {:?} between its lost signal and the next grant, not the delay {delay:?}",
        granted.duration_since(lost_at)
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
    // Past two renewals: held, on the server.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    must_be_held(&b, &name).await;
    g.release().await.expect("release");
    let t = Instant::now();
    let next = b.try_lock(&name).await.expect("try").expect("free at once");
    assert!(t.elapsed() < SLACK);
    next.release().await.expect("release");
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
/// times: neither deadlocks (each finishes within the bound), and no name
/// is ever held by both (each checks on the server that the names it holds
/// are held against a third client).
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
