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
