//! Names: opaque and distinct, odd ones included; invalid ones refused
//! before any server is asked; many held at once.

use std::time::Duration;

use lockcore::{ErrorKind, LockOptions, MAX_NAME_BYTES};

use super::{must_be_held, must_try};
use crate::Ctx;

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
        "}",
        "A",
        "a",
        "*",
        "\\",
    ]
    .iter()
    .map(|s| format!("{base}/{s}"))
    .chain([long])
    .collect();
    held_one_by_one(&a, &b, &odd).await;
    let too_long = "x".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", "a\0b", "line\nbreak", "\u{7f}", too_long.as_str()] {
        let err = a.try_lock(bad).await.expect_err("invalid name accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{bad:?}: {err}");
    }
    for ttl in [
        Duration::ZERO,
        lockcore::MIN_TTL - Duration::from_millis(1),
        lockcore::MAX_TTL + Duration::from_secs(1),
    ] {
        let err = a
            .acquire(&base, &LockOptions::new().ttl(ttl))
            .await
            .expect_err("an out-of-range ttl accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "ttl {ttl:?}: {err}");
    }
}

/// Names whose first character is special to some keyspace (`}`, `{`, `/`,
/// `%`, a space, `.`), with nothing in front of them: each is an ordinary
/// name that excludes and fences like any other.
pub async fn odd_names_at_the_root(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    // The run's namespace goes last, so that the first character is the odd
    // one and runs still never collide.
    let tail = ctx.namespace.replace('/', "-");
    let odd: Vec<String> = ["}", "{", "{}", "/", "%", " ", ".", "}{"]
        .iter()
        .map(|s| format!("{s}{tail}"))
        .collect();
    held_one_by_one(&a, &b, &odd).await;
}

/// Takes every name through `a`, proves each held through `b`, releases
/// them, and takes each again through `b`.
async fn held_one_by_one(a: &lockcore::Locker, b: &lockcore::Locker, names: &[String]) {
    let mut guards = Vec::new();
    for n in names {
        let g = must_try(a, n).await;
        assert_eq!(g.name(), n);
        guards.push(g);
    }
    for n in names {
        must_be_held(b, n).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
    for n in names {
        must_try(b, n).await.release().await.expect("release");
    }
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

/// The locks a primitive is built of live in a namespace of their own that
/// no user name reaches: a lock named like a read-write lock's writers'
/// gate (`cfg/write`) or a semaphore's slot (`x/permit-0000`), and a
/// semaphore named like a read-write lock's reader slots (`cfg/read`), are
/// other names than the primitive's parts, taken and held beside it. A
/// primitive refuses a name that holds the parts' separator.
pub async fn primitive_parts_are_apart_from_names(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let base = ctx.name("parts");

    // The writers' gate and every reader slot are held by a writer.
    let rw = lockcore::RwLock::new(&a, &format!("{base}/cfg")).expect("rwlock");
    let w = rw.try_write().await.expect("try").expect("free");
    let gate_like = must_try(&b, &format!("{base}/cfg/write")).await;
    let readers_like =
        lockcore::Semaphore::new(&b, &format!("{base}/cfg/read"), 4).expect("semaphore");
    let p = readers_like
        .try_acquire()
        .await
        .expect("try")
        .expect("a semaphore named like a writer-held lock's reader slots is free");
    must_be_held(&b, &format!("{base}/cfg/write")).await;
    w.release().await.expect("release");
    // And the other way round: those names held, the read-write lock is free.
    let r = rw.try_read().await.expect("try").expect("readers pass");
    r.release().await.expect("release");
    let w = rw.try_write().await.expect("try").expect("writers pass");
    w.release().await.expect("release");
    gate_like.release().await.expect("release");
    p.release().await.expect("release");

    // A semaphore's slot.
    let sem = lockcore::Semaphore::new(&a, &format!("{base}/x"), 1).expect("semaphore");
    let permit = sem.try_acquire().await.expect("try").expect("free");
    let slot_like = must_try(&b, &format!("{base}/x/permit-0000")).await;
    assert!(
        sem.try_acquire().await.expect("try").is_none(),
        "one permit"
    );
    permit.release().await.expect("release");
    let permit = sem
        .try_acquire()
        .await
        .expect("try")
        .expect("free beside a lock of a slot-like name");
    permit.release().await.expect("release");
    slot_like.release().await.expect("release");

    // Names with the parts' separator are no user names.
    let part = format!("{base}\u{1f}write");
    let e = lockcore::Semaphore::new(&a, &part, 2).expect_err("a part's name as a semaphore");
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    let e = lockcore::RwLock::new(&a, &part).expect_err("a part's name as a read-write lock");
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    let e = lockcore::Election::new(&a, &part).expect_err("a part's name as an election");
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    let e = a
        .try_lock(&format!("{base}\u{1f}other"))
        .await
        .expect_err("a separator in a lock name");
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
}
