//! Fencing: strictly rising tokens across holders.

use std::time::Duration;

use lockcore::{Fencing, Wait};

use super::{must_try, opts, SLACK};
use crate::Ctx;

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
