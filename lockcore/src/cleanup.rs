//! Cancel-safe cleanup: run an async undo step when a future is dropped midway.
//!
//! A backend's acquire sends requests that may create server state (a key, a
//! node, a transaction). If the acquire future is dropped at an await point,
//! a [`CleanupOnDrop`] armed before the request spawns the undo step (a
//! compare-and-delete, a node delete, a rollback) on the current runtime.
//! Once started, a step runs to its end in its own task: dropping whoever
//! waits for it (see [`CleanupOnDrop::run_now`]) never cuts it short.
//!
//! A process about to exit can wait for the steps still running with
//! [`flush`], so that a cancelled acquisition or a dropped guard is undone
//! on the server before the runtime goes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// A boxed cleanup future.
pub type CleanupFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Cleanup steps spawned and not yet finished, in this process.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static FINISHED: Notify = Notify::const_new();

/// Counts a step as running until dropped (finished, or its task dropped
/// with the runtime).
struct Running;

impl Running {
    fn start() -> Self {
        RUNNING.fetch_add(1, Ordering::SeqCst);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
        FINISHED.notify_waiters();
    }
}

/// Spawns `fut` on the current runtime as a counted cleanup step.
fn spawn_counted<F>(what: &'static str, fut: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let running = Running::start();
            Some(handle.spawn(async move {
                fut.await;
                drop(running);
            }))
        }
        Err(_) => {
            tracing::warn!(
                what,
                "no tokio runtime to run a cleanup step on; the server state ends by its ttl"
            );
            None
        }
    }
}

/// Runs `fut` in the background on the current tokio runtime, if there is
/// one. Without a runtime the step is skipped (and logged): the server state
/// then ends by its ttl, session or connection.
pub fn spawn_cleanup<F>(what: &'static str, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let _ = spawn_counted(what, fut);
}

/// How many cleanup steps (undoing cancelled acquisitions, releasing dropped
/// guards) are still running in this process.
pub fn running() -> usize {
    RUNNING.load(Ordering::SeqCst)
}

/// Waits until every cleanup step running in this process has finished, or
/// `within` has passed; returns whether all finished. Call it before a
/// process exits (or its runtime shuts down) after dropping guards or
/// acquisitions, so that their server state is undone now rather than by
/// its ttl.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockcore::Result<()> {
/// let locker = lockcore::Locker::memory();
/// drop(locker.lock("x").await?); // released in the background
/// assert!(lockcore::cleanup::flush(std::time::Duration::from_secs(5)).await);
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Cancel safe: it only waits.
pub async fn flush(within: Duration) -> bool {
    let waiting = async {
        loop {
            let finished = FINISHED.notified();
            if RUNNING.load(Ordering::SeqCst) == 0 {
                return;
            }
            finished.await;
        }
    };
    tokio::time::timeout(within, waiting).await.is_ok()
}

/// A drop guard that spawns an async cleanup step unless disarmed.
///
/// ```
/// use lockcore::cleanup::CleanupOnDrop;
/// use std::sync::{Arc, atomic::{AtomicBool, Ordering}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let undone = Arc::new(AtomicBool::new(false));
/// let flag = undone.clone();
/// let guard = CleanupOnDrop::new("delete half-made key", async move {
///     flag.store(true, Ordering::SeqCst);
/// });
/// drop(guard); // e.g. the acquire future was dropped here
/// tokio::task::yield_now().await;
/// assert!(undone.load(Ordering::SeqCst));
/// # }
/// ```
#[must_use = "the cleanup runs when this guard is dropped; disarm it on success"]
pub struct CleanupOnDrop {
    what: &'static str,
    step: Option<CleanupFuture>,
}

impl fmt::Debug for CleanupOnDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CleanupOnDrop")
            .field("what", &self.what)
            .field("armed", &self.step.is_some())
            .finish()
    }
}

impl CleanupOnDrop {
    /// Arms a cleanup step; `what` names it in logs.
    pub fn new<F>(what: &'static str, step: F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        CleanupOnDrop {
            what,
            step: Some(Box::pin(step)),
        }
    }

    /// Success: the step will not run.
    pub fn disarm(mut self) {
        self.step = None;
    }

    /// Runs the step now and waits for it, instead of in the background.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the step runs in its own task, so a caller dropped while
    /// waiting (a timeout, a `select!`) leaves it running to its end.
    pub async fn run_now(mut self) {
        if let Some(step) = self.step.take() {
            if let Some(task) = spawn_counted(self.what, step) {
                let _ = task.await;
            }
        }
    }
}

impl Drop for CleanupOnDrop {
    /// Spawns the step unless it was disarmed or has run.
    fn drop(&mut self) {
        if let Some(step) = self.step.take() {
            tracing::debug!(what = self.what, "running cleanup step in the background");
            spawn_cleanup(self.what, step);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A caller cancelled while `run_now` waits (a timeout, a `select!`)
    /// must not cut the undo step short.
    #[tokio::test]
    async fn run_now_survives_a_cancelled_caller() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let cleanup = CleanupOnDrop::new("slow undo", async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            flag.store(true, Ordering::SeqCst);
        });
        let cut = tokio::time::timeout(Duration::from_millis(10), cleanup.run_now()).await;
        assert!(cut.is_err(), "the caller was cancelled");
        assert!(flush(Duration::from_secs(5)).await, "the step finished");
        assert!(
            done.load(Ordering::SeqCst),
            "the undo step was dropped with its caller"
        );
    }
}
