//! A history of leases and a checker that proves a run was safe.
//!
//! Record every acquisition and every end of a lease with this process's
//! monotonic clock; [`History::check`] then proves that no two valid leases
//! on a name overlapped and that fencing tokens rose strictly in acquisition
//! order. The acquire time is taken after the backend granted the lease and
//! the end time before the release is sent (or when the lease was lost), so
//! the recorded intervals lie inside the server's: an overlap seen here is a
//! real one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::guard::LockGuard;

/// One lease in a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The lock name.
    pub name: String,
    /// The lease's fencing token.
    pub fence: Option<u64>,
    /// When the acquisition returned.
    pub acquired: Instant,
    /// When the lease ended (release sent, or lost), if it has.
    pub ended: Option<Instant>,
}

/// A record's place in a [`History`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordId(usize);

/// What a check found wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// Two leases on one name were valid at the same time.
    #[error("leases on {name:?} overlapped: fence {first:?} still valid {overlap:?} into fence {second:?}")]
    Overlap {
        /// The lock name.
        name: String,
        /// The earlier lease's token.
        first: Option<u64>,
        /// The later lease's token.
        second: Option<u64>,
        /// How long both were valid.
        overlap: Duration,
    },
    /// A later lease got a token that is not larger.
    #[error("fencing tokens on {name:?} did not rise: {earlier} was followed by {later}")]
    FenceNotIncreasing {
        /// The lock name.
        name: String,
        /// The earlier lease's token.
        earlier: u64,
        /// The later lease's token.
        later: u64,
    },
}

/// What a successful check covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Leases checked.
    pub leases: usize,
    /// Distinct names.
    pub names: usize,
}

/// A recorder of leases, cheap to clone and share between tasks.
///
/// ```
/// use lockcore::{testing::history::History, Locker};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockcore::Result<()> {
/// let history = History::new();
/// let locker = Locker::memory();
/// for _ in 0..3 {
///     let g = locker.lock("counter").await?;
///     let id = history.acquired(&g);
///     // ... guarded work ...
///     history.ended(id, &g);
///     g.release().await?;
/// }
/// let summary = history.check().expect("safe");
/// assert_eq!(summary.leases, 3);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct History {
    records: Arc<Mutex<Vec<LeaseRecord>>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        History::default()
    }

    fn records(&self) -> std::sync::MutexGuard<'_, Vec<LeaseRecord>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `guard` was just acquired.
    pub fn acquired(&self, guard: &LockGuard) -> RecordId {
        self.record(guard.name(), guard.fence(), crate::raw::now(), None)
    }

    /// Records that the lease of `guard` ends now (call it before releasing),
    /// or ended earlier if it was lost.
    pub fn ended(&self, id: RecordId, guard: &LockGuard) {
        let end = guard.validity_end(crate::raw::now());
        if let Some(r) = self.records().get_mut(id.0) {
            r.ended = Some(end);
        }
    }

    /// Adds a record as it is (for histories gathered elsewhere).
    pub fn record(
        &self,
        name: &str,
        fence: Option<u64>,
        acquired: Instant,
        ended: Option<Instant>,
    ) -> RecordId {
        let mut records = self.records();
        records.push(LeaseRecord {
            name: name.to_owned(),
            fence,
            acquired,
            ended,
        });
        RecordId(records.len() - 1)
    }

    /// A copy of the records.
    pub fn snapshot(&self) -> Vec<LeaseRecord> {
        self.records().clone()
    }

    /// Proves that no two leases on a name overlapped (a lease that has not
    /// ended overlaps every later one) and that fencing tokens rose strictly
    /// in acquisition order. A lease that ended no later than it was
    /// acquired (its grant arrived after its validity deadline, so it was
    /// never trusted) is left out.
    ///
    /// # Errors
    ///
    /// The first [`Violation`] found.
    pub fn check(&self) -> Result<Summary, Violation> {
        check(&self.snapshot())
    }
}

/// [`History::check`] over a list of records.
///
/// # Errors
///
/// The first [`Violation`] found.
pub fn check(records: &[LeaseRecord]) -> Result<Summary, Violation> {
    let mut by_name: HashMap<&str, Vec<&LeaseRecord>> = HashMap::new();
    for r in records {
        // A lease whose validity had passed before its grant arrived was
        // never trusted: it cannot overlap anything.
        if r.ended.is_some_and(|e| e <= r.acquired) {
            continue;
        }
        by_name.entry(&r.name).or_default().push(r);
    }
    for (name, leases) in &mut by_name {
        leases.sort_by_key(|r| r.acquired);
        let mut latest_end: Option<(Option<Instant>, Option<u64>)> = None;
        let mut last_fence: Option<u64> = None;
        for r in leases.iter() {
            if let Some((end, first)) = latest_end {
                let overlap = match end {
                    None => Some(Duration::MAX),
                    Some(e) if e > r.acquired => Some(e - r.acquired),
                    Some(_) => None,
                };
                if let Some(overlap) = overlap {
                    return Err(Violation::Overlap {
                        name: (*name).to_owned(),
                        first,
                        second: r.fence,
                        overlap,
                    });
                }
            }
            if let (Some(earlier), Some(later)) = (last_fence, r.fence) {
                if later <= earlier {
                    return Err(Violation::FenceNotIncreasing {
                        name: (*name).to_owned(),
                        earlier,
                        later,
                    });
                }
            }
            last_fence = r.fence.or(last_fence);
            latest_end = match latest_end {
                Some((Some(prev), f)) if r.ended.is_some_and(|e| e < prev) => Some((Some(prev), f)),
                _ => Some((r.ended, r.fence)),
            };
        }
    }
    Ok(Summary {
        leases: records.len(),
        names: by_name.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, fence: u64, from: u64, to: u64, base: Instant) -> LeaseRecord {
        LeaseRecord {
            name: name.into(),
            fence: Some(fence),
            acquired: base + Duration::from_millis(from),
            ended: Some(base + Duration::from_millis(to)),
        }
    }

    #[test]
    fn accepts_a_safe_history() {
        let t = Instant::now();
        let h = [
            rec("a", 1, 0, 10, t),
            rec("a", 2, 10, 20, t),
            rec("b", 1, 5, 30, t),
        ];
        assert_eq!(
            check(&h),
            Ok(Summary {
                leases: 3,
                names: 2
            })
        );
    }

    #[test]
    fn finds_overlap_and_falling_tokens() {
        let t = Instant::now();
        let overlap = [rec("a", 1, 0, 10, t), rec("a", 2, 9, 20, t)];
        assert!(matches!(check(&overlap), Err(Violation::Overlap { .. })));
        let nested = [
            rec("a", 1, 0, 100, t),
            rec("a", 2, 10, 20, t),
            rec("a", 3, 30, 40, t),
        ];
        assert!(matches!(check(&nested), Err(Violation::Overlap { .. })));
        let falling = [rec("a", 2, 0, 10, t), rec("a", 2, 10, 20, t)];
        assert!(matches!(
            check(&falling),
            Err(Violation::FenceNotIncreasing { .. })
        ));
        let open = [
            LeaseRecord {
                ended: None,
                ..rec("a", 1, 0, 0, t)
            },
            rec("a", 2, 10, 20, t),
        ];
        assert!(matches!(check(&open), Err(Violation::Overlap { .. })));
    }

    #[test]
    fn a_lease_never_valid_overlaps_nothing() {
        let t = Instant::now();
        // Fence 1's grant arrived after fence 2 had been granted and after
        // its own validity deadline: it was never trusted.
        let late = [rec("a", 2, 0, 100, t), rec("a", 1, 50, 40, t)];
        assert!(check(&late).is_ok());
    }
}
