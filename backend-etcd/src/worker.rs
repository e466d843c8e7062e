//! A task fed through a channel, started on first use and started again
//! when the runtime that ran it has ended.

use std::future::Future;
use std::sync::Mutex;

use lockcore::raw::sync::lock;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

/// The sending side of a lazily started task that takes `T`s.
pub(crate) struct Worker<T> {
    tx: Mutex<Option<mpsc::UnboundedSender<T>>>,
    /// Where the task runs: the runtime that made this, then (if that one
    /// ended) the one that sent next.
    runtime: Mutex<Handle>,
}

impl<T: Send + 'static> Worker<T> {
    /// A worker whose task will run on the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it is made in `connect`, inside one).
    pub(crate) fn new() -> Self {
        Worker {
            tx: Mutex::new(None),
            runtime: Mutex::new(Handle::current()),
        }
    }

    /// Hands `item` to the task, first starting it with `start` if none
    /// runs.
    pub(crate) fn send<F, Fut>(&self, item: T, start: F)
    where
        F: FnOnce(mpsc::UnboundedReceiver<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut tx = lock(&self.tx);
        let (item, ended) = match tx.as_ref() {
            Some(t) => match t.send(item) {
                Ok(()) => return,
                // The task ended with the runtime that ran it.
                Err(mpsc::error::SendError(item)) => (item, true),
            },
            None => (item, false),
        };
        let (new_tx, rx) = mpsc::unbounded_channel();
        {
            let mut rt = lock(&self.runtime);
            if ended {
                if let Ok(current) = Handle::try_current() {
                    *rt = current;
                }
            }
            rt.spawn(start(rx));
        }
        // The receiver is alive: it was just made.
        let _ = new_tx.send(item);
        *tx = Some(new_tx);
    }
}
