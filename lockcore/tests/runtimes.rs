//! A `Locker` used from one runtime after another (a `static` handle
//! shared by `#[tokio::test]`s, each on a runtime of its own): the leases
//! taken on a later runtime are renewed there, after the runtime the
//! handle was first used on has ended, and so are the leases taken on the
//! first runtime and still held, from the next acquire on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lockcore::{LockOptions, Locker, Wait};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_lease_taken_on_a_second_runtime_is_renewed_after_the_first_ended() {
    let locker = Locker::memory();
    let ttl = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let first = runtime();
    let g1 = first.block_on(async {
        let g = locker.acquire("first", &ttl).await.expect("acquire");
        g.expect("free")
    });
    drop(first);

    let second = runtime();
    second.block_on(async {
        let g = locker
            .acquire("second", &ttl)
            .await
            .expect("acquire")
            .expect("free");
        // Four ttls: renewed all along, or another owner takes it.
        let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
        assert!(lost.is_err(), "the lease was lost on the second runtime");
        for name in ["first", "second"] {
            let other = locker.acquire(name, &ttl).await.expect("try");
            assert!(
                other.is_none(),
                "another owner took {name:?}: its lease was not renewed on the second runtime"
            );
        }
        assert!(g1.is_held(), "the first lease, taken on the first runtime");
        g.release().await.expect("release");
        g1.release().await.expect("release of the first lease");
    });
}

#[test]
fn a_lease_whose_runtime_ended_signals_lost_at_its_deadline() {
    let locker = Locker::memory();
    let ttl = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let first = runtime();
    let g = first.block_on(async {
        let g = locker.acquire("orphan", &ttl).await.expect("acquire");
        g.expect("free")
    });
    drop(first);
    // No acquire on the handle since: nothing renews the lease. Its lost
    // signal is raised when its validity passes, before another owner can
    // take the name.
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(4), g.lost())
            .await
            .expect("the lost signal, at the lease's validity deadline");
        assert!(!g.is_held());
        let other = locker.acquire("orphan", &ttl).await.expect("try");
        assert!(other.is_some(), "the name is free once the lease lapsed");
    });
}
