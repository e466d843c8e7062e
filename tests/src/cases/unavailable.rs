//! Unavailable servers: absent from the start, or gone silent after connect.

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, Wait};

use super::{acquire_within, opts, SLACK};
use crate::{Ctx, Dir, Proxies};

/// How long any one call may take against a silent server: it must end by
/// the client's own connect and request timeouts, never hang.
const BOUND: Duration = Duration::from_secs(10);

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

fn unreachable_kind(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Unavailable | ErrorKind::Indeterminate)
}

/// A server that stops answering after connect (every connection of the
/// client silently dropped): a `try` ends with `Unavailable` (or
/// `Indeterminate`), a wait by its deadline, the held lease's lost signal
/// fires once its validity passes without a renewal, its release returns;
/// nothing hangs. The server itself frees the lease by its ttl, and once the
/// network heals the same client works again.
pub async fn server_stops_answering(ctx: Ctx) {
    let proxies = Proxies::new();
    let l = ctx.locker_via(&proxies).await.expect("the harness proxies");
    let other = ctx.locker().await;
    let held_name = ctx.name("silent/held");
    let ttl = Duration::from_secs(4);
    let g = l
        .acquire(&held_name, &opts(ttl, Wait::Try, true))
        .await
        .expect("acquire")
        .expect("free");
    let valid_until = g.valid_until().expect("held");
    proxies.blackhole(Dir::Both);

    let t = Instant::now();
    let r = tokio::time::timeout(BOUND, l.try_lock(&ctx.name("silent/try")))
        .await
        .unwrap_or_else(|_| panic!("try_lock on a silent server hung for {BOUND:?}"));
    let err = match r {
        Ok(Some(_)) => panic!("acquired a lock from a silent server"),
        Ok(None) => panic!("a silent server was reported as holding the name"),
        Err(e) => e,
    };
    assert!(unreachable_kind(err.kind()), "try_lock: {err}");
    assert!(t.elapsed() < BOUND, "try_lock took {:?}", t.elapsed());

    let wait = Duration::from_secs(1);
    let t = Instant::now();
    let r = tokio::time::timeout(wait + BOUND, l.lock_timeout(&ctx.name("silent/wait"), wait))
        .await
        .unwrap_or_else(|_| panic!("lock_timeout on a silent server hung"));
    let err = r.expect_err("acquired a lock from a silent server");
    assert!(
        unreachable_kind(err.kind()),
        "lock_timeout on a silent server: {err} (a server that does not answer is not a name that is held)"
    );
    assert!(
        t.elapsed() <= wait + BOUND,
        "lock_timeout took {:?}",
        t.elapsed()
    );

    tokio::time::timeout_at((valid_until + SLACK).into(), g.lost())
        .await
        .expect("lost did not fire though the validity deadline passed without a renewal");
    assert!(!g.is_held());
    let r = tokio::time::timeout(BOUND, g.release())
        .await
        .expect("release on a silent server hung");
    assert!(r.is_err(), "release of a lost lease reported success");

    // The server was fine all along: it frees the lease by its ttl.
    acquire_within(&other, &held_name, ttl + SLACK * 2)
        .await
        .release()
        .await
        .expect("release");

    // The network heals: the same client works again.
    proxies.heal();
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = ctx.name("silent/again");
    loop {
        match tokio::time::timeout(BOUND, l.try_lock(&again)).await {
            Ok(Ok(Some(g))) => {
                g.release().await.expect("release after recovery");
                break;
            }
            r => {
                assert!(
                    Instant::now() < deadline,
                    "the client did not recover after the network healed: {r:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
