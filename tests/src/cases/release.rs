//! Release: owner-checked, never freeing another owner's lease.

use std::time::Duration;

use lockcore::{ErrorKind, Wait};

use super::{acquire_within, must_be_held, opts, SHORT_TTL, SLACK};
use crate::Ctx;

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
    must_be_held(&c, &name).await;
    new.release().await.expect("the new holder releases");
}

/// A holder whose lease was taken away on the server, while its own client
/// still counts it valid, asks the server to renew and to release: the
/// server refuses both for the stale owner (`Lost`), and the new holder
/// keeps the name.
pub async fn stale_owner_cannot_renew_or_release(ctx: Ctx) {
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let name = ctx.name("stale-owner");
    let ttl = Duration::from_secs(30);
    // No watchdog: the stale owner's client learns nothing by itself.
    let old = a
        .acquire(&name, &opts(ttl, Wait::Try, false))
        .await
        .expect("acquire")
        .expect("free");
    assert!(
        ctx.harness.revoke(&name).await.expect("revoke"),
        "revoke found nothing held"
    );
    let new = acquire_within(&b, &name, SLACK * 2).await;
    let err = old
        .extend(ttl)
        .await
        .expect_err("a stale owner renewed a lease that another owner holds");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    must_be_held(&c, &name).await;
    let err = old
        .release()
        .await
        .expect_err("a stale owner's release must report Lost");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    must_be_held(&c, &name).await;
    new.extend(ttl).await.expect("the new holder renews");
    must_be_held(&c, &name).await;
    new.release().await.expect("release");
}
