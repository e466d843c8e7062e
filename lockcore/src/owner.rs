//! One owner's leases by name (reentrancy), and the gate that lets one
//! acquisition of a name through an owner run at a time.
//!
//! Two acquisitions of one name through one owner that race would otherwise
//! both miss the reentrancy check and queue on the server against each
//! other, each waiting for a lease the other will never release. The gate
//! makes the second one wait for the first: if the first got the lease, the
//! second takes another hold on it; if the first failed or was dropped, the
//! second acquires in its turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

use crate::held::Held;
use crate::options::Wait;
use crate::sync::lock;

/// The leases one owner holds, by name, and its acquisitions in flight.
#[derive(Debug, Default)]
pub(crate) struct Owner {
    held: Mutex<HashMap<String, Arc<Held>>>,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

/// One name's gate: its turn, and how many waiting (not `try`)
/// acquisitions are queued for it or hold it: a `try` never waits behind
/// one of those.
#[derive(Debug, Default)]
struct Gate {
    turn: Arc<tokio::sync::Mutex<()>>,
    waiting: AtomicUsize,
}

/// A reference to a gate, the only one its holder keeps; the last one to
/// go removes the gate from the map. A waiting acquisition is counted on the
/// gate for as long as its reference lives.
struct GateRef {
    owner: Arc<Owner>,
    name: String,
    gate: Option<Arc<Gate>>,
    waiting: bool,
}

impl Drop for GateRef {
    fn drop(&mut self) {
        let mut gates = lock(&self.owner.gates);
        // Our reference goes under the lock, where every new one is made:
        // the map's entry then counts exactly the others.
        if let Some(g) = self.gate.take() {
            if self.waiting {
                g.waiting.fetch_sub(1, Ordering::AcqRel);
            }
            drop(g);
        }
        if gates
            .get(&self.name)
            .is_some_and(|g| Arc::strong_count(g) == 1)
        {
            gates.remove(&self.name);
        }
    }
}

/// The turn to acquire a name through an owner; the next acquisition of the
/// name through the owner goes when this is dropped.
pub(crate) struct GatePass {
    _turn: OwnedMutexGuard<()>,
    _gate: GateRef,
}

impl Owner {
    /// Waits for the turn to acquire `name` (cancel safe: a dropped wait
    /// leaves the gate to the others). `None` for a `try` while a waiting
    /// acquisition of `name` through this owner is queued or under way: the
    /// name is contended.
    pub(crate) async fn enter(self: &Arc<Self>, name: &str, wait: Wait) -> Option<GatePass> {
        let waits = wait != Wait::Try;
        let gate = {
            let mut gates = lock(&self.gates);
            let g = gates.entry(name.to_owned()).or_default().clone();
            // A waiting acquisition counts from before it queues.
            if waits {
                g.waiting.fetch_add(1, Ordering::AcqRel);
            }
            GateRef {
                owner: self.clone(),
                name: name.to_owned(),
                gate: Some(g),
                waiting: waits,
            }
        };
        let turn = {
            let g = gate.gate.as_ref()?;
            match g.turn.clone().try_lock_owned() {
                Ok(t) => t,
                // A try does not wait behind a waiting acquisition of the name.
                Err(_) if !waits && g.waiting.load(Ordering::Acquire) > 0 => return None,
                Err(_) => g.turn.clone().lock_owned().await,
            }
        };
        Some(GatePass {
            _turn: turn,
            _gate: gate,
        })
    }

    /// Takes another hold on a live lease of `name`, if this owner has one.
    pub(crate) fn reenter(&self, name: &str) -> Option<Arc<Held>> {
        let mut map = lock(&self.held);
        let held = map.get(name)?;
        if held.is_held() {
            held.holds.fetch_add(1, Ordering::Relaxed);
            Some(held.clone())
        } else {
            map.remove(name);
            None
        }
    }

    pub(crate) fn insert(&self, held: Arc<Held>) {
        lock(&self.held).insert(held.name.clone(), held);
    }

    /// Drops one hold; true when it was the last one (the lease must go).
    pub(crate) fn drop_hold(&self, held: &Arc<Held>) -> bool {
        let mut map = lock(&self.held);
        if held.holds.fetch_sub(1, Ordering::Relaxed) != 1 {
            return false;
        }
        if map.get(&held.name).is_some_and(|h| Arc::ptr_eq(h, held)) {
            map.remove(&held.name);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use async_trait::async_trait;

    use super::*;
    use crate::backend::{AcquireRequest, Backend, Grant};
    use crate::memory::MemoryBackend;
    use crate::{Capabilities, Locker};

    /// The memory server, each acquisition 300 ms slow.
    #[derive(Debug, Clone)]
    struct SlowAcquire(MemoryBackend);

    #[async_trait]
    impl Backend for SlowAcquire {
        fn name(&self) -> &'static str {
            "slow-acquire"
        }

        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }

        async fn acquire(&self, req: AcquireRequest<'_>) -> crate::Result<Option<Grant>> {
            tokio::time::sleep(Duration::from_millis(300)).await;
            self.0.acquire(req).await
        }
    }

    /// One owner: a try in flight, then a lock queued behind it, then a
    /// try. The last try must answer at once (the name is contended), not
    /// queue behind the lock, which waits as long as another owner holds it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_try_never_waits_behind_a_waiting_acquisition() {
        let server = MemoryBackend::new();
        let other = Locker::new(server.clone());
        let held = other.lock("x").await.unwrap();
        let owner = Arc::new(Locker::new(SlowAcquire(server)));
        let first = {
            let o = owner.clone();
            tokio::spawn(async move { o.try_lock("x").await.map(|g| g.is_none()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let waiting = {
            let o = owner.clone();
            tokio::spawn(async move { o.lock("x").await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(3), owner.try_lock("x"))
            .await
            .expect("a try waited behind a waiting acquisition of the same owner");
        assert!(got.unwrap().is_none());
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "the try took {:?}",
            t.elapsed()
        );
        assert!(
            first.await.unwrap().unwrap(),
            "the first try found the name held"
        );
        waiting.abort();
        drop(held);
    }

    /// Gates of names entered concurrently all go once nobody uses them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gates_do_not_pile_up() {
        let owner = Arc::new(Owner::default());
        let mut tasks = Vec::new();
        for t in 0..4 {
            let owner = owner.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..5_000u32 {
                    let name = format!("n{}", (i + t) % 3);
                    let wait = if i % 2 == 0 { Wait::Try } else { Wait::Forever };
                    drop(owner.enter(&name, wait).await);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(lock(&owner.gates).len(), 0, "gates left behind");
    }
}
