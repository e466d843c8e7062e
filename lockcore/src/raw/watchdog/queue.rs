//! The watchdog's timer queue: each watched item's next check, and the
//! tick that keeps the queue from emptying while it is in use.

use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::runtime::Handle;
use tokio_util::time::delay_queue::DelayQueue;

use super::{lock, Watched};

/// An entry of the queue.
pub(super) enum Entry {
    /// The tick: keeps the queue from emptying while it is in use.
    Tick,
    /// A lease's next check.
    Lease(Weak<dyn Watched>),
}

/// The queue and its tick.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) entries: DelayQueue<Entry>,
    /// Whether the tick entry is in the queue.
    pub(super) ticking: bool,
    /// Whether the queue was used since the last tick.
    pub(super) used: bool,
    /// The runtime of the task that polls the queue: its timer is made
    /// there.
    pub(super) rt: Option<Handle>,
    /// The origin of the grid the queue's renewals are put on (its first
    /// put): see [`coalesced`].
    grid: Option<Instant>,
}

impl Queue {
    /// Moves every entry into a new queue, each at its deadline: the
    /// queue's timer belongs to the runtime it was made on, and polling it
    /// after that runtime ended panics. Called with the queue locked, when
    /// the watchdog's task ended and a new one starts, perhaps on another
    /// runtime. Returns the items, to be dropped once the queue is
    /// unlocked (an item's drop may lock it).
    pub(super) fn rebuild(&mut self) -> Vec<Arc<dyn Watched>> {
        // Built aside, the items' keys written only once every entry is
        // in: a panic midway leaves the old queue and keys as they were.
        let old = &mut self.entries;
        let mut new = DelayQueue::with_capacity(old.len());
        let mut items = Vec::with_capacity(old.len());
        while let Some(key) = old.peek() {
            let at = old.deadline(&key);
            if let Entry::Lease(weak) = old.remove(&key).into_inner() {
                if let Some(item) = weak.upgrade() {
                    let key = new.insert_at(Entry::Lease(weak), at);
                    items.push((item, key));
                }
            }
        }
        self.entries = new;
        // The tick lapses; the next lease taken puts it back.
        self.ticking = false;
        items
            .into_iter()
            .map(|(item, key)| {
                *lock(&item.timer().key) = Some(key);
                item
            })
            .collect()
    }

    /// Puts `item` in the queue at `at` ([`coalesced`] as seen at `now`,
    /// clamped to its `not_after`), or moves it there if it is in already.
    /// Called with the queue locked; `now` is read once for all the items
    /// put back together.
    pub(super) fn put(&mut self, item: &Arc<dyn Watched>, at: Instant, now: Instant) {
        // A renewal in the steady state (with at least as long left after
        // it as until it) comes due with others near it; a check near the
        // item's validity deadline (a last try, or the lost signal) keeps
        // its time.
        let not_after = item.not_after();
        let at = if not_after.saturating_duration_since(at) >= at.saturating_duration_since(now) {
            coalesced(at, now, *self.grid.get_or_insert(now))
        } else {
            at
        }
        .min(not_after);
        let mut key = lock(&item.timer().key);
        match key.as_ref() {
            Some(k) => self.entries.reset_at(k, at.into()),
            None => {
                *key = Some(
                    self.entries
                        .insert_at(Entry::Lease(Arc::downgrade(item)), at.into()),
                );
            }
        }
    }
}

/// `at`, moved earlier to the last point of a grid from `origin` (the
/// queue's, so that a run replays exactly): a power of two of
/// milliseconds, at most a twelfth of the time until `at`, 1 to 32 ms;
/// `at` itself when it is less than 12 ms away.
/// Checks due within one grid step come due together, so the watchdog
/// wakes once for them (about 32 times a second for leases renewed every
/// 400 ms or more), not once for each; each is at most a twelfth of its
/// wait early (32 ms of a renewal due in a second). Steps of 64 ms halved
/// the CPU again at 10,000 held but kept more memory in each burst.
pub(super) fn coalesced(at: Instant, now: Instant, origin: Instant) -> Instant {
    let twelfth = at.saturating_duration_since(now).as_millis() / 12;
    // Due within 12 ms: kept (a lease's last check, at its deadline, may
    // be one, and it must not come before the deadline).
    let Ok(step @ 1..) = u64::try_from(twelfth.min(32)) else {
        return at;
    };
    // The largest power of two not above `step`.
    let step = 1u64 << (63 - step.leading_zeros());
    let Some(since) = at.checked_duration_since(origin) else {
        return at;
    };
    let Ok(since_ms) = u64::try_from(since.as_millis()) else {
        return at;
    };
    let back = std::time::Duration::from_millis(since_ms % step)
        + std::time::Duration::from_nanos(u64::from(since.subsec_nanos() % 1_000_000));
    at.checked_sub(back).unwrap_or(at)
}
