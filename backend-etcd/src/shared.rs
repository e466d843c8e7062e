//! Shared leases: at its first renewal, a lock the watchdog renews moves
//! its key from the lease it was granted with onto one lease shared by
//! such locks of the backend with the same ttl (in whole seconds; at most
//! [`PER_LEASE`] a lease), as `concurrency.Session` holds all its mutexes
//! on one lease (the moves are `moves.rs`). Renewals of that lease close
//! together share a keepalive (`keepalive.rs`), and its locks' keys are
//! checked by one read of the lease's keys (`keycheck.rs`), so holding ten
//! thousand locks costs a few keepalives and reads a second, not ten
//! thousand; each lock keeps its own validity and lost signal. A shared
//! lease that ends takes every lock on it along: each one's next renewal
//! finds it gone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockcore::raw::sync::lock;

/// Moves onto one shared lease at most; the next get a new one. One read
/// lists a lease's keys (`keycheck.rs`): with keys of the longest names
/// (about 800 bytes), this keeps it under half the client's 4 MiB message
/// limit.
const PER_LEASE: usize = 2048;

/// The shared lease of each ttl (whole seconds) of one backend, and how
/// many locks moved onto it.
#[derive(Debug, Default)]
pub(crate) struct SharedLeases {
    by_ttl: Mutex<HashMap<u64, (i64, usize)>>,
    /// Held while a shared lease is granted, so that the first renewals of
    /// locks acquired together wait for one grant instead of each making
    /// its own.
    pub(crate) granting: tokio::sync::Mutex<()>,
}

impl SharedLeases {
    /// The lease for the next lock of `ttl_secs`, its place counted now
    /// (a move that then fails keeps it), unless it has enough.
    pub(crate) fn current(&self, ttl_secs: u64) -> Option<i64> {
        let mut by_ttl = lock(&self.by_ttl);
        let (id, moved) = by_ttl.get_mut(&ttl_secs)?;
        (*moved < PER_LEASE).then(|| {
            *moved += 1;
            *id
        })
    }

    /// A new shared lease for `ttl_secs`, its first place taken.
    pub(crate) fn set(&self, ttl_secs: u64, id: i64) {
        lock(&self.by_ttl).insert(ttl_secs, (id, 1));
    }

    /// Forgets `id` (found gone) unless another lease replaced it already.
    pub(crate) fn forget(&self, ttl_secs: u64, id: i64) {
        let mut by_ttl = lock(&self.by_ttl);
        if by_ttl.get(&ttl_secs).map(|e| e.0) == Some(id) {
            by_ttl.remove(&ttl_secs);
        }
    }

    /// Takes the current shared leases (to revoke them when the backend
    /// goes; the earlier ones, full, end by their ttl).
    pub(crate) fn drain(&self) -> Vec<i64> {
        lock(&self.by_ttl).drain().map(|(_, (id, _))| id).collect()
    }
}

/// How old a keepalive of a shared lease a renewal may take the answer of:
/// a twentieth of the holder's ttl (the lease's, less the lock-delay), at
/// most a second. Its validity counts from that keepalive, so it gives up
/// at most that much.
pub(crate) fn fresh(holder_ttl: Duration) -> Duration {
    (holder_ttl / 20).min(Duration::from_secs(1))
}

/// How a move onto the shared lease ended.
pub(crate) enum Moved {
    /// The key is on lease `to`, alive from a keepalive (or grant) sent at
    /// `since`.
    Yes { to: i64, since: Instant },
    /// The key is gone, or is another lock's.
    Gone,
    /// Not moved; `since` is set when it may have been (the request was
    /// sent and its answer lost): the key lives at least as long as a
    /// lease renewed then.
    No { since: Option<Instant> },
}
