//! Lock-delay: the safety users of Chubby and Consul rely on.

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Wait};

use super::{must_be_held, nothing_left, SLACK};
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
    nothing_left(&ctx, &name, SLACK).await;
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

/// A lock-delay holds for an election's leader and a semaphore's permit
/// as for a lock: abandoned, the leadership (or the permit) is taken by no
/// one before ttl + delay after its grant was sent. A backend may refuse a
/// lock-delay for a semaphore in its own layout (`InvalidConfig`, as
/// MySQL's rows do) but never grant early.
pub async fn lock_delay_for_leaders_and_permits(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (ttl, delay) = (Duration::from_secs(2), Duration::from_secs(3));
    let opts = LockOptions::new()
        .ttl(ttl)
        .lock_delay(delay)
        .wait(Wait::Try)
        .renew(false);
    let then = LockOptions::new().wait(Wait::For(ttl + delay + SLACK * 2));
    if ctx.caps.values && ctx.caps.inspect {
        let name = ctx.name("delay/leader");
        let (ea, eb) = (
            lockcore::Election::new(&a, &name).expect("election"),
            lockcore::Election::new(&b, &name).expect("election"),
        );
        let sent = Instant::now();
        let lead = ea
            .campaign_with("first", &opts)
            .await
            .expect("campaign")
            .expect("no leader yet");
        lead.into_guard().abandon();
        assert!(
            eb.try_campaign("second").await.expect("try").is_none(),
            "led at once after an unclean end"
        );
        let next = eb
            .campaign_with("second", &then)
            .await
            .expect("campaign")
            .expect("leads after the delay");
        assert!(
            sent.elapsed() >= ttl + delay,
            "led {:?} after the first grant was sent, before ttl + delay",
            sent.elapsed()
        );
        next.resign().await.expect("resign");
    }
    let name = ctx.name("delay/permit");
    let (sa, sb) = (
        lockcore::Semaphore::new(&a, &name, 1).expect("semaphore"),
        lockcore::Semaphore::new(&b, &name, 1).expect("semaphore"),
    );
    let sent = Instant::now();
    let permit = match sa.acquire(&opts).await {
        Ok(p) => p.expect("a free permit"),
        Err(e) if e.kind() == ErrorKind::InvalidConfig => return,
        Err(e) => panic!("acquire: {e}"),
    };
    permit.into_guard().abandon();
    assert!(
        sb.try_acquire().await.expect("try").is_none(),
        "a permit at once after an unclean end"
    );
    let next = sb
        .acquire(&then)
        .await
        .expect("acquire")
        .expect("a permit after the delay");
    assert!(
        sent.elapsed() >= ttl + delay,
        "a permit {:?} after the first was sent, before ttl + delay",
        sent.elapsed()
    );
    next.release().await.expect("release");
}
