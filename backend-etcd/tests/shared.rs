//! The shared lease, checked on the server: the locks the watchdog renews
//! move, at their first renewal, onto one lease per ttl, so that their
//! keepalives do not grow with how many are held; a lock renewed by hand
//! keeps its own; an abandoned lock still ends by its ttl, alone; and the
//! shared lease's end loses every lock on it. One case at a time, since the
//! counts are the whole server's.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{connect, delete_and_see_it_alone_lost, holder_lease, metric, raw, shared_lease_of};
use lockcore::{LockOptions, Wait};
use lockcore_conformance::cases::{hold_all, must_be_held};
use lockcore_conformance::own_cases;
use lockcore_conformance::{run_serial, Ctx, Dir, Proxies, Target, UrlHarness, COMPOSE_HINT};

const TTL: Duration = Duration::from_secs(3);

/// Locks held past their first renewal are all on one lease, and the
/// leases they were granted with are revoked; a lock renewed by hand
/// (`renew(false)`, `extend`) keeps its own. Released, the names are free.
async fn renewed_locks_share_one_lease(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names: Vec<String> = (0..20).map(|i| ctx.name(&format!("s/{i}"))).collect();
    let guards = hold_all(&l, &names, TTL).await;
    let mut own = Vec::new();
    for n in &names {
        own.push(holder_lease(&mut c, n).await.expect("a key"));
    }
    let by_hand = ctx.name("by-hand");
    let manual = l
        .acquire(&by_hand, &LockOptions::new().ttl(TTL).renew(false))
        .await
        .unwrap()
        .expect("free");
    let manual_own = holder_lease(&mut c, &by_hand).await.expect("a key");

    let shared = shared_lease_of(&mut c, &names, TTL).await;
    assert!(
        !own.contains(&shared),
        "a lock's own lease became the shared one"
    );
    // Revoked in the background once the key is off it.
    for id in own {
        let until = Instant::now() + TTL;
        while c.lease_time_to_live(id, None).await.expect("ttl").ttl() > 0 {
            assert!(
                Instant::now() < until,
                "the lease {id:x} a key moved off still lives"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    manual.extend(TTL).await.expect("extend");
    manual.extend(TTL).await.expect("extend");
    assert_eq!(
        holder_lease(&mut c, &by_hand).await,
        Some(manual_own),
        "a lock renewed by hand moved off its own lease"
    );
    let other = ctx.harness.connect().await.expect("connect");
    for n in &names {
        must_be_held(&other, n).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
    manual.release().await.expect("release");
    for n in names.iter().chain([&by_hand]) {
        let g = other.try_lock(n).await.unwrap();
        g.unwrap_or_else(|| panic!("{n} is still held after its release"))
            .release()
            .await
            .unwrap();
    }
}

/// 200 locks held, past their first renewals, cost the server a few
/// keepalive messages a second, not one per lock and renewal.
async fn keepalives_do_not_grow_with_the_locks_held(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names: Vec<String> = (0..200).map(|i| ctx.name(&format!("k/{i}"))).collect();
    let guards = hold_all(&l, &names, TTL).await;
    shared_lease_of(&mut c, &names, TTL).await;
    let series = "grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"}";
    let before = metric(&ctx, series).await;
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let msgs = metric(&ctx, series).await - before;
    eprintln!("FIGURES shared_lease etcd: keepalive_messages_in_4s_for_200_locks={msgs}");
    // A lease per lock: 200 locks x 3 renewals a second x 4 s = 2,400.
    // Shared: about one keepalive each three quarters of a twentieth of
    // the ttl (112 ms) while renewals come, the next sent ahead.
    assert!(
        msgs <= 60,
        "{msgs} keepalive messages in 4 s of renewals of 200 locks"
    );
    let other = ctx.harness.connect().await.expect("connect");
    for i in [0, 100, 199] {
        must_be_held(&other, &names[i]).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

/// An abandoned lock that was on the shared lease still ends by its ttl,
/// though the handle's other lock keeps renewing that lease; the other
/// stays held.
async fn an_abandoned_lock_on_the_shared_lease_ends_by_its_ttl(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let other = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names = vec![ctx.name("abandoned"), ctx.name("kept")];
    let mut guards = hold_all(&l, &names, TTL).await;
    shared_lease_of(&mut c, &names, TTL).await;
    let kept = guards.pop().expect("two");
    guards.pop().expect("two").abandon();
    let abandoned_at = Instant::now();
    must_be_held(&other, &names[0]).await;
    let g = other
        .acquire(
            &names[0],
            &LockOptions::new().ttl(TTL).wait(Wait::For(6 * TTL)),
        )
        .await
        .unwrap()
        .expect("the abandoned lock ends");
    let took = abandoned_at.elapsed();
    // Its ttl, and the server's own slack in expiring leases.
    assert!(
        took <= 3 * TTL,
        "the abandoned lock ended {took:?} after the abandon (ttl {TTL:?})"
    );
    assert!(kept.is_held(), "the other lock was lost");
    must_be_held(&other, &names[1]).await;
    g.release().await.unwrap();
    kept.release().await.unwrap();
}

/// The shared lease revoked behind the holder's back (`etcdctl lease
/// revoke`): every lock on it sees it lost, their names are free, and the
/// next locks move onto a new shared lease.
async fn a_revoked_shared_lease_loses_every_lock_on_it(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let other = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names: Vec<String> = (0..5).map(|i| ctx.name(&format!("r/{i}"))).collect();
    let guards = hold_all(&l, &names, TTL).await;
    let shared = shared_lease_of(&mut c, &names, TTL).await;
    c.lease_revoke(shared).await.expect("revoke");
    for (n, g) in names.iter().zip(&guards) {
        tokio::time::timeout(2 * TTL, g.lost())
            .await
            .unwrap_or_else(|_| panic!("{n}: no lost signal"));
        other
            .try_lock(n)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{n} is held after its lease was revoked"))
            .release()
            .await
            .unwrap();
    }
    for g in guards {
        let _ = g.release().await;
    }
    // The next locks of the handle move onto a lease that lives.
    let guards = hold_all(&l, &names, TTL).await;
    shared_lease_of(&mut c, &names, TTL).await;
    tokio::time::sleep(TTL).await;
    for (n, g) in names.iter().zip(&guards) {
        assert!(g.is_held(), "{n} was lost on the new shared lease");
        must_be_held(&other, n).await;
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A key deleted on the server while it is on the shared lease (`etcdctl
/// del`): the read of the lease's keys finds it gone, so that lock alone is
/// lost (refused, not lapsed), and the others on the lease stay held, on
/// the server too.
async fn a_key_deleted_on_the_shared_lease_is_lost_and_only_it(ctx: Ctx) {
    let l = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names: Vec<String> = (0..40).map(|i| ctx.name(&format!("d/{i}"))).collect();
    let guards = hold_all(&l, &names, TTL).await;
    let shared = shared_lease_of(&mut c, &names, TTL).await;
    delete_and_see_it_alone_lost(&ctx, &mut c, &names, &guards, 13, TTL).await;
    // Renewed on the same lease all along.
    for (i, name) in names.iter().enumerate() {
        if i != 13 {
            assert_eq!(holder_lease(&mut c, name).await, Some(shared), "{name}");
        }
    }
    for g in guards {
        let _ = g.release().await;
    }
}

/// A lock on the shared lease whose release cannot reach the server (its
/// handle's traffic blackholed until the release gives up) is deleted in
/// the background once the server answers again, though the handle's other
/// lock keeps the shared lease alive.
async fn a_failed_release_on_the_shared_lease_is_finished_later(ctx: Ctx) {
    let ttl = Duration::from_secs(9);
    let proxies = Proxies::new();
    let routed = proxies.route_url(&ctx.config, 2379).await.expect("proxy");
    let l = lockcore_etcd::connect(&routed).await.expect("connect");
    let other = ctx.harness.connect().await.expect("connect");
    let mut c = raw(&ctx).await;
    let names = vec![ctx.name("release-failed"), ctx.name("kept")];
    let mut guards = hold_all(&l, &names, ttl).await;
    shared_lease_of(&mut c, &names, ttl).await;
    let kept = guards.pop().expect("two");
    let g = guards.pop().expect("two");
    proxies.blackhole(Dir::Both);
    let released = g.release().await;
    assert!(released.is_err(), "a release through a blackhole succeeded");
    must_be_held(&other, &names[0]).await;
    proxies.heal();
    proxies.reset();
    let start = Instant::now();
    loop {
        if let Some(g) = other.try_lock(&names[0]).await.unwrap() {
            g.release().await.unwrap();
            break;
        }
        assert!(
            start.elapsed() < 2 * ttl,
            "the key of the failed release is still held {:?} after the server answers again",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kept.is_held(), "the other lock was lost");
    must_be_held(&other, &names[1]).await;
    kept.release().await.unwrap();
}

fn main() -> std::process::ExitCode {
    let url = |s: String| async move { Ok(UrlHarness::shared(s, connect)) };
    run_serial(vec![own_cases!(
        Target::new("etcd-shared", Some("LOCKTEST_ETCD_URL"), url)
            .hint(COMPOSE_HINT)
            .only_own_cases(),
        renewed_locks_share_one_lease,
        keepalives_do_not_grow_with_the_locks_held,
        an_abandoned_lock_on_the_shared_lease_ends_by_its_ttl,
        a_revoked_shared_lease_loses_every_lock_on_it,
        a_failed_release_on_the_shared_lease_is_finished_later,
        a_key_deleted_on_the_shared_lease_is_lost_and_only_it,
    )])
}
