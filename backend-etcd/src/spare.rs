//! Spare leases: the leases of locks released cleanly, kept for the next
//! acquisition with the same ttl, so that a lock cycle costs two durable
//! writes (the key's put and delete) instead of four (grant, put, delete,
//! revoke).
//!
//! A lease enters only after the release deleted its key (so nothing is
//! attached to it) and leaves when an acquisition takes it. It is not kept
//! alive while spare: it is taken only while its last known validity has at
//! least one request's time left, and the acquisition that takes it renews
//! it beside the key's put. A spare lease that is never taken ends by its
//! ttl on the server, attached to nothing; the spares left when the backend
//! is dropped are revoked in the background. Abandoned and lost leases, and
//! those of a release that failed or was dropped, never enter.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockcore::raw::sync::lock;

/// At most this many spare leases per ttl; beyond it, a released lease is
/// revoked as before.
const PER_TTL: usize = 64;

/// A lease with nothing attached, and until when it is surely alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spare {
    pub(crate) id: i64,
    pub(crate) valid_until: Instant,
}

/// The spare leases of one backend, by granted ttl in whole seconds.
#[derive(Debug, Default)]
pub(crate) struct SpareLeases {
    by_ttl: Mutex<HashMap<u64, Vec<Spare>>>,
}

impl SpareLeases {
    /// Takes the newest spare lease of `ttl_secs` that stays alive past
    /// `now + margin`, dropping the ones that would not.
    pub(crate) fn take(&self, ttl_secs: u64, now: Instant, margin: Duration) -> Option<Spare> {
        let mut by_ttl = lock(&self.by_ttl);
        let spares = by_ttl.get_mut(&ttl_secs)?;
        spares.retain(|s| s.valid_until > now + margin);
        let spare = spares.pop();
        if spares.is_empty() {
            by_ttl.remove(&ttl_secs);
        }
        spare
    }

    /// Keeps `spare` for the next acquisition with `ttl_secs`; `false` when
    /// there are enough already (the caller revokes it).
    pub(crate) fn put(&self, ttl_secs: u64, spare: Spare) -> bool {
        let now = Instant::now();
        let mut by_ttl = lock(&self.by_ttl);
        let spares = by_ttl.entry(ttl_secs).or_default();
        spares.retain(|s| s.valid_until > now);
        if spares.len() >= PER_TTL {
            return false;
        }
        spares.push(spare);
        true
    }

    /// Takes every spare lease (to revoke them when the backend goes).
    pub(crate) fn drain(&self) -> Vec<i64> {
        let mut by_ttl = lock(&self.by_ttl);
        by_ttl.drain().flat_map(|(_, v)| v).map(|s| s.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_leases_alive_past_the_margin() {
        let pool = SpareLeases::default();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        assert!(pool.put(
            5,
            Spare {
                id: 1,
                valid_until: now + s
            }
        ));
        assert!(pool.put(
            5,
            Spare {
                id: 2,
                valid_until: now + 3 * s
            }
        ));
        assert_eq!(pool.take(4, now, s), None, "another ttl");
        assert_eq!(pool.take(5, now, 2 * s).map(|s| s.id), Some(2));
        assert_eq!(pool.take(5, now, Duration::ZERO), None, "1 was dropped");
    }

    #[test]
    fn holds_a_bounded_number() {
        let pool = SpareLeases::default();
        let until = Instant::now() + Duration::from_secs(9);
        for id in 0..PER_TTL as i64 {
            assert!(pool.put(
                1,
                Spare {
                    id,
                    valid_until: until
                }
            ));
        }
        assert!(!pool.put(
            1,
            Spare {
                id: -1,
                valid_until: until
            }
        ));
        assert!(pool.put(
            2,
            Spare {
                id: -1,
                valid_until: until
            }
        ));
    }
}
