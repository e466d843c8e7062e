//! Many leases' requests in a few server calls: a task fed through a
//! channel ([`Worker`]), and the batching loop on it ([`Batches`]).
//!
//! With thousands of held leases, a renewal each is thousands of server
//! calls a second. A backend whose server can answer many leases in one
//! call (a script over many keys, a transaction of many reads) sends the
//! requests asked within a short window together, and answers each
//! request from its part of the reply. The window costs a renewal a few
//! milliseconds: nothing, against validity counted from when it asked.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{mpsc, Semaphore};

use crate::raw::sync::lock;

/// The sending side of a task that takes `T`s, started on first use and
/// started again when the runtime that ran it has ended.
pub struct Worker<T> {
    tx: Mutex<Option<mpsc::UnboundedSender<T>>>,
    /// Where the task runs: the runtime that made this (if any), then (if
    /// that one ended) the one that sent next.
    runtime: Mutex<Option<Handle>>,
}

impl<T> std::fmt::Debug for Worker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("running", &lock(&self.tx).is_some())
            .finish()
    }
}

impl<T: Send + 'static> Default for Worker<T> {
    fn default() -> Self {
        Worker::new()
    }
}

impl<T: Send + 'static> Worker<T> {
    /// A worker whose task will run on the current runtime (or, made
    /// outside one, on the runtime of the first send).
    pub fn new() -> Self {
        Worker {
            tx: Mutex::new(None),
            runtime: Mutex::new(Handle::try_current().ok()),
        }
    }

    /// Hands `item` to the task, first starting it with `start` if none
    /// runs. Dropped (with `start` not called) when called outside a tokio
    /// runtime with no runtime to start the task on.
    pub fn send<F, Fut>(&self, item: T, start: F)
    where
        F: Fn(mpsc::UnboundedReceiver<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut tx = lock(&self.tx);
        let (mut item, mut ended) = match tx.as_ref() {
            Some(t) => match t.send(item) {
                Ok(()) => return,
                // The task ended with the runtime that ran it.
                Err(mpsc::error::SendError(item)) => (item, true),
            },
            None => (item, false),
        };
        // Twice at most: a runtime that ended drops the task it is given
        // (and the receiver with it); the second time, on the current one.
        for _ in 0..2 {
            let (new_tx, rx) = mpsc::unbounded_channel();
            {
                let mut rt = lock(&self.runtime);
                if ended || rt.is_none() {
                    if let Ok(current) = Handle::try_current() {
                        *rt = Some(current);
                    }
                }
                let Some(rt) = rt.as_ref() else {
                    return;
                };
                rt.spawn(start(rx));
            }
            match new_tx.send(item) {
                Ok(()) => {
                    *tx = Some(new_tx);
                    return;
                }
                Err(mpsc::error::SendError(back)) => (item, ended) = (back, true),
            }
        }
    }
}

/// A request that can be batched: it knows whether its asker gave up.
pub trait Waiting: Send + 'static {
    /// Whether nobody waits for the answer any more (a dropped renewal):
    /// such requests are left out of the next call.
    fn gave_up(&self) -> bool;

    /// [`gave_up`](Waiting::gave_up) with the clock read at `now` by the
    /// caller, once for many requests: for a request whose asker gives up
    /// at a deadline. The default ignores `now`.
    fn gave_up_at(&self, now: Instant) -> bool {
        let _ = now;
        self.gave_up()
    }
}

/// Requests asked within a window, sent together: at most
/// [`most`](Batches::most) per call, a bounded number of calls in flight.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use lockcore::raw::batch::{Batches, Waiting};
/// use tokio::sync::oneshot;
///
/// struct Ask(u32, oneshot::Sender<u32>);
/// impl Waiting for Ask {
///     fn gave_up(&self) -> bool {
///         self.1.is_closed()
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let calls = Arc::new(AtomicUsize::new(0));
/// let batches = Batches::new(Duration::from_millis(5), 64, 4);
/// let mut answers = Vec::new();
/// for n in 0..10 {
///     let (tx, rx) = oneshot::channel();
///     let calls = calls.clone();
///     batches.send(Ask(n, tx), move || {
///         let calls = calls.clone();
///         move |batch: Vec<Ask>| {
///             calls.fetch_add(1, Ordering::Relaxed);
///             async move {
///                 for Ask(n, reply) in batch {
///                     let _ = reply.send(n * 2);
///                 }
///             }
///         }
///     });
///     answers.push(rx);
/// }
/// for (n, rx) in answers.into_iter().enumerate() {
///     assert_eq!(rx.await.unwrap(), n as u32 * 2);
/// }
/// assert_eq!(calls.load(Ordering::Relaxed), 1);
/// # });
/// ```
pub struct Batches<T> {
    task: Worker<T>,
    window: Duration,
    most: Arc<AtomicUsize>,
    in_flight: usize,
}

impl<T> std::fmt::Debug for Batches<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches")
            .field("window", &self.window)
            .field("most", &self.most.load(Ordering::Relaxed))
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl<T: Waiting> Batches<T> {
    /// Batches of requests asked within `window` of the first, at most
    /// `most` per call (at least one), at most `in_flight` calls at once
    /// (at least one). Its task runs on the current runtime, started on
    /// the first send.
    pub fn new(window: Duration, most: usize, in_flight: usize) -> Self {
        Batches {
            task: Worker::new(),
            window,
            most: Arc::new(AtomicUsize::new(most.max(1))),
            in_flight: in_flight.max(1),
        }
    }

    /// The most requests per call, shared with the task: a call that finds
    /// the server refuses that many lowers it (`fetch_min`) for the calls
    /// after it.
    pub fn most(&self) -> Arc<AtomicUsize> {
        self.most.clone()
    }

    /// Queues `item` for the next call. If no task runs, one starts with
    /// the calling function that `make` gives (called once per task
    /// started); each call answers every request of its batch.
    pub fn send<M, C, Fut>(&self, item: T, make: M)
    where
        M: Fn() -> C,
        C: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (window, most, in_flight) = (self.window, self.most.clone(), self.in_flight);
        self.task
            .send(item, |rx| run(rx, make(), window, most.clone(), in_flight));
    }
}

/// The batching task: gathers, then hands each batch to `call` in a task
/// of its own, while at most `in_flight` are out.
async fn run<T, C, Fut>(
    mut rx: mpsc::UnboundedReceiver<T>,
    call: C,
    window: Duration,
    most: Arc<AtomicUsize>,
    in_flight: usize,
) where
    T: Waiting,
    C: Fn(Vec<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let most = most.load(Ordering::Relaxed).max(1);
        let mut batch = Vec::with_capacity(most.min(1024));
        batch.push(first);
        take_queued(&mut rx, &mut batch, most);
        if batch.len() < most {
            // Not full: let the requests asked just after join.
            tokio::time::sleep(window).await;
            take_queued(&mut rx, &mut batch, most);
        }
        let now = crate::raw::now();
        batch.retain(|c| !c.gave_up_at(now));
        if batch.is_empty() {
            continue;
        }
        let sending = call(batch);
        tokio::spawn(async move {
            sending.await;
            drop(slot);
        });
    }
}

/// Moves queued requests into `batch`, up to `most`, dropping those whose
/// asker gave up.
fn take_queued<T: Waiting>(rx: &mut mpsc::UnboundedReceiver<T>, batch: &mut Vec<T>, most: usize) {
    let now = crate::raw::now();
    while batch.len() < most {
        match rx.try_recv() {
            Ok(c) if c.gave_up_at(now) => {}
            Ok(c) => batch.push(c),
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::{Batches, Waiting};

    struct Ask(usize, oneshot::Sender<usize>);

    impl Waiting for Ask {
        fn gave_up(&self) -> bool {
            self.1.is_closed()
        }
    }

    /// Sends `n` asks (dropping the answers of those `drop` picks) and
    /// returns the sizes of the calls made and the answers received.
    async fn run(n: usize, most: usize, drop: fn(usize) -> bool) -> (Vec<usize>, Vec<usize>) {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let batches = Batches::new(Duration::from_millis(20), most, 2);
        let mut answers = Vec::new();
        for i in 0..n {
            let (tx, rx) = oneshot::channel();
            let sizes = sizes.clone();
            batches.send(Ask(i, tx), move || {
                let sizes = sizes.clone();
                move |batch: Vec<Ask>| {
                    sizes.lock().unwrap().push(batch.len());
                    async move {
                        for Ask(i, reply) in batch {
                            let _ = reply.send(i);
                        }
                    }
                }
            });
            if !drop(i) {
                answers.push(rx);
            }
        }
        let mut got = Vec::new();
        for rx in answers {
            got.push(rx.await.unwrap());
        }
        let sizes = sizes.lock().unwrap().clone();
        (sizes, got)
    }

    #[tokio::test]
    async fn calls_take_at_most_most() {
        let (sizes, got) = run(10, 4, |_| false).await;
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert!(sizes.iter().all(|s| *s <= 4), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 10);
    }

    #[tokio::test]
    async fn a_call_that_panics_fails_only_its_own_asks() {
        // One ask a call, two calls at once: the first call panics.
        let batches = Batches::new(Duration::from_millis(1), 1, 2);
        let (tx0, rx0) = oneshot::channel();
        let (tx1, rx1) = oneshot::channel();
        for ask in [Ask(0, tx0), Ask(1, tx1)] {
            batches.send(ask, || {
                |batch: Vec<Ask>| async move {
                    for Ask(i, reply) in batch {
                        assert_ne!(i, 0, "the call of ask 0 panics");
                        let _ = reply.send(i);
                    }
                }
            });
        }
        assert!(rx0.await.is_err(), "the panicked call's ask is dropped");
        assert_eq!(rx1.await.expect("the other call's answer"), 1);
    }

    #[tokio::test]
    async fn asks_given_up_are_not_sent() {
        let (sizes, got) = run(10, 64, |i| i % 2 == 1).await;
        assert_eq!(got, vec![0, 2, 4, 6, 8]);
        assert_eq!(sizes.iter().sum::<usize>(), 5, "{sizes:?}");
    }
}
