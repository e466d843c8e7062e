//! A history check over a whole contended run.

use std::time::Duration;

use lockcore::testing::history::History;
use lockcore::Wait;

use super::{opts, SHORT_TTL};
use crate::{Ctx, Dir, Proxies};

/// A contended run over several names and clients, recorded with each
/// lease's validity interval: no two valid leases on a name overlapped and
/// tokens rose in acquisition order. Besides holders that release, one
/// client lets its leases lapse (no renewal, held past the ttl) while its
/// replies come late (through a proxy, where the harness can), so that the
/// next holder takes the name right at its expiry on the server: a validity
/// counted from the reply, not the request, shows as an overlap.
pub async fn history_of_a_contended_run_is_safe(ctx: Ctx) {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 12;
    const LAPSES: usize = 3;
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
    let proxies = Proxies::new();
    let lapsing = match ctx.locker_via(&proxies).await {
        Some(l) => l,
        None => ctx.locker().await,
    };
    proxies.delay(Dir::Down, Duration::from_millis(50));
    let contender = ctx.locker().await;
    {
        let (names, history) = (names.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            for r in 0..LAPSES {
                let name = &names[r % names.len()];
                let g = lapsing
                    .acquire(name, &opts(SHORT_TTL, Wait::Forever, false))
                    .await
                    .expect("acquire")
                    .expect("waits");
                let id = history.acquired(&g);
                // Another client waits, and takes the name when it lapses.
                let waiter = {
                    let (l, name, history) = (contender.clone(), name.clone(), history.clone());
                    tokio::spawn(async move {
                        let g = l.lock(&name).await.expect("lock");
                        let id = history.acquired(&g);
                        history.ended(id, &g);
                        g.release().await.expect("release");
                    })
                };
                g.lost().await;
                history.ended(id, &g);
                drop(g);
                waiter.await.expect("contender");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let summary = history.check().expect("the history is safe");
    assert_eq!(summary.leases, CLIENTS * ROUNDS + 2 * LAPSES);
    assert_eq!(summary.names, names.len());
}
