//! The cases of the contract, one public async function each.
//!
//! Time bounds are for a loaded 2-core machine: they tell a wake-up from a
//! poll or a lost wake-up, not fast from slow (speed is for benchmarks).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::history::History;
use lockcore::{ErrorKind, Fencing, LeaseKind, LockOptions, Locker, Wait, MAX_NAME_BYTES};

use crate::Ctx;

/// A case's body.
pub type CaseFn = fn(Ctx) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// One case of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The trial name (after `<target>::`).
    pub name: &'static str,
    /// The body.
    pub run: CaseFn,
    /// `Some(reason)` when the case does not apply to this backend.
    pub skip_unless: fn(&Ctx) -> Option<&'static str>,
}

macro_rules! case {
    ($f:ident) => {
        case!($f, |_| None)
    };
    ($f:ident, $skip:expr) => {
        Case {
            name: stringify!($f),
            run: |ctx| Box::pin($f(ctx)),
            skip_unless: $skip,
        }
    };
}

/// Every case, in a stable order.
pub fn cases() -> Vec<Case> {
    vec![
        case!(basic_acquire_release),
        case!(try_on_held_name_is_not_acquired),
        case!(wait_with_timeout_ends_near_deadline),
        case!(release_wakes_waiter_quickly),
        case!(mutual_exclusion_exact_counter),
        case!(ttl_expiry_after_holder_dies),
        case!(owner_checked_release_after_expiry),
        case!(renewal_keeps_lease_past_ttl),
        case!(lost_fires_at_validity_deadline),
        case!(lost_fires_when_lease_is_revoked, |c| (!c
            .harness
            .can_revoke())
        .then_some("the harness cannot revoke a lease on the server")),
        case!(fencing_tokens_increase_across_holders, |c| (!c
            .caps
            .has_fencing())
        .then_some("the backend declares no fencing (Fencing::None)")),
        case!(cancel_safety_of_dropped_acquire),
        case!(reentrancy_through_one_owner),
        case!(fair_waiters_in_arrival_order, |c| (!(c.caps.fair
            && c.caps.inspect))
            .then_some(
                "the backend does not declare fair waiting with inspection"
            )),
        case!(odd_and_invalid_names),
        case!(many_names_held_at_once),
        case!(server_absent_gives_unavailable, |c| (!c.caps.cross_process)
            .then_some("an in-process backend has no server to be absent")),
        case!(history_of_a_contended_run_is_safe),
    ]
}

/// The shortest ttl the contract allows, for cases where time is the subject.
const SHORT_TTL: Duration = Duration::from_secs(1);
/// Slack for "soon" on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);

fn opts(ttl: Duration, wait: Wait, renew: bool) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(wait).renew(renew)
}

async fn must_try(l: &Locker, name: &str) -> lockcore::LockGuard {
    l.try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"))
        .unwrap_or_else(|| panic!("try_lock({name:?}) found the name held, expected it free"))
}

async fn must_be_held(l: &Locker, name: &str) {
    let got = l
        .try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"));
    assert!(
        got.is_none(),
        "{name:?} was acquired by a second owner while held"
    );
}

/// Tries until acquired or `within` passes (for cleanups that run in the
/// background: the bound is the point).
async fn acquire_within(l: &Locker, name: &str, within: Duration) -> lockcore::LockGuard {
    match l.lock_timeout(name, within).await {
        Ok(g) => g,
        Err(e) => panic!("{name:?} was not free within {within:?}: {e}"),
    }
}

/// Waits until the backend reports `n` waiters on `name`, where it can tell;
/// otherwise gives the waiters a moment to queue (nothing to await then).
async fn until_waiters(l: &Locker, name: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = l.inspect(name).await.expect("inspect");
        let Some(waiters) = info.and_then(|i| i.waiters) else {
            // The backend cannot count waiters: nothing to await.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return;
        };
        if waiters >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} waiters never showed up on {name:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Acquire a free name, see it held, release it, acquire it again.
pub async fn basic_acquire_release(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("basic");
    let g = must_try(&l, &name).await;
    assert!(g.is_held());
    assert_eq!(g.name(), name);
    assert_eq!(
        g.fence().is_some(),
        ctx.caps.has_fencing(),
        "fence presence must match the capability"
    );
    assert!(g.valid_until().is_some_and(|t| t > Instant::now()));
    g.release().await.expect("release");
    let g = must_try(&l, &name).await;
    g.release().await.expect("second release");
    let g = l.lock(&name).await.expect("lock a free name");
    g.release().await.expect("release");
}

/// A `try` on a held name is `Ok(None)` at once, from another client and from
/// another owner on the same client.
pub async fn try_on_held_name_is_not_acquired(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("try-held");
    let g = must_try(&a, &name).await;
    let t = Instant::now();
    must_be_held(&b, &name).await;
    must_be_held(&a.clone(), &name).await;
    assert!(
        t.elapsed() < SLACK * 2,
        "try on a held name took {:?}",
        t.elapsed()
    );
    g.release().await.expect("release");
    must_try(&b, &name).await.release().await.expect("release");
}

/// `wait(d)` on a held name fails with `Timeout` near its deadline.
pub async fn wait_with_timeout_ends_near_deadline(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("wait-timeout");
    let g = must_try(&a, &name).await;
    let wait = Duration::from_millis(700);
    let t = Instant::now();
    let err = b
        .lock_timeout(&name, wait)
        .await
        .expect_err("must time out while held");
    let took = t.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took >= wait - Duration::from_millis(20),
        "gave up early, after {took:?}"
    );
    assert!(took <= wait + SLACK, "gave up late, after {took:?}");
    assert!(g.is_held());
    g.release().await.expect("release");
}

/// A release wakes a waiter in a few round trips, not after a long poll.
pub async fn release_wakes_waiter_quickly(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("wake");
    let g = must_try(&a, &name).await;
    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (name, released) = (name.clone(), released.clone());
        tokio::spawn(async move {
            let g = b.lock(&name).await.expect("waiter acquires");
            assert!(
                released.load(Ordering::SeqCst),
                "the waiter acquired before the release"
            );
            let at = Instant::now();
            g.release().await.expect("release");
            at
        })
    };
    until_waiters(&a, &name, 1).await;
    released.store(true, Ordering::SeqCst);
    let t = Instant::now();
    g.release().await.expect("release");
    let got_at = waiter.await.expect("waiter task");
    let wake = got_at.saturating_duration_since(t);
    let bound = if ctx.caps.push_wakeup {
        Duration::from_secs(1)
    } else {
        SLACK
    };
    assert!(
        wake <= bound,
        "the waiter got the lock {wake:?} after the release (bound {bound:?})"
    );
}

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

/// A holder that dies stops renewing; the name is free again within its ttl
/// (session timeout, connection life), and not before, for ttl leases.
pub async fn ttl_expiry_after_holder_dies(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("holder-dies");
    let ttl = Duration::from_secs(2);
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
    let g2 = acquire_within(&b, &name, ttl + SLACK * 2).await;
    let after = acquired.elapsed();
    if ctx.caps.lease == LeaseKind::Ttl {
        assert!(
            after + Duration::from_millis(200) >= ttl,
            "the lease of a dead holder ended after {after:?}, before its ttl {ttl:?}"
        );
    }
    g2.release().await.expect("release");
}

/// A holder whose lease expired and was taken must not free the new holder's
/// lock; its release and renewal report `Lost`.
pub async fn owner_checked_release_after_expiry(ctx: Ctx) {
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let name = ctx.name("owner-checked");
    let old = a
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    tokio::time::timeout(SHORT_TTL + SLACK, old.lost())
        .await
        .expect("lost fires once the ttl ran out without renewal");
    let new = acquire_within(&b, &name, SHORT_TTL + SLACK * 2).await;
    let err = old
        .extend(SHORT_TTL)
        .await
        .expect_err("renewing an expired lease");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let err = old.release().await.expect_err("releasing an expired lease");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(new.is_held());
    must_be_held(&c, &name).await;
    new.release().await.expect("the new holder releases");
}

/// The watchdog keeps a lease alive well past its ttl.
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
    assert!(g.is_held(), "lost: {:?}", g.lost_reason());
    must_be_held(&b, &name).await;
    g.release().await.expect("release after renewals");
}

/// Without renewal, the lost signal fires at the validity deadline, not
/// before, and `is_held()` turns false.
pub async fn lost_fires_at_validity_deadline(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("lost-deadline");
    let t = Instant::now();
    let g = l
        .acquire(&name, &opts(SHORT_TTL, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    let valid_until = g.valid_until().expect("valid");
    assert!(
        valid_until <= t + SHORT_TTL + Duration::from_millis(1),
        "validity longer than the ttl"
    );
    tokio::time::timeout(SHORT_TTL + SLACK, g.lost())
        .await
        .expect("lost fires");
    assert!(
        Instant::now() >= valid_until,
        "lost fired before the validity deadline"
    );
    assert!(!g.is_held());
    assert!(g.lost_reason().is_some());
    let err = g.release().await.expect_err("release of a lost lease");
    assert_eq!(err.kind(), ErrorKind::Lost);
}

/// A lease taken away on the server: renewal is refused, lost fires, and
/// another client gets the name.
pub async fn lost_fires_when_lease_is_revoked(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
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
    assert!(
        g2.is_held(),
        "the old holder's release freed the new holder's lock"
    );
    g2.release().await.expect("release");
}

/// Successive holders, on several clients and after a holder died, get
/// strictly larger fencing tokens.
pub async fn fencing_tokens_increase_across_holders(ctx: Ctx) {
    let clients = [ctx.locker().await, ctx.locker().await, ctx.locker().await];
    let name = ctx.name("fencing");
    let mut last = 0u64;
    let ttl = Duration::from_secs(2);
    for round in 0..6 {
        let l = &clients[round % clients.len()];
        let g = l
            .acquire(&name, &opts(ttl, Wait::For(ttl + SLACK * 2), true))
            .await
            .expect("acquire")
            .expect("waits");
        let fence = g.fence().expect("fencing backend gives a token");
        assert!(fence > last, "token {fence} after {last} (round {round})");
        last = fence;
        if round == 2 {
            // This holder dies; the next one waits out its lease.
            g.abandon();
        } else {
            g.release().await.expect("release");
        }
    }
    if ctx.caps.fencing == Fencing::Strict {
        // A fresh client sees the same rule.
        let g = must_try(&ctx.locker().await, &name).await;
        assert!(g.fence().expect("token") > last);
        g.release().await.expect("release");
    }
}

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

/// One owner acquires a name again without waiting; it is released with the
/// last hold. Another owner (a clone) is not reentrant with it.
pub async fn reentrancy_through_one_owner(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("reentrant");
    let g1 = must_try(&a, &name).await;
    let t = Instant::now();
    let g2 = a.lock(&name).await.expect("reentrant lock");
    assert!(t.elapsed() < SLACK, "reentrant acquisition waited");
    assert_eq!(g1.hold_count(), 2);
    assert_eq!(g1.fence(), g2.fence());
    must_be_held(&a.clone(), &name).await;
    must_be_held(&b, &name).await;
    g2.release().await.expect("inner release");
    assert!(g1.is_held());
    must_be_held(&b, &name).await;
    g1.release().await.expect("outer release");
    must_try(&b, &name).await.release().await.expect("release");
}

/// Waiters are served in arrival order.
pub async fn fair_waiters_in_arrival_order(ctx: Ctx) {
    const WAITERS: usize = 5;
    let a = ctx.locker().await;
    let name = ctx.name("fair");
    let g = must_try(&a, &name).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let l = ctx.locker().await;
        let (n, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&n).await.expect("waiter");
            order.lock().expect("order").push(i);
            g.release().await.expect("release");
        }));
        until_waiters(&a, &name, i + 1).await;
    }
    g.release().await.expect("release");
    for t in tasks {
        t.await.expect("waiter task");
    }
    assert_eq!(
        *order.lock().expect("order"),
        (0..WAITERS).collect::<Vec<_>>()
    );
}

/// Odd names are ordinary and distinct; invalid names and options fail with
/// their kinds.
pub async fn odd_and_invalid_names(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let base = ctx.name("odd");
    let mut long = format!("{base}/");
    while long.len() < MAX_NAME_BYTES {
        long.push(if long.len() % 2 == 0 { 'x' } else { '/' });
    }
    let odd: Vec<String> = [
        "a/b",
        "../x",
        "..",
        ".",
        "%",
        "%2F",
        "with space",
        "trailing ",
        "🦀✓ü",
        "'; DROP TABLE locks; --",
        "{tag}",
        "A",
        "a",
        "*",
        "\\",
    ]
    .iter()
    .map(|s| format!("{base}/{s}"))
    .chain([long])
    .collect();
    let mut guards = Vec::new();
    for n in &odd {
        guards.push(must_try(&a, n).await);
    }
    for n in &odd {
        must_be_held(&b, n).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
    for n in &odd {
        must_try(&b, n).await.release().await.expect("release");
    }
    let too_long = "x".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", "a\0b", "line\nbreak", "\u{7f}", too_long.as_str()] {
        let err = a.try_lock(bad).await.expect_err("invalid name accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{bad:?}: {err}");
    }
    let err = a
        .acquire(&base, &LockOptions::new().ttl(Duration::ZERO))
        .await
        .expect_err("zero ttl accepted");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

/// One client holds many names at once, each excluding others.
pub async fn many_names_held_at_once(ctx: Ctx) {
    const NAMES: usize = 100;
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let names: Vec<String> = (0..NAMES).map(|i| ctx.name(&format!("many/{i}"))).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(must_try(&a, n).await);
    }
    for n in names.iter().step_by(7) {
        must_be_held(&b, n).await;
    }
    assert!(guards.iter().all(|g| g.is_held()));
    assert!(
        guards
            .iter()
            .all(|g| g.fence().is_some() == ctx.caps.has_fencing()),
        "fence presence must match the capability"
    );
    for g in guards {
        g.release().await.expect("release");
    }
    for n in names.iter().step_by(7) {
        must_try(&b, n).await.release().await.expect("release");
    }
}

/// A server that does not answer gives `Unavailable` within the configured
/// timeouts, never a hang.
pub async fn server_absent_gives_unavailable(ctx: Ctx) {
    let t = Instant::now();
    let bound = Duration::from_secs(15);
    let connected = ctx
        .harness
        .connect_unreachable()
        .await
        .expect("a backend with a server must give the suite an unreachable client");
    let err = match connected {
        Err(e) => e,
        Ok(l) => {
            let r = tokio::time::timeout(bound, l.try_lock(&ctx.name("absent"))).await;
            match r {
                Err(_) => panic!("try_lock against an absent server hung for {bound:?}"),
                Ok(Ok(_)) => panic!("acquired a lock on an absent server"),
                Ok(Err(e)) => e,
            }
        }
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(t.elapsed() < bound, "took {:?}", t.elapsed());
}

/// A contended run over several names and clients, recorded: no two valid
/// leases on a name overlapped and tokens rose in acquisition order.
pub async fn history_of_a_contended_run_is_safe(ctx: Ctx) {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 12;
    let names: Vec<String> = (0..3).map(|i| ctx.name(&format!("history/{i}"))).collect();
    let history = History::new();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let l = ctx.locker().await;
        let (names, history) = (names.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            for r in 0..ROUNDS {
                let name = &names[(c + r) % names.len()];
                let g = l.lock(name).await.expect("lock");
                let id = history.acquired(&g);
                tokio::task::yield_now().await;
                history.ended(id, &g);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let summary = history.check().expect("the history is safe");
    assert_eq!(summary.leases, CLIENTS * ROUNDS);
    assert_eq!(summary.names, names.len());
}
