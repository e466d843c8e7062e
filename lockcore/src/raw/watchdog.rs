//! The watchdog: one timer queue per backend handle, and one task that runs
//! due leases' checks.
//!
//! A lease costs a queue entry, not a task: taking and releasing it is a
//! queue insert and remove, and 10,000 held leases are 10,000 entries. When
//! entries come due, the watchdog's task takes every one due at once and
//! runs each lease's own [`check`](Watched::check) (renew, or raise the
//! lost signal) among its own futures, concurrently, with no task spawned
//! per check; as checks finish, their leases go back in the queue for the
//! instant each asks for, together under one lock. A check that panics
//! ends its own lease's watch only: it is caught, and the lease is told
//! ([`Watched::check_panicked`]: a held lease raises its lost signal).
//! A check the item can do at once ([`Watched::check_now`]: a renewal its
//! backend answers from a keepalive and a read that serve many leases or
//! makes in place, or one the backend's own task answers, many to a server
//! call) makes no future at all.
//!
//! The checks are polled outside tokio's cooperative budget (they are many
//! tasks' worth of work in one task, which would otherwise share one
//! task's budget and finish a few dozen checks a turn); the task instead
//! lets other tasks run after every [`FINISHED_PER_PASS`] finished checks
//! and [`DUE_PER_PASS`] started ones.
//!
//! **Waking the queue's task.** The queue's timer is set for its first
//! slot (`queue.rs`): an insert due earlier moves the timer, and one into
//! a queue with no timer (the task found it empty) wakes the task at once.
//! With one task taking and releasing a lock in a loop, that would be a
//! wake-up of the watchdog's task (often on the other worker thread) per
//! lock cycle. So while leases come and go, the queue holds a tick entry
//! due within [`TICK`]: a lease's first check comes later than that (a
//! third of a ttl of at least a second), so inserting it wakes no one, and
//! the tick keeps the queue from emptying. The tick renews itself while
//! leases were taken since the last one, and lapses after a quiet
//! [`TICK`]; renewals alone do not keep it.
//!
//! The queue knows leases only as [`Watched`]: the renewal policy lives with
//! the lease state (`held.rs`). Leases keep their watchdog alive (a strong
//! reference each), so it runs as long as any lease or handle needs it and
//! not longer.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use checks::{start_check, Running};
use futures_util::stream::{FuturesUnordered, StreamExt};
use queue::{Entry, Key, Queue};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

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
    /// Called with the queue unlocked, in the watchdog's task (a panic in
    /// making the future ends this item's watch only); it should only make
    /// the future, and the future may call back into the watchdog. The future runs in the
    /// watchdog's task outside tokio's cooperative budget, beside every
    /// other check: it must not loop on ready resources without yielding.
    fn check(self: Arc<Self>) -> CheckFuture;
    /// The check done at once, when it needs no waiting: `Some` with what
    /// [`check`](Watched::check)'s future would return (`Some(None)` also
    /// when the item put itself back in the queue), `None` when that
    /// future must run. Called with the queue unlocked, in the watchdog's
    /// task. The default never answers.
    fn check_now(self: Arc<Self>) -> Option<Option<Instant>> {
        None
    }
    /// Where it stays in the queue while its check runs, put there as it
    /// comes due (under the queue's lock, with the others due then):
    /// `Some` for a check whose answer comes later from elsewhere, which
    /// moves it on (a renewal a backend's task answers), so that the item
    /// is looked at there if no answer comes (not when that instant has
    /// come: the check is then the look). The default: `None`, out of the
    /// queue until its check ends.
    fn while_checked(&self) -> Option<Instant> {
        None
    }
    /// Its check panicked: it is no longer watched.
    fn check_panicked(&self);
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

/// How many other runtimes a watchdog remembers to start again on.
const ELSEWHERE: usize = 8;

/// The watchdog's task and the runtime it runs on.
struct Runner {
    task: JoinHandle<()>,
    rt: Handle,
}

/// The timer queue of one backend handle.
#[derive(Default)]
pub(crate) struct Watchdog {
    queue: Mutex<Queue>,
    runner: Mutex<Option<Runner>>,
    /// The runtimes schedules came from other than the task's, the latest
    /// first: where the task starts again when its own runtime ends
    /// (runtimes side by side, as tests are).
    elsewhere: Mutex<Vec<Handle>>,
    /// Items whose checks were running when the watchdog's task ended
    /// without finishing them (its runtime shut down, or it panicked): the
    /// next task puts them back in the queue at once.
    orphans: Mutex<Vec<Weak<dyn Watched>>>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // No lease and no handle is left: the task, idle, would wait
        // forever for an insert.
        if let Some(runner) = lock(&self.runner).take() {
            runner.task.abort();
        }
    }
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("entries", &lock(&self.queue).len())
            .finish()
    }
}

impl Watchdog {
    /// (Re)schedules the next check of `item` at `at`. `new` is true for a
    /// lease just taken: that is the queue's use the tick is kept for (a
    /// renewal's reschedule does not keep it).
    pub(crate) fn schedule(self: &Arc<Self>, item: &Arc<dyn Watched>, at: Instant, new: bool) {
        if let Ok(here) = Handle::try_current() {
            let task_rt = lock(&self.runner).as_ref().map(|r| r.rt.id());
            if task_rt.is_some_and(|id| id != here.id()) {
                let mut list = lock(&self.elsewhere);
                list.retain(|h| h.id() != here.id());
                list.insert(0, here);
                list.truncate(ELSEWHERE);
            }
        }
        {
            // (The queue's timer is made by its task, on the task's
            // runtime: an insert only moves it, which needs no runtime.)
            let mut queue = lock(&self.queue);
            let now = crate::raw::now();
            if new {
                queue.used = true;
            }
            if new && !queue.ticking {
                queue.ticking = true;
                queue.insert(Entry::Tick, now + TICK);
            }
            queue.put(item, at, now);
        }
        self.ensure_running();
    }

    /// Puts each item back in the queue at its next check (`None`: stops
    /// watching it), all under one lock; `now` is read once for them all
    /// (the answers of one reply, see [`Answers`](crate::raw::Answers)).
    pub(crate) fn put_all(
        self: &Arc<Self>,
        items: impl Iterator<Item = (Arc<dyn Watched>, Option<Instant>)>,
        now: Instant,
    ) {
        let mut dropped = Vec::new();
        {
            let mut queue = lock(&self.queue);
            for (item, next) in items {
                match next {
                    Some(at) => queue.put(&item, at, now),
                    None => {
                        if let Some(k) = lock(&item.timer().key).take() {
                            queue.remove(k);
                        }
                    }
                }
                // Dropped outside the lock: an item's drop may do anything.
                dropped.push(item);
            }
        }
        drop(dropped);
        self.ensure_running();
    }

    /// Stops watching the item whose timer this is.
    pub(crate) fn forget(&self, timer: &Timer) {
        // Queue first, then key, as everywhere: a key is live in the queue
        // exactly while it is `Some`, under the queue's lock.
        let mut queue = lock(&self.queue);
        if let Some(k) = lock(&timer.key).take() {
            queue.remove(k);
        }
    }

    /// Starts the watchdog's task on the current runtime unless it runs.
    /// A task that ended (its runtime shut down, or it panicked) leaves a
    /// queue whose timer may belong to a runtime that is gone: the queue
    /// is rebuilt for the new task.
    fn ensure_running(self: &Arc<Self>) {
        if let Ok(here) = Handle::try_current() {
            self.start_on(&here, false);
        }
    }

    /// Starts the task on `rt` unless it runs; `replacing`: the task is
    /// ending (its future is being dropped) and is replaced regardless.
    /// Returns whether a task runs then (not if `rt` had shut down).
    fn start_on(self: &Arc<Self>, rt: &Handle, replacing: bool) -> bool {
        let mut runner = lock(&self.runner);
        if let Some(r) = runner.as_ref() {
            if !replacing && !r.task.is_finished() {
                return true;
            }
        }
        let old_timer = { lock(&self.queue).rebuild() };
        // A runtime that shut down drops the task inside `spawn`: its drop
        // guard must not start another then (this holds the runner lock).
        let started = Arc::new(AtomicBool::new(false));
        let task = rt.spawn(run(Arc::downgrade(self), started.clone()));
        started.store(true, Ordering::Release);
        let runs = !task.is_finished();
        *runner = Some(Runner {
            task,
            rt: rt.clone(),
        });
        drop(runner);
        drop(old_timer);
        runs
    }

    /// The task is ending without the watchdog (its runtime shut down, or
    /// it panicked): it starts again on the runtime another schedule came
    /// from, if any, so that the leases taken there are still renewed.
    fn carry_on_elsewhere(self: &Arc<Self>) {
        let ending = lock(&self.runner).as_ref().map(|r| r.rt.id());
        loop {
            let next = {
                let mut list = lock(&self.elsewhere);
                list.retain(|h| Some(h.id()) != ending);
                if list.is_empty() {
                    return;
                }
                list.remove(0)
            };
            if self.start_on(&next, true) {
                return;
            }
            // That runtime has ended too: the next one.
        }
    }
}

/// How many due entries one pass of the watchdog's task starts before it
/// lets other tasks run.
const DUE_PER_PASS: usize = 512;

/// How many finished checks one pass of the watchdog's task takes before
/// it lets other tasks run.
const FINISHED_PER_PASS: usize = 512;

/// The checks running in the watchdog's task, and the items of finished
/// ones not yet back in the queue. Dropped with some left (the task ended
/// without finishing them: its runtime shut down, or it panicked), it
/// hands those items to the next task ([`Watchdog::orphans`]): their
/// queue entries are spent, so nothing else would ever check them again.
struct Checks {
    running: FuturesUnordered<Running>,
    again: Vec<(Arc<dyn Watched>, Instant)>,
    /// Items come due, their checks not yet started.
    due: Vec<Arc<dyn Watched>>,
    watchdog: Weak<Watchdog>,
    /// Set once `spawn` returned (see [`Watchdog::start_on`]).
    started: Arc<AtomicBool>,
}

impl Drop for Checks {
    fn drop(&mut self) {
        let Some(wd) = self.watchdog.upgrade() else {
            return;
        };
        {
            let mut orphans = lock(&wd.orphans);
            orphans.extend(self.running.iter().map(|r| Arc::downgrade(&r.item)));
            orphans.extend(self.again.iter().map(|(item, _)| Arc::downgrade(item)));
            orphans.extend(self.due.iter().map(Arc::downgrade));
        }
        if self.started.load(Ordering::Acquire) {
            wd.carry_on_elsewhere();
        }
    }
}

/// Runs due items' checks until the watchdog is gone and no check runs.
/// The drop guard is made before the first poll: a task dropped unpolled
/// (its runtime shut down) hands over too.
fn run(watchdog: Weak<Watchdog>, started: Arc<AtomicBool>) -> impl Future<Output = ()> + Send {
    let mut checks = Checks {
        running: FuturesUnordered::new(),
        again: Vec::new(),
        due: Vec::new(),
        watchdog: watchdog.clone(),
        started,
    };
    let mut first = true;
    poll_fn(move |cx| {
        let Checks {
            running,
            again,
            due,
            ..
        } = &mut checks;
        if std::mem::take(&mut first) {
            // What an earlier task left running: checked at once.
            if let Some(wd) = watchdog.upgrade() {
                let orphans = std::mem::take(&mut *lock(&wd.orphans));
                let now = crate::raw::now();
                again.extend(orphans.iter().filter_map(Weak::upgrade).map(|it| (it, now)));
            }
        }
        // Finished checks first: their items go back in the queue below.
        let mut finished = 0;
        while finished < FINISHED_PER_PASS {
            let Poll::Ready(Some((item, next))) = running.poll_next_unpin(cx) else {
                break;
            };
            finished += 1;
            if let Some(next) = next {
                again.push((item, next));
            }
        }
        let Some(wd) = watchdog.upgrade() else {
            // No handle and no lease (the watchdog's drop aborts this
            // task besides): the checks still running finish.
            return if running.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending
            };
        };
        let mut queue = lock(&wd.queue);
        // The clock, read once a pass if at all.
        let mut now = None;
        if !again.is_empty() {
            let now = *now.get_or_insert_with(crate::raw::now);
            for (item, next) in again.iter() {
                queue.put(item, *next, now);
            }
        }
        // The entries due now (up to a pass's worth), each check started.
        let mut started = 0;
        while started < DUE_PER_PASS {
            match queue.poll_expired(cx) {
                // Empty (the next insert wakes this task), or nothing due.
                Poll::Ready(None) | Poll::Pending => break,
                Poll::Ready(Some(expired)) => match expired {
                    Entry::Tick => {
                        // Renewed while the queue is in use; a quiet tick
                        // lapses (the queue may empty then).
                        if std::mem::take(&mut queue.used) {
                            let now = *now.get_or_insert_with(crate::raw::now);
                            queue.insert(Entry::Tick, now + TICK);
                        } else {
                            queue.ticking = false;
                        }
                    }
                    Entry::Lease(weak) => {
                        if let Some(item) = weak.upgrade() {
                            // The key is spent: clear it before the queue
                            // can hand the same key to another item.
                            *lock(&item.timer().key) = None;
                            if let Some(at) = item.while_checked() {
                                // Not for a check at (or past) that instant
                                // itself: it would come due again at once.
                                // (`now` may have been read before this
                                // slot came due: the slot is the bound.)
                                let now = *now.get_or_insert_with(crate::raw::now);
                                if at > now && queue.after_taken(at) {
                                    queue.put(&item, at, now);
                                }
                            }
                            due.push(item);
                            started += 1;
                        }
                    }
                },
            }
        }
        drop(queue);
        // Outside the lock: an item whose last reference this was is
        // dropped here, and its drop may do anything.
        again.clear();
        // Outside the lock too: a check done at once calls into its item.
        // Its next check goes in the queue in the next pass.
        // One at a time: an item not yet started when this task ends (a
        // panic) is still in `due`, handed to the next task.
        while let Some(item) = due.pop() {
            start_check(item, running, again);
        }
        if started > 0 || finished == FINISHED_PER_PASS {
            // Checks just started are polled (and the rest of what is due
            // or finished, and the checks done at once, taken) in the next
            // pass, after other tasks had their turn.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    })
}

mod checks;
mod queue;
#[cfg(test)]
mod tests;
