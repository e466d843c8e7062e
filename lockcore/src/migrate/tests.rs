//! The migrating pair on two in-memory backends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::{Capabilities, Fencing, LeaseKind};
use crate::error::Result;
use crate::raw::sync::lock;
use crate::raw::{AcquireRequest, Backend, Grant};

use super::backend::{pair_lease, weaker_fencing};
use super::Migrating;
use crate::locker::Locker;
use crate::memory::MemoryBackend;
use crate::options::{LockOptions, Wait};

const BOUND: Duration = Duration::from_secs(5);

fn pair() -> (MemoryBackend, MemoryBackend, Locker) {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let m = Locker::new(Migrating::new(Arc::new(old.clone()), Arc::new(new.clone())));
    (old, new, m)
}

/// Records the owner token of every acquisition it passes on.
#[derive(Debug, Clone)]
struct Recording {
    inner: MemoryBackend,
    owners: Arc<Mutex<Vec<crate::raw::OwnerToken>>>,
}

#[async_trait]
impl Backend for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        lock(&self.owners).push(req.owner);
        self.inner.acquire(req).await
    }
}

/// A migrating acquisition that starts again (its old half was lost
/// while it waited for the new one) is a new attempt with an owner
/// token of its own on both backends: a backend's cleanup of the first
/// attempt (a ZooKeeper node sweep by owner, an etcd lease revoked by
/// id) must not reach the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_retry_is_a_new_owner() {
    let old = Recording {
        inner: MemoryBackend::new(),
        owners: Arc::default(),
    };
    let new = Recording {
        inner: MemoryBackend::new(),
        owners: Arc::default(),
    };
    let m = Locker::new(Migrating::new(Arc::new(old.clone()), Arc::new(new.clone())));
    // The new backend is held by someone else: the migrating acquire
    // holds the old half and waits on the new one.
    let blocker = Locker::new(new.inner.clone()).lock("x").await.unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::For(Duration::from_secs(20)));
    let waiting = tokio::spawn(async move { m.acquire("x", &opts).await.map(|g| g.is_some()) });
    let until = std::time::Instant::now() + BOUND;
    while lock(&old.owners).is_empty() || lock(&new.owners).is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "never waited on the new half"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The old half is lost while it waits: the acquisition starts again.
    assert!(old.inner.revoke("x"));
    while lock(&old.owners).len() < 2 {
        assert!(std::time::Instant::now() < until, "never started again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(blocker);
    assert!(waiting.await.unwrap().unwrap(), "acquired in the end");
    let (o, n) = (lock(&old.owners).clone(), lock(&new.owners).clone());
    assert_ne!(
        o[0], o[1],
        "the retry reused the first attempt's owner token"
    );
    assert_eq!(o[0], n[0], "one attempt, one owner on both backends");
    assert_eq!(
        o.last(),
        n.last(),
        "one attempt, one owner on both backends"
    );
}

/// The same store given as old and new (two spellings of one server)
/// is refused by behaviour: a probe name held on the old backend shows
/// held on the new one.
#[tokio::test]
async fn one_store_twice_is_refused() {
    let one = MemoryBackend::new();
    let m = Migrating::new(Arc::new(one.clone()), Arc::new(one.clone()));
    let err = m.verify_distinct().await.expect_err("one store twice");
    assert_eq!(err.kind(), crate::error::ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("same store"), "{err}");
    let distinct = Migrating::new(Arc::new(MemoryBackend::new()), Arc::new(one.clone()));
    distinct.verify_distinct().await.expect("two stores");
    // Another client's probe held on the new store (a stale one, or a
    // client of another migration into it) is no proof of one store.
    let other = Locker::new(one.clone());
    let mut stale = Vec::new();
    for n in 0..16 {
        let name = format!("lockcore-migrate-probe\u{1f}permit-{n:04}");
        stale.push(other.lock(&name).await.unwrap());
    }
    let into_one = Migrating::new(Arc::new(MemoryBackend::new()), Arc::new(one));
    into_one
        .verify_distinct()
        .await
        .expect("two stores, probes held on the new");
}

#[tokio::test]
async fn a_lost_half_fires_lost_and_frees_the_other_half() {
    for old_half in [true, false] {
        let (old, new, m) = pair();
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let g = m.acquire("x", &opts).await.unwrap().unwrap();
        let (lost_on, other) = if old_half { (&old, &new) } else { (&new, &old) };
        assert!(lost_on.revoke("x"));
        tokio::time::timeout(BOUND, g.lost())
            .await
            .expect("lost fires when either half is lost");
        // The other half is freed at once, not after its 30 s ttl.
        let other = Locker::new(other.clone());
        let t = other
            .acquire("x", &LockOptions::new().wait(Wait::For(BOUND)))
            .await
            .unwrap();
        assert!(t.is_some(), "the half still held was not released");
    }
}

#[tokio::test]
async fn a_dropped_acquire_leaves_neither_half() {
    let (old, new, m) = pair();
    let new_only = Locker::new(new.clone());
    let blocker = new_only.lock("x").await.unwrap();
    let waiting = tokio::spawn(async move {
        m.acquire(
            "x",
            &LockOptions::new().wait(Wait::For(Duration::from_secs(60))),
        )
        .await
    });
    // Wait until the migrating client holds the old half and queues on
    // the new backend, then drop its acquire there.
    while Locker::new(old.clone())
        .try_lock("x")
        .await
        .unwrap()
        .is_some()
    {
        tokio::task::yield_now().await;
    }
    waiting.abort();
    let _ = waiting.await;
    let old_only = Locker::new(old.clone());
    let got = old_only
        .acquire("x", &LockOptions::new().wait(Wait::For(BOUND)))
        .await
        .unwrap();
    assert!(got.is_some(), "a dropped acquire left the old half held");
    blocker.release().await.unwrap();
    assert_eq!(
        new.active_names(),
        0,
        "a dropped acquire left a waiter behind"
    );
}

#[tokio::test]
async fn capabilities_are_the_weaker_and_tokens_are_offset() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let m = Migrating::new(Arc::new(old), Arc::new(new)).fence_offset(1000);
    let caps = m.capabilities();
    // The same as either side's, but for the lock-delay: a lost half
    // releases the other at once, which would end a delay early.
    assert_eq!(
        caps,
        MemoryBackend::new()
            .capabilities()
            .lock_delay(crate::LockDelay::Unsupported)
    );
    let l = Locker::new(m);
    let g = l.lock("x").await.unwrap();
    assert!(g.fence().unwrap() > 1000);
    let info = l.inspect("x").await.unwrap().unwrap();
    assert_eq!(
        info.holder.unwrap().fence,
        g.fence(),
        "inspect shows the offset token"
    );
    assert_eq!(
        weaker_fencing(Fencing::Strict, Fencing::None),
        Fencing::None
    );
    // A dead holder's name stays held for the ttl of the half that has
    // one (the pair's connection-kept half ends at once).
    assert_eq!(
        pair_lease(LeaseKind::Ttl, LeaseKind::Connection),
        LeaseKind::Ttl
    );
    assert_eq!(
        pair_lease(LeaseKind::Connection, LeaseKind::Connection),
        LeaseKind::Connection
    );
}

#[tokio::test]
async fn an_overflowing_offset_is_an_error_and_holds_nothing() {
    let (old, new) = (MemoryBackend::new(), MemoryBackend::new());
    let l = Locker::new(
        Migrating::new(Arc::new(old.clone()), Arc::new(new.clone())).fence_offset(u64::MAX),
    );
    let err = l.try_lock("x").await.expect_err("the token overflows");
    assert_eq!(err.kind(), crate::error::ErrorKind::InvalidConfig);
    assert!(Locker::new(old).try_lock("x").await.unwrap().is_some());
    assert!(Locker::new(new).try_lock("x").await.unwrap().is_some());
}

/// The old half lost while the new one is awaited (and taken by an
/// old-only client): the migrating client is not granted the name while
/// the old-only client holds it; it starts again behind it.
#[tokio::test]
async fn an_old_half_lost_while_waiting_is_taken_again() {
    let (old, new, m) = pair();
    let blocker = Locker::new(new.clone()).lock("x").await.unwrap();
    let waiting = tokio::spawn(async move {
        m.acquire(
            "x",
            &LockOptions::new().wait(Wait::For(Duration::from_secs(30))),
        )
        .await
        .unwrap()
        .unwrap()
    });
    let old_only = Locker::new(old.clone());
    while old_only.try_lock("x").await.unwrap().is_some() {
        tokio::task::yield_now().await;
    }
    assert!(old.revoke("x"));
    let o = old_only.lock_timeout("x", BOUND).await.unwrap();
    blocker.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "granted while an old-only client holds the name"
    );
    o.release().await.unwrap();
    let g = tokio::time::timeout(BOUND, waiting).await.unwrap().unwrap();
    assert!(g.is_held());
    assert!(
        old_only.try_lock("x").await.unwrap().is_none(),
        "held on the old backend"
    );
}

/// A wait on the new backend longer than the ttl: the old half is kept
/// renewed meanwhile, and the guard is held on both when granted.
#[tokio::test(start_paused = true)]
async fn the_old_half_is_renewed_while_the_new_is_awaited() {
    let (old, new, m) = pair();
    let blocker = Locker::new(new.clone()).lock("x").await.unwrap();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::For(Duration::from_secs(30)));
    let waiting = tokio::spawn(async move { m.acquire("x", &opts).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    blocker.release().await.unwrap();
    let g = waiting.await.unwrap().unwrap().unwrap();
    assert!(g.is_held(), "granted a guard whose old half had expired");
    assert!(
        Locker::new(old).try_lock("x").await.unwrap().is_none(),
        "the old half expired while the new one was awaited"
    );
}
