//! A `Locker` used from one runtime after another (a `static` handle
//! shared by `#[tokio::test]`s, each on a runtime of its own): the leases
//! taken on a later runtime are renewed there, after the runtime the
//! handle was first used on has ended, and so are the leases taken on the
//! first runtime and still held, from the next acquire on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use lockcore::{LockOptions, Locker, RwLock, Wait};

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
    let rw = RwLock::new(&locker, "orphan-rw").expect("rw lock");
    let (g, r) = first.block_on(async {
        let g = locker.acquire("orphan", &ttl).await.expect("acquire");
        let r = rw.read(&ttl).await.expect("read").expect("no writer");
        (g.expect("free"), r)
    });
    drop(first);
    // No acquire on the handle since: nothing renews the lease. Its lost
    // signal is raised when its validity passes, before another owner can
    // take the name.
    runtime().block_on(async {
        let (lock_lost, read_lost) = (g.lost(), r.lost());
        tokio::time::timeout(Duration::from_secs(4), async {
            lock_lost.await;
            read_lost.await;
        })
        .await
        .expect("the lost signals of the lock and the read lock, at their validity deadline");
        assert!(!g.is_held());
        let other = locker.acquire("orphan", &ttl).await.expect("try");
        assert!(other.is_some(), "the name is free once the lease lapsed");
    });
}

#[test]
fn a_lease_on_a_runtime_beside_the_watchdogs_is_renewed_when_that_one_ends() {
    let locker = Locker::memory();
    let ttl = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    // The first runtime takes a lease: the watchdog's task runs there.
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let g1 = first.block_on(async {
        let g = locker.acquire("first", &ttl).await.expect("acquire");
        g.expect("free")
    });
    runtime().block_on(async {
        // A second runtime, beside the first, takes a lease; then the
        // first ends.
        let g = locker
            .acquire("beside", &ttl)
            .await
            .expect("acquire")
            .expect("free");
        first.shutdown_background();
        let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
        assert!(lost.is_err(), "the lease was lost: {:?}", g.lost_reason());
        for name in ["first", "beside"] {
            let other = locker.acquire(name, &ttl).await.expect("try");
            assert!(
                other.is_none(),
                "another owner took {name:?}: its lease was not renewed once the first runtime ended"
            );
        }
        g.release().await.expect("release");
        g1.release().await.expect("release of the first lease");
    });
}

#[test]
fn lost_can_be_polled_off_a_runtime() {
    let locker = Locker::memory();
    let ttl = LockOptions::new().wait(Wait::Try);
    let rt = runtime();
    let g = rt.block_on(async {
        let g = locker.acquire("off", &ttl).await.expect("acquire");
        g.expect("free")
    });
    // On a thread with no runtime (another executor): pending, no panic.
    let mut lost = Box::pin(g.lost());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(lost.as_mut().poll(&mut cx).is_pending());
    rt.block_on(g.release()).expect("release");
    assert!(lost.as_mut().poll(&mut cx).is_pending(), "not on a release");
}

#[test]
fn leases_outlive_two_of_three_runtimes_side_by_side() {
    let locker = Locker::memory();
    let ttl = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let (a, b, c) = (rt(), rt(), rt());
    let take = |rt: &tokio::runtime::Runtime, name: &'static str| {
        rt.block_on(async {
            let g = locker.acquire(name, &ttl).await.expect("acquire");
            g.expect("free")
        })
    };
    // The watchdog's task on the first; the second and third beside it.
    let (ga, gb, gc) = (take(&a, "a"), take(&b, "b"), take(&c, "c"));
    a.shutdown_background();
    c.shutdown_background();
    b.block_on(async {
        let lost = tokio::time::timeout(Duration::from_secs(4), gb.lost()).await;
        assert!(lost.is_err(), "the lease was lost: {:?}", gb.lost_reason());
        let other = locker.acquire("b", &ttl).await.expect("try");
        assert!(
            other.is_none(),
            "another owner took the second runtime's name"
        );
        gb.release().await.expect("release");
    });
    drop((ga, gc));
}
