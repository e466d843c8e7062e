//! The queue's slots: entries come due in the order of their instants, a
//! removed or moved entry only where it is now, and an entry put in
//! earlier than the timer (or in an empty queue) comes due on time.

use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Entry, Queue};
use crate::raw::sync::lock;
use crate::raw::watchdog::{CheckFuture, Timer, Watched};

#[derive(Default)]
struct Item(Timer);

impl Watched for Item {
    fn timer(&self) -> &Timer {
        &self.0
    }
    fn check(self: Arc<Self>) -> CheckFuture {
        Box::pin(async { None })
    }
    fn not_after(&self) -> Instant {
        crate::raw::now() + Duration::from_secs(3600)
    }
    fn check_panicked(&self) {}
}

fn items(n: usize) -> Vec<Arc<dyn Watched>> {
    (0..n)
        .map(|_| Arc::new(Item::default()) as Arc<dyn Watched>)
        .collect()
}

fn lease(item: &Arc<dyn Watched>) -> Entry {
    Entry::Lease(Arc::downgrade(item))
}

/// Which of `items` the entry is, and how long after `start` it came.
fn which(entry: Entry, items: &[Arc<dyn Watched>], start: Instant) -> (usize, Duration) {
    let Entry::Lease(weak) = entry else {
        panic!("the tick");
    };
    let item = weak.upgrade().expect("alive");
    let at = items
        .iter()
        .position(|i| Arc::ptr_eq(i, &item))
        .expect("one of the items");
    (at, crate::raw::now() - start)
}

#[tokio::test(start_paused = true)]
async fn entries_come_due_in_order_and_only_where_they_are() {
    let items = items(3);
    let mut q = Queue::default();
    let start = crate::raw::now();
    let ms = Duration::from_millis;
    q.insert(lease(&items[0]), start + ms(10));
    q.insert(lease(&items[1]), start + ms(5));
    let old = q.insert(lease(&items[2]), start + ms(20));
    // Moved: out of its slab place at once; its old key is spent.
    assert!(q.remove(old).is_some());
    assert!(q.remove(old).is_none());
    q.insert(lease(&items[2]), start + ms(3));
    assert_eq!(q.len(), 3);
    let mut got = Vec::new();
    while let Some(entry) = poll_fn(|cx| q.poll_expired(cx)).await {
        got.push(which(entry, &items, start));
    }
    let order: Vec<usize> = got.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [2, 1, 0], "{got:?}");
    for ((_, at), due) in got.iter().zip([3, 5, 10]) {
        assert!(*at >= ms(due) && *at <= ms(due + 1), "{got:?}");
    }
    // The moved entry's old slot went with it: empty after the last.
    assert_eq!(q.len(), 0);
    assert!(crate::raw::now() - start < ms(20));
}

#[tokio::test(start_paused = true)]
async fn an_entry_earlier_than_the_timer_or_in_an_empty_queue_comes_on_time() {
    let items = items(2);
    let q = Arc::new(Mutex::new(Queue::default()));
    let start = crate::raw::now();
    let ms = Duration::from_millis;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let polled = q.clone();
    let task = tokio::spawn(async move {
        loop {
            let next = poll_fn(|cx| match lock(&polled).poll_expired(cx) {
                // Empty: the next insert wakes this task.
                std::task::Poll::Ready(None) => {
                    let _ = tx.send(None);
                    std::task::Poll::Pending
                }
                other => other,
            })
            .await;
            let _ = tx.send(next);
        }
    });
    assert!(rx.recv().await.expect("polled").is_none(), "empty at first");
    lock(&q).insert(lease(&items[0]), start + ms(100));
    tokio::task::yield_now().await;
    // The task waits on the timer for 100 ms; this one is due first.
    lock(&q).insert(lease(&items[1]), start + ms(10));
    for (want, due) in [(1, 10), (0, 100)] {
        let next = tokio::time::timeout(ms(1000), rx.recv()).await;
        let entry = next.expect("on time").expect("polled").expect("an entry");
        let (got, at) = which(entry, &items, start);
        assert_eq!(got, want);
        assert!(at >= ms(due) && at <= ms(due + 1), "{got}: {at:?}");
    }
    task.abort();
}

/// A removed or moved entry leaves nothing in its old slot: the queue's
/// size follows the entries it holds, not the churn it saw.
#[test]
fn a_removed_or_moved_entry_leaves_nothing_behind() {
    let items = items(100);
    let mut q = Queue::default();
    let start = crate::raw::now();
    let ms = Duration::from_millis;
    let later = start + Duration::from_secs(3600);
    let keys: Vec<_> = (0..items.len())
        .map(|i| q.insert(lease(&items[i]), later + ms(i as u64 % 7)))
        .collect();
    for (i, key) in keys.into_iter().enumerate() {
        assert!(q.remove(key).is_some());
        if i % 2 == 0 {
            q.insert(lease(&items[i]), start + ms(5));
        }
    }
    assert_eq!(q.len(), 50);
    assert_eq!(q.slots.len(), 1, "only the slot moved to is left");
    assert_eq!(q.slots.values().map(Vec::len).sum::<usize>(), 50);
}

/// An entry put back within the slot just taken would come due again with
/// it: `after_taken` tells.
#[tokio::test(start_paused = true)]
async fn the_slot_just_taken_is_not_after_itself() {
    let items = items(1);
    let mut q = Queue::default();
    let start = crate::raw::now();
    let ms = Duration::from_millis;
    q.insert(lease(&items[0]), start + ms(10));
    assert!(q.after_taken(start), "nothing taken yet");
    assert!(poll_fn(|cx| q.poll_expired(cx)).await.is_some());
    assert!(!q.after_taken(start + ms(10)));
    assert!(!q.after_taken(start + ms(9) + Duration::from_micros(500)));
    assert!(q.after_taken(start + ms(10) + Duration::from_micros(1)));
}
