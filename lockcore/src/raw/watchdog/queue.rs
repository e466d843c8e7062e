//! The watchdog's timer queue: each watched item's next check, and the
//! tick that keeps the queue from emptying while it is in use.
//!
//! Entries are kept by the millisecond they come due in (a slot): the
//! renewals of many leases fall on one grid point ([`coalesced`]), so a
//! slot holds hundreds of them, and the queue's one timer wakes the
//! watchdog once for them all. An entry lives in a slab, with its slot and
//! its place in the slot's list of keys; removing or moving it takes its
//! key out of that list at once (the last key moves into its place), so
//! the queue holds nothing for an entry once it is gone.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;
use tokio::time::Sleep;

use super::{lock, Watched};

/// An entry of the queue.
pub(super) enum Entry {
    /// The tick: keeps the queue from emptying while it is in use.
    Tick,
    /// A lease's next check.
    Lease(Weak<dyn Watched>),
}

/// An entry's place in the queue: its slab index and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    at: usize,
    generation: u64,
}

/// An entry in the slab: where its key is.
struct Slotted {
    entry: Entry,
    generation: u64,
    /// Its slot, and its place in the slot's keys (meaningless once the
    /// slot was taken: its keys are in `taking` then).
    slot: u64,
    place: usize,
}

/// The queue and its tick.
#[derive(Default)]
pub(super) struct Queue {
    /// The entries.
    entries: Slab<Slotted>,
    /// The keys due in each slot: milliseconds from `origin`, rounded up.
    slots: BTreeMap<u64, Vec<Key>>,
    /// The keys of the slot come due, not yet handed out.
    taking: Vec<Key>,
    /// The last slot taken.
    taken: Option<u64>,
    /// The next entry's generation.
    generation: u64,
    /// The instant slot 0 stands for (the clock at the first insert).
    origin: Option<tokio::time::Instant>,
    /// The timer, due at the slot it was set for (made on the task's
    /// runtime, as it polls the queue).
    timer: Option<(Pin<Box<Sleep>>, u64)>,
    /// The task that found the queue empty: woken by the next insert.
    waker: Option<Waker>,
    /// Whether the tick entry is in the queue.
    pub(super) ticking: bool,
    /// Whether the queue was used since the last tick.
    pub(super) used: bool,
    /// The origin of the grid the queue's renewals are put on (its first
    /// put): see [`coalesced`].
    grid: Option<Instant>,
}

impl Queue {
    /// How many entries it holds.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The slot of `at`: the first millisecond from the origin not before it.
    fn slot_of(&mut self, at: Instant) -> u64 {
        let at = tokio::time::Instant::from_std(at);
        // Slot 0 is the first insert's present: an instant before it is
        // due at once.
        let origin = *self.origin.get_or_insert_with(tokio::time::Instant::now);
        let since = at.saturating_duration_since(origin);
        let ms = since.as_millis() + u128::from(!since.subsec_nanos().is_multiple_of(1_000_000));
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// The instant slot `slot` comes due (the origin is set by then).
    fn due(&self, slot: u64) -> tokio::time::Instant {
        let origin = self.origin.unwrap_or_else(tokio::time::Instant::now);
        // Beyond the clock's range (which no slot of a ttl of at most a
        // day reaches): a day from the origin.
        origin
            .checked_add(Duration::from_millis(slot))
            .unwrap_or(origin + Duration::from_secs(86_400))
    }

    /// Puts `entry` in the queue at `at`; its key.
    pub(super) fn insert(&mut self, entry: Entry, at: Instant) -> Key {
        let slot = self.slot_of(at);
        let generation = self.generation;
        self.generation = self.generation.wrapping_add(1);
        let keys = self.slots.entry(slot).or_default();
        let key = Key {
            at: self.entries.insert(Slotted {
                entry,
                generation,
                slot,
                place: keys.len(),
            }),
            generation,
        };
        keys.push(key);
        // Earlier than the timer is set for: it is set earlier (which
        // needs no wake-up); with no timer, the task that will set one is
        // woken.
        match &mut self.timer {
            Some((_, set)) if slot < *set => {
                *set = slot;
                let due = self.due(slot);
                if let Some((sleep, _)) = &mut self.timer {
                    sleep.as_mut().reset(due);
                }
            }
            Some(_) => {}
            None => {
                if let Some(w) = self.waker.take() {
                    w.wake();
                }
            }
        }
        key
    }

    /// Takes the entry of `key` out, if it is still there, with its key
    /// in its slot (a key already taken out of its slot is passed over by
    /// [`poll_expired`](Queue::poll_expired)).
    pub(super) fn remove(&mut self, key: Key) -> Option<Entry> {
        let (slot, place) = match self.entries.get(key.at) {
            Some(e) if e.generation == key.generation => (e.slot, e.place),
            _ => return None,
        };
        let gone = self.entries.remove(key.at);
        if let Some(keys) = self.slots.get_mut(&slot) {
            // Its slot may have been taken and made again since: only its
            // own key goes.
            if keys.get(place) == Some(&key) {
                keys.swap_remove(place);
                if let Some(moved) = keys.get(place) {
                    if let Some(e) = self.entries.get_mut(moved.at) {
                        e.place = place;
                    }
                }
                if keys.is_empty() {
                    self.slots.remove(&slot);
                }
            }
        }
        Some(gone.entry)
    }

    /// Whether `at` comes due after the slot last taken: put in at `at`,
    /// an entry is not handed out again with that slot's.
    pub(super) fn after_taken(&mut self, at: Instant) -> bool {
        let slot = self.slot_of(at);
        self.taken.is_none_or(|taken| slot > taken)
    }

    /// The next entry come due: `Ready(None)` when the queue is empty (the
    /// next insert wakes the task), `Pending` when none is due yet (the
    /// timer wakes it).
    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<Option<Entry>> {
        loop {
            while let Some(key) = self.taking.pop() {
                // Its slot is gone from the map: the slab entry alone.
                if let Some(e) = self.entries.get(key.at) {
                    if e.generation == key.generation {
                        return Poll::Ready(Some(self.entries.remove(key.at).entry));
                    }
                }
            }
            let Some(&slot) = self.slots.keys().next() else {
                self.timer = None;
                self.waker = Some(cx.waker().clone());
                return Poll::Ready(None);
            };
            let due = self.due(slot);
            let sleep = match &mut self.timer {
                Some((sleep, set)) => {
                    if *set != slot {
                        *set = slot;
                        sleep.as_mut().reset(due);
                    }
                    sleep
                }
                None => {
                    &mut self
                        .timer
                        .insert((Box::pin(tokio::time::sleep_until(due)), slot))
                        .0
                }
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let mut keys = self.slots.remove(&slot).unwrap_or_default();
            // Handed out in the order put in (as far as removals left it).
            keys.reverse();
            self.taking = keys;
            self.taken = Some(slot);
        }
    }

    /// Readies the queue for a new task, perhaps on another runtime: its
    /// timer belongs to the runtime it was made on, and polling it after
    /// that runtime ended panics. The entries stay; the old timer is
    /// returned, to be dropped once the queue is unlocked.
    pub(super) fn rebuild(&mut self) -> Option<Pin<Box<Sleep>>> {
        self.waker = None;
        self.timer.take().map(|(sleep, _)| sleep)
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
        if let Some(old) = key.take() {
            self.remove(old);
        }
        *key = Some(self.insert(Entry::Lease(Arc::downgrade(item)), at));
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

#[cfg(test)]
mod tests;
