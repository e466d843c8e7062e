//! The watchdog's queue and task: checks side by side, panics, budget,
//! runtimes that end, churn.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{CheckFuture, Timer, Watchdog, Watched};

use crate::locker::Locker;
use crate::options::{LockOptions, Wait};

/// An item checked every 100 ms that counts its checks; `panics` on
/// its second check, or `hangs` in it forever.
#[derive(Default)]
struct Counted {
    timer: Timer,
    checks: AtomicUsize,
    /// Told its check panicked.
    panicked: AtomicBool,
    /// Each check uses this much of tokio's cooperative budget.
    budget: usize,
    panics: bool,
    hangs: bool,
    /// Its first check never finishes.
    hangs_first: bool,
    /// Telling it its check panicked panics too.
    panics_when_told: bool,
    /// Making its second check's future panics.
    panics_making: bool,
}

impl Watched for Counted {
    fn timer(&self) -> &Timer {
        &self.timer
    }

    fn check(self: Arc<Self>) -> CheckFuture {
        if self.panics_making && self.checks.load(Ordering::SeqCst) >= 1 {
            panic!("making a check that panics");
        }
        Box::pin(async move {
            for _ in 0..self.budget {
                tokio::task::coop::consume_budget().await;
            }
            let n = self.checks.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= 2 && self.panics {
                panic!("a check that panics");
            }
            if (n >= 2 && self.hangs) || (n == 1 && self.hangs_first) {
                std::future::pending::<()>().await;
            }
            Some(crate::raw::now() + Duration::from_millis(100))
        })
    }

    fn not_after(&self) -> Instant {
        crate::raw::now() + Duration::from_secs(3600)
    }

    fn check_panicked(&self) {
        self.panicked.store(true, Ordering::SeqCst);
        assert!(!self.panics_when_told, "telling it panics too");
    }
}

/// Checks run side by side in the watchdog's task: one that panics
/// ends its own item's watch, one that never finishes holds up no
/// other, and the rest are checked on time.
#[tokio::test(start_paused = true)]
async fn a_check_that_panics_or_hangs_stops_only_its_own_item() {
    let wd = Arc::new(Watchdog::default());
    let panics = Arc::new(Counted {
        panics: true,
        ..Counted::default()
    });
    let hangs = Arc::new(Counted {
        hangs: true,
        ..Counted::default()
    });
    let fine: Vec<Arc<Counted>> = (0..50).map(|_| Arc::new(Counted::default())).collect();
    let start = crate::raw::now() + Duration::from_millis(100);
    for item in [&panics, &hangs].into_iter().chain(&fine) {
        let it: Arc<dyn Watched> = item.clone();
        wd.schedule(&it, start, true);
    }
    tokio::time::sleep(Duration::from_millis(1050)).await;
    assert_eq!(panics.checks.load(Ordering::SeqCst), 2);
    assert!(panics.panicked.load(Ordering::SeqCst));
    assert_eq!(hangs.checks.load(Ordering::SeqCst), 2);
    for item in &fine {
        let n = item.checks.load(Ordering::SeqCst);
        assert!(
            (9..=11).contains(&n),
            "{n} checks in 1.05 s, one every 100 ms"
        );
    }
}

/// Making a check's future panics (in the watchdog's task, beside the
/// checks of other items come due with it): that item's watch ends, and
/// it is told; the others are checked on time.
#[tokio::test(start_paused = true)]
async fn a_check_whose_making_panics_stops_only_its_own_item() {
    let wd = Arc::new(Watchdog::default());
    let panics = Arc::new(Counted {
        panics_making: true,
        ..Counted::default()
    });
    let fine: Vec<Arc<Counted>> = (0..50).map(|_| Arc::new(Counted::default())).collect();
    let start = crate::raw::now() + Duration::from_millis(100);
    for item in std::iter::once(&panics).chain(&fine) {
        let it: Arc<dyn Watched> = item.clone();
        wd.schedule(&it, start, true);
    }
    tokio::time::sleep(Duration::from_millis(1050)).await;
    assert!(panics.panicked.load(Ordering::SeqCst), "not told");
    for f in &fine {
        let n = f.checks.load(Ordering::SeqCst);
        assert!(
            n >= 9,
            "an item beside it was checked {n} times in a second"
        );
    }
}

/// An item that panics when told its check panicked takes down no other
/// item's checks: the watchdog's task goes on.
#[tokio::test(start_paused = true)]
async fn a_panic_when_told_of_a_panic_stops_no_other_item() {
    let wd = Arc::new(Watchdog::default());
    let bad = Arc::new(Counted {
        panics: true,
        panics_when_told: true,
        ..Counted::default()
    });
    let fine = Arc::new(Counted::default());
    let start = crate::raw::now() + Duration::from_millis(100);
    for item in [&bad, &fine] {
        let it: Arc<dyn Watched> = item.clone();
        wd.schedule(&it, start, true);
    }
    tokio::time::sleep(Duration::from_millis(1050)).await;
    assert!(bad.panicked.load(Ordering::SeqCst));
    let n = fine.checks.load(Ordering::SeqCst);
    assert!(
        (9..=11).contains(&n),
        "{n} checks in 1.05 s, one every 100 ms"
    );
}

/// Many checks in one busy runtime: each uses some of tokio's
/// cooperative budget, and the runtime's other tasks take their turns,
/// yet every item is checked on time (all checks in one task must not
/// share one task's budget of a turn).
#[tokio::test]
async fn many_checks_keep_time_in_a_busy_runtime() {
    let wd = Arc::new(Watchdog::default());
    let items: Vec<Arc<Counted>> = (0..3000)
        .map(|_| {
            Arc::new(Counted {
                budget: 4,
                ..Counted::default()
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let noise: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_micros(300));
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let start = crate::raw::now() + Duration::from_millis(100);
    for item in &items {
        let it: Arc<dyn Watched> = item.clone();
        wd.schedule(&it, start, true);
    }
    tokio::time::sleep(Duration::from_millis(1050)).await;
    stop.store(true, Ordering::SeqCst);
    for n in noise {
        n.await.unwrap();
    }
    let fewest = items
        .iter()
        .map(|i| i.checks.load(Ordering::SeqCst))
        .min()
        .unwrap();
    // About 9 on an idle machine; 0 when the checks share one task's
    // budget of a turn.
    assert!(
        fewest >= 5,
        "an item was checked {fewest} times in 1.05 s, due every 100 ms"
    );
}

/// A check still running when the watchdog's runtime shuts down is
/// not lost with it: the next task, in another runtime, checks its
/// item again (its queue entry was spent when the check began).
#[test]
fn a_check_cut_off_with_its_runtime_is_checked_again() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    };
    let wd = Arc::new(Watchdog::default());
    let cut_off = Arc::new(Counted {
        hangs_first: true,
        ..Counted::default()
    });
    runtime().block_on(async {
        let it: Arc<dyn Watched> = cut_off.clone();
        wd.schedule(&it, crate::raw::now() + Duration::from_millis(10), true);
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    assert_eq!(cut_off.checks.load(Ordering::SeqCst), 1);
    let other = Arc::new(Counted::default());
    runtime().block_on(async {
        let it: Arc<dyn Watched> = other.clone();
        wd.schedule(&it, crate::raw::now() + Duration::from_millis(10), true);
        tokio::time::sleep(Duration::from_millis(500)).await;
    });
    assert!(other.checks.load(Ordering::SeqCst) >= 2);
    assert!(
        cut_off.checks.load(Ordering::SeqCst) >= 2,
        "the check cut off with its runtime was never made again"
    );
}

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

/// Checks a second or more away that are due within one grid step come
/// due together, never later and at most a twelfth of their wait early;
/// a check due within 12 ms keeps its time (the last check of a lease,
/// at its validity deadline, may be one), on any grid.
#[test]
fn checks_due_close_together_come_due_together() {
    use super::queue::coalesced;
    let now = Instant::now();
    let mut points = std::collections::BTreeSet::new();
    for i in 0..1000u64 {
        let at = now + Duration::from_secs(1) + Duration::from_micros(i * 31);
        let c = coalesced(at, now, now);
        assert!(c <= at, "moved later");
        assert!(
            at - c <= Duration::from_millis(32),
            "moved {:?} early",
            at - c
        );
        points.insert(c);
    }
    // 31 ms of due times on a 32 ms grid: one or two points.
    assert!(points.len() <= 2, "{} points", points.len());
    let soon = now + Duration::from_millis(10);
    let origin = now.checked_sub(Duration::from_micros(300)).unwrap_or(now);
    assert_eq!(coalesced(soon, now, origin), soon);
    assert_eq!(
        coalesced(now + Duration::from_micros(900), now, origin),
        now + Duration::from_micros(900)
    );
    let past = now.checked_sub(Duration::from_millis(5)).unwrap_or(now);
    assert!(coalesced(past, now, now) <= past);
}
