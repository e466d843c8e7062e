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
use std::sync::atomic::{AtomicBool, Ordering};
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

/// One name's gate: its turn, and whether the acquisition holding the turn
/// waits (a `try` does not wait behind one that does).
#[derive(Debug, Default)]
struct Gate {
    turn: Arc<tokio::sync::Mutex<()>>,
    waits: AtomicBool,
}

/// A reference to a gate; the last one to go removes the gate from the map.
struct GateRef {
    owner: Arc<Owner>,
    name: String,
    gate: Arc<Gate>,
}

impl Drop for GateRef {
    fn drop(&mut self) {
        let mut gates = lock(&self.owner.gates);
        // The map's reference and ours: nobody else waits on this gate, and
        // new references are only made under this lock.
        if Arc::strong_count(&self.gate) == 2
            && gates
                .get(&self.name)
                .is_some_and(|g| Arc::ptr_eq(g, &self.gate))
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
    /// leaves the gate to the others). `None` for a `try` while another
    /// acquisition of `name` through this owner is waiting: the name is
    /// contended.
    pub(crate) async fn enter(self: &Arc<Self>, name: &str, wait: Wait) -> Option<GatePass> {
        let gate = {
            let mut gates = lock(&self.gates);
            GateRef {
                owner: self.clone(),
                name: name.to_owned(),
                gate: gates.entry(name.to_owned()).or_default().clone(),
            }
        };
        let turn = match gate.gate.turn.clone().try_lock_owned() {
            Ok(t) => t,
            Err(_) if wait == Wait::Try && gate.gate.waits.load(Ordering::Acquire) => return None,
            Err(_) => gate.gate.turn.clone().lock_owned().await,
        };
        gate.gate.waits.store(wait != Wait::Try, Ordering::Release);
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
