//! Acquire: try, wait with a deadline, wake-ups, fairness, and waiters that
//! leave the rest of the client alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{Attempt, ErrorKind, Wait, DEFAULT_TTL};

use super::{must_be_held, must_try, opts, until_waiters, SLACK, TRY_BOUND};
use crate::{Ctx, Dir, Proxies};

/// Acquire a free name, see it held on the server (and in `inspect`, where
/// the backend can), release it, acquire it again.
pub async fn basic_acquire_release(ctx: Ctx) {
    let (l, other) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("basic");
    let g = must_try(&l, &name).await;
    assert_eq!(g.name(), name);
    assert_eq!(
        g.fence().is_some(),
        ctx.caps.has_fencing(),
        "fence presence must match the capability"
    );
    assert!(g.valid_until().is_some_and(|t| t > Instant::now()));
    must_be_held(&other, &name).await;
    if ctx.caps.inspect {
        let info = other
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("the backend declares inspection");
        let holder = info
            .holder
            .expect("inspect shows the holder of a held name");
        if ctx.caps.has_fencing() {
            assert_eq!(holder.fence, g.fence(), "inspect shows the holder's token");
        }
        if let Some(left) = holder.ttl_remaining {
            assert!(left <= DEFAULT_TTL, "remaining ttl {left:?} above the ttl");
        }
    }
    g.release().await.expect("release");
    if ctx.caps.inspect {
        let info = other.inspect(&name).await.expect("inspect").expect("info");
        assert!(
            info.holder.is_none(),
            "a released name shows a holder: {info:?}"
        );
    }
    let g = must_try(&other, &name).await;
    g.release().await.expect("second release");
    let g = l.lock(&name).await.expect("lock a free name");
    g.release().await.expect("release");
}

/// A `try` on a held name is `Ok(None)` at once (it never waits on the
/// server), from another client and from another owner on the same client.
pub async fn try_on_held_name_is_not_acquired(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("try-held");
    let g = must_try(&a, &name).await;
    must_be_held(&b, &name).await;
    must_be_held(&a.clone(), &name).await;
    // A try that waited would get the name once the holder lets go.
    let release_at = Instant::now() + TRY_BOUND;
    let holder = tokio::spawn(async move {
        tokio::time::sleep_until(release_at.into()).await;
        g.release().await.expect("release");
    });
    let got = b.try_lock(&name).await.expect("try_lock");
    assert!(
        got.is_none() && Instant::now() < release_at,
        "a try on a held name waited for the holder's release"
    );
    holder.await.expect("holder");
    must_try(&b, &name).await.release().await.expect("release");
}

/// `wait(d)` on a held name fails with `Timeout` near its deadline, through
/// `lock_timeout` and through `acquire` with [`Wait::For`] alike.
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
    let t = Instant::now();
    let err = b
        .acquire(&name, &opts(DEFAULT_TTL, Wait::For(wait), true))
        .await
        .expect_err("acquire with Wait::For must fail with Timeout, not Ok(None)");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        t.elapsed() <= wait + SLACK,
        "gave up late, after {:?}",
        t.elapsed()
    );
    must_be_held(&b, &name).await;
    g.release().await.expect("release");
}

/// A timed-out acquisition's error names the operation and the lock, and
/// (where the backend can inspect) the holder as the server tells it: its
/// owner and fencing token, as `inspect` shows them; a try that asks
/// (`try_lock_or_holder`) names it too, and takes a free name.
pub async fn contention_names_the_holder(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("holder");
    let g = must_try(&a, &name).await;
    let err = b
        .lock_timeout(&name, Duration::from_millis(100))
        .await
        .expect_err("must time out while held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert_eq!(err.operation(), Some("acquire"), "{err}");
    assert!(err.to_string().contains(&name), "{err}");
    let seen = match b.try_lock_or_holder(&name).await.expect("try") {
        Attempt::Acquired(_) => panic!("took a held name"),
        Attempt::Held(h) => h,
    };
    if ctx.caps.inspect {
        let want = b
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("the backend declares inspection")
            .holder
            .expect("inspect shows the holder of a held name");
        let told = err.holder().expect("a timeout names the holder");
        assert_eq!(told.owner, want.owner, "{err}");
        assert_eq!(told.fence, want.fence, "{err}");
        if ctx.caps.has_fencing() {
            assert_eq!(told.fence, g.fence(), "{err}");
        }
        assert!(err.to_string().contains("held by"), "{err}");
        let seen = seen.expect("a try names the holder");
        assert_eq!((seen.owner, seen.fence), (want.owner, want.fence));
    } else {
        assert!(err.holder().is_none(), "{err}");
        assert!(seen.is_none(), "{seen:?}");
    }
    g.release().await.expect("release");
    match b.try_lock_or_holder(&name).await.expect("try") {
        Attempt::Acquired(g) => g.release().await.expect("release"),
        Attempt::Held(h) => panic!("a released name is held by {h:?}"),
    }
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

/// A release that lands while the waiter's own requests are still on their
/// way (each reaches the server 300 ms late, through a proxy where the
/// harness can: between the waiter's look at its predecessor and its watch
/// on it) still wakes the waiter: a watch set up after the look must start
/// from what the look saw, not from whatever is current when it arrives.
pub async fn release_between_look_and_watch_wakes(ctx: Ctx) {
    let proxies = Proxies::new();
    let Some(w) = ctx.locker_via(&proxies).await else {
        return;
    };
    let a = ctx.locker().await;
    let name = ctx.name("look-then-watch");
    let g = must_try(&a, &name).await;
    // Well under every backend's request timeout.
    let delay = Duration::from_millis(300);
    proxies.delay(Dir::Up, delay);
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let g = w.lock(&name).await.expect("waiter acquires");
            g.release().await.expect("release");
        })
    };
    // The waiter's key (or node) reaches the server; its look at the
    // predecessor one delay later, its watch two delays later: release in
    // between.
    until_waiters(&a, &name, 1).await;
    tokio::time::sleep(delay + delay / 2).await;
    g.release().await.expect("release");
    // A missed release that some later timer makes good (a keep-alive, a
    // poll) comes far later than this.
    tokio::time::timeout(SLACK * 2, waiter)
        .await
        .expect("the release between the waiter's look and its watch was missed")
        .expect("waiter task");
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

/// Each release wakes one waiter, the next in line, not all of them (no
/// herd): over a queue of N hand-offs, about N wake-ups, never N²/2.
pub async fn no_herd_on_release(ctx: Ctx) {
    const WAITERS: usize = 5;
    let a = ctx.locker().await;
    let name = ctx.name("herd");
    let g = must_try(&a, &name).await;
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for i in 0..WAITERS {
        let l = ctx.locker().await;
        clients.push(l.clone());
        let n = name.clone();
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&n).await.expect("waiter");
            g.release().await.expect("release");
        }));
        until_waiters(&a, &name, i + 1).await;
    }
    let counted: Vec<&lockcore::Locker> = clients.iter().collect();
    let before = ctx.harness.wakeups(&counted).expect("counted");
    g.release().await.expect("release");
    for t in tasks {
        t.await.expect("waiter task");
    }
    let woken = ctx.harness.wakeups(&counted).expect("counted") - before;
    let herd = (WAITERS * (WAITERS + 1) / 2) as u64;
    assert!(
        woken > 0,
        "no wake-up counted for {WAITERS} hand-offs: the harness's count sees none of these clients"
    );
    assert!(
        woken < herd && woken <= 2 * WAITERS as u64,
        "{woken} wake-ups for {WAITERS} hand-offs: waiters watch more than their predecessor (a herd would be {herd})"
    );
}

/// Many waiters of one client on a busy name take nothing the client needs
/// for other names: it still takes a free name at once and holds a second
/// lock while they wait; then every waiter gets its turn.
pub async fn waiters_do_not_starve_other_names(ctx: Ctx) {
    const WAITERS: usize = 40;
    let holder = ctx.locker().await;
    let busy = ctx.name("starve/busy");
    let g = must_try(&holder, &busy).await;
    let w = ctx.locker().await;
    let mut tasks = Vec::new();
    for _ in 0..WAITERS {
        let (l, n) = (w.clone(), busy.clone());
        tasks.push(tokio::spawn(async move {
            let g = l.lock(&n).await.expect("waiter");
            g.release().await.expect("release");
        }));
    }
    until_waiters(&holder, &busy, WAITERS).await;
    let t = Instant::now();
    let first = w
        .try_lock(&ctx.name("starve/free-1"))
        .await
        .expect("a try on a free name while this client's waiters queue elsewhere")
        .expect("the name is free");
    assert!(t.elapsed() < SLACK, "the try took {:?}", t.elapsed());
    let second = w
        .clone()
        .lock_timeout(&ctx.name("starve/free-2"), SLACK)
        .await
        .expect("a holder takes a second lock while this client's waiters queue elsewhere");
    second.release().await.expect("release");
    first.release().await.expect("release");
    g.release().await.expect("release");
    let all = async {
        for t in tasks {
            t.await.expect("waiter task");
        }
    };
    tokio::time::timeout(SLACK * 10, all)
        .await
        .expect("every waiter got its turn");
    must_try(&holder, &busy)
        .await
        .release()
        .await
        .expect("release");
}

/// What another client reads of a name ([`lockcore::Locker::holdings`]):
/// the lock's holder with its token, a semaphore's permits, a read-write
/// lock's reader and then its writer; and the name among those listed
/// under its prefix ([`lockcore::Locker::held`]) where the backend lists.
/// Released, it reads free and is no longer listed.
pub async fn holdings_name_every_primitive(ctx: Ctx) {
    let (l, other) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("holdings");
    let fenced = ctx.caps.has_fencing();
    let g = must_try(&l, &name).await;
    let h = other.holdings(&name).await.expect("holdings");
    let lock = h.lock.clone().expect("the lock's holder");
    if fenced {
        assert_eq!(lock.fence, g.fence(), "the holder's token");
    }
    let sem = (ctx.caps.semaphore_layout != lockcore::Layout::Unsupported)
        .then(|| lockcore::Semaphore::new(&l, &name, 2).expect("semaphore"));
    let permit = match &sem {
        Some(s) => Some(s.try_acquire().await.expect("try").expect("a free permit")),
        None => None,
    };
    let rw = (ctx.caps.rw_layout != lockcore::Layout::Unsupported)
        .then(|| lockcore::RwLock::new(&l, &name).expect("rwlock"));
    let reader = match &rw {
        Some(rw) => Some(rw.try_read().await.expect("try").expect("no writer")),
        None => None,
    };
    let h = other.holdings(&name).await.expect("holdings");
    assert_eq!(h.permits.len(), usize::from(permit.is_some()), "{h:?}");
    assert_eq!(h.readers.len(), usize::from(reader.is_some()), "{h:?}");
    assert!(h.writer.is_none(), "{h:?}");
    if let Some(r) = reader {
        r.release().await.expect("release");
    }
    let writer = match &rw {
        Some(rw) => Some(rw.try_write().await.expect("try").expect("no reader")),
        None => None,
    };
    let h = other.holdings(&name).await.expect("holdings");
    assert_eq!(h.writer.is_some(), writer.is_some(), "{h:?}");
    assert!(
        h.readers.is_empty(),
        "a writer's slots shown as readers: {h:?}"
    );
    let prefix = ctx.name("holdings");
    if let Some(listed) = other.held(&prefix, 10).await.expect("held") {
        assert!(
            listed
                .names
                .iter()
                .any(|x| x.name == name && x.lock.is_some()),
            "{name:?} is not listed: {listed:?}"
        );
    }
    if let Some(p) = permit {
        p.release().await.expect("release");
    }
    if let Some(w) = writer {
        w.release().await.expect("release");
    }
    g.release().await.expect("release");
    let h = other.holdings(&name).await.expect("holdings");
    assert!(h.is_free(), "{h:?}");
    if let Some(listed) = other.held(&prefix, 10).await.expect("held") {
        assert!(listed.names.iter().all(|x| x.name != name), "{listed:?}");
    }
}
