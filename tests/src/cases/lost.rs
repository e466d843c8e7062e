//! The lost signal: at the validity deadline, on time when renewals fail,
//! and when the lease is revoked on the server.

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, Wait};

use super::{acquire_within, must_be_held, opts, SHORT_TTL, SLACK};
use crate::{Ctx, Dir, Proxies};

/// How late the lost signal may fire after the validity deadline on a
/// loaded 2-core machine: far less than the shortest ttl, so a signal a
/// whole ttl late is caught.
const LOST_LATENESS: Duration = Duration::from_millis(300);

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
