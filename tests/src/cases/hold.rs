//! Hold: mutual exclusion, expiry of a dead holder, renewal and the
//! server's ttl, validity bounds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::testing::history::History;
use lockcore::{ErrorKind, LeaseKind, Wait};

use super::{acquire_within, must_be_held, must_try, opts, SHORT_TTL, SLACK};
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
