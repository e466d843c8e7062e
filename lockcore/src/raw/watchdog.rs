//! The watchdog: one timer queue per backend handle, and one task that hands
//! due leases their check.
//!
//! A lease costs a queue entry, not a task: taking and releasing it is a
//! queue insert and remove, and 10,000 held leases are 10,000 entries. When
//! an entry comes due, a short task runs the lease's own
//! [`check`](Watched::check) (renew, or raise the lost signal) and puts the
//! lease back in the queue for the instant the check asks for.
//!
//! **Waking the queue's task.** A queue wakes its task when an insert is
//! due before everything in it, and when a removal empties it: with one
//! task taking and releasing a lock in a loop, that would be two wake-ups
//! of the watchdog's task (often on the other worker thread) per lock
//! cycle. So while leases come and go, the queue holds a tick entry due
//! within [`TICK`]: a lease's first check comes later than that (a third of
//! a ttl of at least a second), so inserting it wakes no one, and the tick
//! keeps the queue from emptying. The tick renews itself while leases were
//! taken since the last one, and lapses after a quiet [`TICK`]; renewals
//! alone do not keep it.
//!
//! The queue knows leases only as [`Watched`]: the renewal policy lives with
//! the lease state (`held.rs`). Leases keep their watchdog alive (a strong
//! reference each), so it runs as long as any lease or handle needs it and
//! not longer.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::time::delay_queue::{DelayQueue, Key};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The future of one check: when to check again, or `None` to stop.
pub(crate) type CheckFuture = Pin<Box<dyn Future<Output = Option<Instant>> + Send>>;

/// Something the watchdog checks when it comes due.
pub(crate) trait Watched: Send + Sync + 'static {
    /// Its place in the queue.
    fn timer(&self) -> &Timer;
    /// One check; returns when to check again, or `None` to stop watching.
    fn check(self: Arc<Self>) -> CheckFuture;
    /// The latest instant it may be checked next (its validity deadline):
    /// every schedule is clamped to it, so a check scheduled from an older
    /// reading never postpones one that a shortened deadline asked for.
    fn not_after(&self) -> Instant;
}

/// A watched item's place in the queue.
#[derive(Debug, Default)]
pub(crate) struct Timer {
    key: Mutex<Option<Key>>,
}

/// How far ahead the tick entry is due (see the module docs).
pub(crate) const TICK: Duration = Duration::from_millis(200);

/// An entry of the queue.
enum Entry {
    /// The tick: keeps the queue from emptying while it is in use.
    Tick,
    /// A lease's next check.
    Lease(Weak<dyn Watched>),
}

/// The queue and its tick.
#[derive(Default)]
struct Queue {
    entries: DelayQueue<Entry>,
    /// Whether the tick entry is in the queue.
    ticking: bool,
    /// Whether the queue was used since the last tick.
    used: bool,
}

/// The timer queue of one backend handle.
#[derive(Default)]
pub(crate) struct Watchdog {
    queue: Mutex<Queue>,
    runner: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("entries", &lock(&self.queue).entries.len())
            .finish()
    }
}

impl Watchdog {
    /// (Re)schedules the next check of `item` at `at`. `new` is true for a
    /// lease just taken: that is the queue's use the tick is kept for (a
    /// renewal's reschedule does not keep it).
    pub(crate) fn schedule(self: &Arc<Self>, item: &Arc<dyn Watched>, at: Instant, new: bool) {
        {
            let mut queue = lock(&self.queue);
            if new {
                queue.used = true;
            }
            if new && !queue.ticking {
                queue.ticking = true;
                let tick = tokio::time::Instant::now() + TICK;
                queue.entries.insert_at(Entry::Tick, tick);
            }
            let at = at.min(item.not_after());
            let mut key = lock(&item.timer().key);
            match key.as_ref() {
                Some(k) => queue.entries.reset_at(k, at.into()),
                None => {
                    *key = Some(
                        queue
                            .entries
                            .insert_at(Entry::Lease(Arc::downgrade(item)), at.into()),
                    );
                }
            }
        }
        self.ensure_running();
    }

    /// Stops watching the item whose timer this is.
    pub(crate) fn forget(&self, timer: &Timer) {
        // Queue first, then key, as everywhere: a key is live in the queue
        // exactly while it is `Some`, under the queue's lock.
        let mut queue = lock(&self.queue);
        if let Some(k) = lock(&timer.key).take() {
            queue.entries.try_remove(&k);
        }
    }

    fn ensure_running(self: &Arc<Self>) {
        let mut runner = lock(&self.runner);
        if runner.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        *runner = Some(tokio::spawn(run(Arc::downgrade(self))));
    }
}

/// Hands due items to their checks until the watchdog is gone.
async fn run(watchdog: Weak<Watchdog>) {
    loop {
        let due = poll_fn(|cx| {
            let Some(wd) = watchdog.upgrade() else {
                return Poll::Ready(None);
            };
            let mut queue = lock(&wd.queue);
            loop {
                match queue.entries.poll_expired(cx) {
                    // Empty: the next insert wakes this task.
                    Poll::Ready(None) => return Poll::Pending,
                    Poll::Ready(Some(expired)) => match expired.into_inner() {
                        Entry::Tick => {
                            // Renewed while the queue is in use; a quiet
                            // tick lapses (the queue may empty then).
                            if std::mem::take(&mut queue.used) {
                                let tick = tokio::time::Instant::now() + TICK;
                                queue.entries.insert_at(Entry::Tick, tick);
                            } else {
                                queue.ticking = false;
                            }
                        }
                        Entry::Lease(weak) => {
                            let item = weak.upgrade();
                            if let Some(it) = &item {
                                // The key is spent: clear it before the queue
                                // can hand the same key to another item.
                                *lock(&it.timer().key) = None;
                            }
                            return Poll::Ready(Some((wd.clone(), item)));
                        }
                    },
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
        let Some((wd, item)) = due else {
            return;
        };
        let Some(item) = item else {
            continue;
        };
        tokio::spawn(async move {
            if let Some(next) = item.clone().check().await {
                wd.schedule(&item, next, false);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::locker::Locker;
    use crate::options::{LockOptions, Wait};

    /// Leases held with renewal stay held while many short leases come and
    /// go through the same queue (keys are reused by the queue: a stale key
    /// must never remove another lease's entry).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn held_leases_survive_churn() {
        let locker = Locker::memory();
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Wait::Try);
        let mut held = Vec::new();
        for i in 0..50 {
            held.push(
                locker
                    .acquire(&format!("held/{i}"), &opts)
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        let churn = {
            let locker = locker.clone();
            tokio::spawn(async move {
                let until = std::time::Instant::now() + Duration::from_millis(2500);
                let mut n = 0u64;
                while std::time::Instant::now() < until {
                    let g = locker
                        .acquire(&format!("churn/{}", n % 64), &opts)
                        .await
                        .unwrap()
                        .unwrap();
                    g.release().await.unwrap();
                    n += 1;
                }
                n
            })
        };
        let pairs = churn.await.unwrap();
        assert!(pairs > 1000, "only {pairs} pairs");
        for g in &held {
            assert!(g.is_held(), "{}: {:?}", g.name(), g.lost_reason());
        }
    }
}
