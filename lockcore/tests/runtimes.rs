//! A `Locker` used from several runtimes, one after another or side by
//! side (a `static` handle shared by `#[tokio::test]`s, each on a runtime
//! of its own): its leases are renewed after the runtime its watchdog ran
//! on has ended, and a lease that nothing renews raises its lost signal at
//! its validity deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::Duration;

use lockcore::{LockGuard, LockOptions, Locker, RwLock, Wait};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A runtime whose worker runs its tasks while no one blocks on it.
fn beside() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A try with a 1 s ttl.
fn one_second() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try)
}

/// `name`, taken on `rt`: it must be free.
fn take(rt: &tokio::runtime::Runtime, locker: &Locker, name: &str) -> LockGuard {
    rt.block_on(async {
        let g = locker.acquire(name, &one_second()).await.expect("acquire");
        g.expect("free")
    })
}

/// Proves on the store that each of `names` is still held: another owner's
/// try is refused.
async fn held_by_another(locker: &Locker, names: &[&str], why: &str) {
    for name in names {
        let other = locker.acquire(name, &one_second()).await.expect("try");
        assert!(other.is_none(), "another owner took {name:?}: {why}");
    }
}

#[test]
fn a_lease_taken_on_a_second_runtime_is_renewed_after_the_first_ended() {
    let locker = Locker::memory();
    let first = runtime();
    let g1 = take(&first, &locker, "first");
    drop(first);

    let second = runtime();
    let g = take(&second, &locker, "second");
    second.block_on(async {
        // Four ttls: renewed all along, or another owner takes it.
        let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
        assert!(lost.is_err(), "the lease was lost on the second runtime");
        let why = "its lease was not renewed on the second runtime";
        held_by_another(&locker, &["first", "second"], why).await;
        assert!(g1.is_held(), "the first lease, taken on the first runtime");
        g.release().await.expect("release");
        g1.release().await.expect("release of the first lease");
    });
}

#[test]
fn a_lease_whose_runtime_ended_signals_lost_at_its_deadline() {
    let locker = Locker::memory();
    let first = runtime();
    let rw = RwLock::new(&locker, "orphan-rw").expect("rw lock");
    let g = take(&first, &locker, "orphan");
    let r = first.block_on(async {
        let r = rw.read(&one_second()).await.expect("read");
        r.expect("no writer")
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
        let other = locker.acquire("orphan", &one_second()).await;
        let other = other.expect("try");
        assert!(other.is_some(), "the name is free once the lease lapsed");
    });
}

#[test]
fn a_lease_on_a_runtime_beside_the_watchdogs_is_renewed_when_that_one_ends() {
    let locker = Locker::memory();
    // The first runtime takes a lease: the watchdog's task runs there.
    let first = beside();
    let g1 = take(&first, &locker, "first");
    // A second runtime, beside the first, takes a lease; then the first
    // ends.
    let second = runtime();
    let g = take(&second, &locker, "beside");
    second.block_on(async {
        first.shutdown_background();
        let lost = tokio::time::timeout(Duration::from_secs(4), g.lost()).await;
        assert!(lost.is_err(), "the lease was lost: {:?}", g.lost_reason());
        let why = "its lease was not renewed once the first runtime ended";
        held_by_another(&locker, &["first", "beside"], why).await;
        g.release().await.expect("release");
        g1.release().await.expect("release of the first lease");
    });
}

#[test]
fn lost_can_be_polled_off_a_runtime() {
    let locker = Locker::memory();
    let rt = runtime();
    let g = take(&rt, &locker, "off");
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
    let (a, b, c) = (beside(), beside(), beside());
    // The watchdog's task on the first; the second and third beside it.
    let ga = take(&a, &locker, "a");
    let gb = take(&b, &locker, "b");
    let gc = take(&c, &locker, "c");
    a.shutdown_background();
    c.shutdown_background();
    b.block_on(async {
        let lost = tokio::time::timeout(Duration::from_secs(4), gb.lost()).await;
        assert!(lost.is_err(), "the lease was lost: {:?}", gb.lost_reason());
        held_by_another(&locker, &["b"], "the second runtime's lease").await;
        gb.release().await.expect("release");
    });
    drop((ga, gc));
}
