//! The watchdog: renews leases at about ttl/3 and raises their lost signal.
//!
//! One timer queue per backend handle (shared by a `Locker` and its clones)
//! and one task that waits on it, instead of a task per lease: taking and
//! releasing a lease costs a queue insert and remove, and 10,000 held leases
//! cost 10,000 queue entries. When an entry comes due, a short task renews
//! the lease (or raises the lost signal when the validity deadline has
//! passed) and schedules the next check. A failed renewal is retried with
//! jittered backoff while the lease is still valid; a refused one, or a
//! backend report that the lease is gone, raises the lost signal.

use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::time::delay_queue::{DelayQueue, Key};

use crate::error::ErrorKind;
use crate::guard::Held;
use crate::retry::Backoff;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A lease's place in the watchdog.
#[derive(Debug, Default)]
pub(crate) struct Timer {
    key: Mutex<Option<Key>>,
    failures: AtomicU32,
}

/// The timer queue of one backend handle.
#[derive(Default)]
pub(crate) struct Watchdog {
    queue: Mutex<DelayQueue<Weak<Held>>>,
    runner: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("leases", &lock(&self.queue).len())
            .finish()
    }
}

/// The queue's resolution is a millisecond and may fire up to one early:
/// deadlines checked for having passed are scheduled this much later.
const TIMER_SLACK: Duration = Duration::from_millis(1);

fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

impl Watchdog {
    /// Watches a newly granted lease.
    pub(crate) fn watch(self: &Arc<Self>, held: &Arc<Held>) {
        let first = if held.renew {
            (Instant::now() + renew_interval(held.ttl())).min(held.valid_until())
        } else {
            held.valid_until() + TIMER_SLACK
        };
        self.schedule(held, first);
    }

    /// (Re)schedules the next check of `held` at `at`.
    pub(crate) fn schedule(self: &Arc<Self>, held: &Arc<Held>, at: Instant) {
        {
            let mut queue = lock(&self.queue);
            let mut key = lock(&held.timer.key);
            match key.as_ref() {
                Some(k) => queue.reset_at(k, at.into()),
                None => *key = Some(queue.insert_at(Arc::downgrade(held), at.into())),
            }
        }
        self.ensure_running();
    }

    /// Stops watching `held` (released or abandoned).
    pub(crate) fn forget(&self, held: &Held) {
        // Queue first, then key, as everywhere: a lease's key is live in the
        // queue exactly while it is `Some`, under the queue's lock.
        let mut queue = lock(&self.queue);
        if let Some(k) = lock(&held.timer.key).take() {
            queue.try_remove(&k);
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

/// Hands due leases to `check` until the handle is gone.
async fn run(watchdog: Weak<Watchdog>) {
    loop {
        let due = poll_fn(|cx| {
            let Some(wd) = watchdog.upgrade() else {
                return Poll::Ready(None);
            };
            let mut queue = lock(&wd.queue);
            match queue.poll_expired(cx) {
                // Empty: the next insert wakes this task.
                Poll::Ready(None) => Poll::Pending,
                Poll::Ready(Some(expired)) => {
                    let held = expired.into_inner().upgrade();
                    if let Some(h) = &held {
                        // The key is spent: clear it before the queue can
                        // hand the same key to another lease.
                        *lock(&h.timer.key) = None;
                    }
                    Poll::Ready(Some((wd.clone(), held)))
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        let Some((wd, held)) = due else {
            return;
        };
        let Some(held) = held else {
            continue;
        };
        tokio::spawn(check(wd, held));
    }
}

/// One check of a due lease: lost, renewed, or retried later.
async fn check(wd: Arc<Watchdog>, held: Arc<Held>) {
    if !held.is_held() {
        // Released, lost, or its validity deadline passed (is_held raised
        // the lost signal then).
        return;
    }
    if !held.renew {
        // Not due yet (the deadline was moved by extend): look again then.
        wd.schedule(&held, held.valid_until() + TIMER_SLACK);
        return;
    }
    let ttl = held.ttl();
    let sent = Instant::now();
    match held.renew_now(ttl).await {
        Ok(()) => {
            held.timer.failures.store(0, Ordering::Relaxed);
            let next = (sent + renew_interval(ttl)).min(held.valid_until());
            wd.schedule(&held, next);
        }
        Err(e) if e.kind() == ErrorKind::Lost => {}
        Err(e) => {
            let failures = held.timer.failures.fetch_add(1, Ordering::Relaxed);
            let mut backoff = Backoff::new(
                (ttl / 30).max(Duration::from_millis(10)),
                (ttl / 6).max(Duration::from_millis(20)),
            );
            let mut delay = backoff.next_delay();
            for _ in 0..failures.min(16) {
                delay = backoff.next_delay();
            }
            tracing::warn!(backend = held.backend, name = %held.name, error = %e, retry_in = ?delay, "lease renewal failed; retrying while the lease is valid");
            wd.schedule(&held, (Instant::now() + delay).min(held.valid_until()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{LockOptions, Locker, Wait};

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
