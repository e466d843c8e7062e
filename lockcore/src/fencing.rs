//! The fencing gate a guarded resource uses to refuse writes from stale holders.
//!
//! A lock alone cannot stop a holder that paused (GC, swap, a stopped VM)
//! past its lease from writing after the next holder started. The resource
//! can: it remembers the largest fencing token it has seen per name and
//! refuses smaller ones. Client 1 gets token 33, pauses, its lease expires;
//! client 2 gets 34 and writes; client 1 wakes and writes with 33: refused.
//!
//! [`FenceGate`] is that check in memory. The same check in a database is one
//! conditional `UPDATE`, which is atomic with the write itself:
//!
//! ```sql
//! -- the guarded row carries the largest token that wrote it
//! UPDATE accounts
//!    SET balance = ?, fence = ?          -- new value, this holder's token
//!  WHERE id = ? AND fence <= ?;          -- this holder's token again
//! -- 0 rows affected: a newer holder has written; stop and do not retry.
//! ```
//!
//! `<=` lets one holder write several times with its token, as the gate
//! does; use `<` to allow only one write per lease.
//!
//! Only backends whose [`Capabilities::fencing`](crate::capabilities::Capabilities::fencing)
//! is not [`Fencing::None`](crate::capabilities::Fencing::None) give tokens to fence with.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A write carried a token smaller than one the resource has already seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {token} for {name:?}: the resource has seen {largest}")]
pub struct StaleToken {
    /// The lock name.
    pub name: String,
    /// The refused token.
    pub token: u64,
    /// The largest token seen so far.
    pub largest: u64,
}

/// Remembers the largest fencing token seen per name and refuses smaller ones.
///
/// ```
/// use lockcore::fencing::FenceGate;
///
/// let gate = FenceGate::new();
/// gate.check("storage/file", 33).unwrap();   // client 1 writes
/// gate.check("storage/file", 34).unwrap();   // client 2, after client 1's lease expired
/// let err = gate.check("storage/file", 33).unwrap_err(); // client 1 wakes up
/// assert_eq!(err.largest, 34);
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    largest: Mutex<HashMap<String, u64>>,
}

impl FenceGate {
    /// An empty gate.
    pub fn new() -> Self {
        FenceGate::default()
    }

    /// Admits `token` for `name` if it is at least the largest seen, and
    /// remembers it; refuses a smaller one.
    ///
    /// # Errors
    ///
    /// [`StaleToken`] when `token` is below the largest seen for `name`.
    pub fn check(&self, name: &str, token: u64) -> Result<(), StaleToken> {
        let mut map = self.largest.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get_mut(name) {
            Some(largest) if token < *largest => Err(StaleToken {
                name: name.to_owned(),
                token,
                largest: *largest,
            }),
            Some(largest) => {
                *largest = token;
                Ok(())
            }
            None => {
                map.insert(name.to_owned(), token);
                Ok(())
            }
        }
    }

    /// The largest token seen for `name`.
    pub fn largest(&self, name: &str) -> Option<u64> {
        self.largest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .copied()
    }
}
