//! Hold: mutual exclusion, expiry of a dead holder, renewal, the lost
//! signal, validity bounds, a guard on its own, owners and explicit
//! reentrancy.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::testing::history::History;
use lockcore::{ErrorKind, LeaseKind, Wait};

use super::{acquire_within, must_be_held, must_try, opts, SHORT_TTL, SLACK, TRY_BOUND};
use crate::{Ctx, Dir, Proxies};

/// Many clients increment a shared counter by read-modify-write under the
/// lock: the count is exact and nobody was ever inside together.
pub async fn mutual_exclusion_exact_counter(ctx: Ctx) {
    const CLIENTS: u64 = 6;
    const ROUNDS: u64 = 20;
    let name = ctx.name("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let history = History::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let l = ctx.locker().await;
        let (name, counter, inside, history) = (
            name.clone(),
            counter.clone(),
            inside.clone(),
            history.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = l.lock(&name).await.expect("lock");
                let id = history.acquired(&g);
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two holders inside at once"
                );
                let v = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                history.ended(id, &g);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    assert_eq!(counter.load(Ordering::SeqCst), CLIENTS * ROUNDS);
    history.check().expect("history");
}

/// A holder that dies stops renewing; the name is free again within its
/// ttl, and not before, for ttl leases; within the session timeout for
/// session leases; and at once, well before the ttl, for connection leases
/// (the dead process's connection closes).
pub async fn ttl_expiry_after_holder_dies(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("holder-dies");
    let ttl = match ctx.caps.lease {
        LeaseKind::Connection => Duration::from_secs(20),
        _ => Duration::from_secs(2),
    };
    let g = a
        .acquire(&name, &opts(ttl, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    let acquired = Instant::now();
    let lost = g.lost();
    g.abandon();
    tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("an abandoned guard reports lost");
    let within = match ctx.caps.lease {
        LeaseKind::Connection => SLACK,
        _ => ttl + SLACK * 2,
    };
    let g2 = acquire_within(&b, &name, within).await;
    let after = acquired.elapsed();
    if ctx.caps.lease == LeaseKind::Ttl {
        assert!(
            after + Duration::from_millis(200) >= ttl,
            "the lease of a dead holder ended after {after:?}, before its ttl {ttl:?}"
        );
    }
    g2.release().await.expect("release");
}

/// The watchdog keeps a lease alive well past its ttl: the server still
/// refuses the name to others after three ttls.
pub async fn renewal_keeps_lease_past_ttl(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("renewal");
    let g = a
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    // Time is the subject: hold for three ttls.
    tokio::time::sleep(SHORT_TTL * 3).await;
    must_be_held(&b, &name).await;
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    g.release().await.expect("release after renewals");
    must_try(&b, &name).await.release().await.expect("release");
}

/// Without renewal, the lost signal fires at the validity deadline, not
/// before, and `is_held()` turns false.
pub async fn lost_fires_at_validity_deadline(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("lost-deadline");
    let g = l
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    let returned = Instant::now();
    let valid_until = g.valid_until().expect("valid");
    assert!(
        valid_until <= returned + SHORT_TTL,
        "validity longer than the ttl"
    );
    tokio::time::timeout(SHORT_TTL + SLACK, g.lost())
        .await
        .expect("lost fires");
    let fired = Instant::now();
    assert!(
        fired >= valid_until,
        "lost fired before the validity deadline"
    );
    assert!(
        fired <= valid_until + LOST_LATENESS,
        "lost fired {:?} after the validity deadline",
        fired - valid_until
    );
    assert!(!g.is_held());
    assert!(g.lost_reason().is_some());
    let err = g.release().await.expect_err("release of a lost lease");
    assert_eq!(err.kind(), ErrorKind::Lost);
}

/// How late the lost signal may fire after the validity deadline on a
/// loaded 2-core machine: far less than the shortest ttl, so a signal a
/// whole ttl late is caught.
const LOST_LATENESS: Duration = Duration::from_millis(300);

/// With renewal on and every renewal failing (the server stops answering,
/// through a proxy), the lost signal fires by the last validity deadline
/// the client knew, at most 300 ms after it: never a ttl late.
pub async fn lost_fires_on_time_when_renewal_fails(ctx: Ctx) {
    let proxies = Proxies::new();
    let l = ctx.locker_via(&proxies).await.expect("the harness proxies");
    let name = ctx.name("lost-renewal-fails");
    let ttl = Duration::from_secs(2);
    let g = l
        .acquire(&name, &opts(ttl, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    // Nothing is renewed from here on: the first renewal is due at ttl/3.
    proxies.blackhole(Dir::Both);
    let valid_until = g.valid_until().expect("held");
    tokio::time::timeout(ttl + SLACK, g.lost())
        .await
        .expect("lost fires");
    let fired = Instant::now();
    assert!(
        fired <= valid_until + LOST_LATENESS,
        "lost fired {:?} after the validity deadline while renewals failed",
        fired - valid_until
    );
    assert!(!g.is_held());
    proxies.heal();
    drop(g);
}

/// The server's side of `extend` and of renewals: after a longer `extend`
/// another client finds the name held until the new deadline, after a
/// shorter one free soon after a holder dies, and the watchdog renews with
/// the extended ttl. Holders die by `abandon` (no release): a ttl lease then
/// ends on the server by the ttl the server last set, a session or
/// connection lease with its session or connection. A backend may refuse a
/// ttl it cannot set on a held lease (`InvalidConfig`: an etcd lease keeps
/// its granted ttl, a ZooKeeper session its timeout); that part is then
/// skipped, and the lease must be as it was.
pub async fn server_ttl_follows_extend_and_renewals(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let ttl_kept = ctx.caps.lease == LeaseKind::Ttl;
    let gone_within = |ttl: Duration| match ctx.caps.lease {
        LeaseKind::Ttl => ttl + SLACK,
        // The dead holder's connection closes at once.
        LeaseKind::Connection => SLACK,
        // The session's timeout, which the ttl does not set exactly.
        _ => SLACK * 4,
    };
    // Longer: acquired for 1 s, extended to 6 s, renewal off. At 2.5 s the
    // server must still hold it (an unextended ttl ended at 1 s).
    let name = ctx.name("extend-longer");
    let g = a
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    let extended_at = Instant::now();
    if extended(&g, Duration::from_secs(6)).await {
        tokio::time::sleep_until((extended_at + Duration::from_millis(2500)).into()).await;
        must_be_held(&b, &name).await;
        assert!(g.is_held(), "lost: {:?}", g.lost_reason());
        g.release().await.expect("release");
    } else {
        assert!(g.is_held(), "a refused extend lost the lease");
        g.release().await.expect("release after a refused extend");
    }
    must_try(&b, &name).await.release().await.expect("release");
    // A refused extend leaves the lease as it was: a 5 s lease refused a
    // 1 s ttl is still held, on the client and the server, after 2 s.
    let name = ctx.name("extend-refused");
    let g = a
        .acquire(&name, &opts(Duration::from_secs(5), Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    if !extended(&g, SHORT_TTL).await {
        tokio::time::sleep(SHORT_TTL * 2).await;
        assert!(
            g.is_held(),
            "a refused extend shortened the lease: {:?}",
            g.lost_reason()
        );
        must_be_held(&b, &name).await;
    }
    g.release().await.expect("release");

    // Shorter: acquired for 10 s, extended to 1 s, then the holder dies: the
    // name is free within the new ttl and slack, well before 10 s.
    let name = ctx.name("extend-shorter");
    let g = a
        .acquire(&name, &opts(Duration::from_secs(10), Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    if extended(&g, SHORT_TTL).await {
        let died = Instant::now();
        g.abandon();
        let g2 = acquire_within(&b, &name, gone_within(SHORT_TTL)).await;
        if ttl_kept {
            assert!(
                died.elapsed() < Duration::from_secs(6),
                "a lease extended to 1 s ended {:?} after its holder died",
                died.elapsed()
            );
        }
        g2.release().await.expect("release");
    } else {
        g.release().await.expect("release after a refused extend");
    }

    // Renewals use the extended ttl: acquired for 1 s with renewal on,
    // extended to 5 s, renewed for a while, then the holder dies. The last
    // renewal was at most 5/3 s before, so the server holds the name at
    // least 3.3 s longer; 1.5 s after the death it must still be held.
    let name = ctx.name("renewed-extended");
    let g = a
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    if !extended(&g, Duration::from_secs(5)).await {
        g.release().await.expect("release after a refused extend");
        return;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    let died = Instant::now();
    g.abandon();
    if ttl_kept {
        tokio::time::sleep_until((died + Duration::from_millis(1500)).into()).await;
        must_be_held(&b, &name).await;
    }
    acquire_within(&b, &name, gone_within(Duration::from_secs(5)))
        .await
        .release()
        .await
        .expect("release");
}

/// Extends `g` to `ttl`: true when extended, false when the backend
/// refused a ttl it cannot set on a held lease (`InvalidConfig`).
async fn extended(g: &lockcore::LockGuard, ttl: Duration) -> bool {
    match g.extend(ttl).await {
        Ok(()) => true,
        Err(e) if e.kind() == ErrorKind::InvalidConfig => false,
        Err(e) => panic!("extend to {ttl:?}: {e}"),
    }
}

/// A lease taken away on the server without telling its client: renewal is
/// refused, lost fires, and another client gets the name.
pub async fn lost_fires_when_lease_is_revoked(ctx: Ctx) {
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let name = ctx.name("revoked");
    let ttl = Duration::from_secs(3);
    let g = a
        .acquire(&name, &opts(ttl, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        ctx.harness.revoke(&name).await.expect("revoke"),
        "revoke found nothing held"
    );
    tokio::time::timeout(ttl + SLACK, g.lost())
        .await
        .expect("lost fires once the lease is gone on the server");
    assert!(!g.is_held());
    let g2 = acquire_within(&b, &name, SLACK * 2).await;
    let err = g.release().await.expect_err("release of a revoked lease");
    assert_eq!(err.kind(), ErrorKind::Lost);
    must_be_held(&c, &name).await;
    g2.release().await.expect("release");
}

/// A lease's validity is counted from when the request that proved it was
/// sent, never from its reply, less the drift allowance of the contract
/// (ttl/100 + 2 ms) for a server in another process. Through a proxy (where
/// the harness can), which sees when the client's last request went out and
/// holds every reply back 100 ms, the deadline must stay within that send
/// time + ttl − the allowance, for the grant and for a renewal.
pub async fn validity_is_counted_from_before_the_request(ctx: Ctx) {
    let proxies = Proxies::new();
    let proxied = ctx.locker_via(&proxies).await;
    let l = match &proxied {
        Some(l) => l.clone(),
        None => ctx.locker().await,
    };
    let name = ctx.name("validity");
    // Long enough that the allowance (102 ms) is far above the client's
    // own time between sending and the proxy reading the request.
    let ttl = Duration::from_secs(10);
    let allowance = ttl / 100 + Duration::from_millis(2);
    // Once round without delay first (a server may learn a script, a
    // connection may settle), so that the measured call is one request.
    l.acquire(&name, &opts(ttl, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free")
        .release()
        .await
        .expect("release");
    proxies.delay(Dir::Down, Duration::from_millis(100));
    let bound = |returned: Instant| match proxies.last_sent() {
        Some(sent) if ctx.caps.cross_process => sent + ttl - allowance,
        // No proxy: only the call's end bounds the send time. An in-process
        // server shares the client's clock and needs no allowance.
        _ => returned + ttl,
    };
    let g = l
        .acquire(&name, &opts(ttl, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    let b = bound(Instant::now());
    let until = g.valid_until().expect("held");
    assert!(
        until <= b,
        "the grant is valid {:?} past a deadline counted from when its request was sent",
        until - b
    );
    g.extend(ttl).await.expect("extend");
    let b = bound(Instant::now());
    let until = g.valid_until().expect("held");
    assert!(
        until <= b,
        "the renewal is valid {:?} past a deadline counted from when its request was sent",
        until - b
    );
    proxies.delay(Dir::Both, Duration::ZERO);
    g.release().await.expect("release");
}

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
