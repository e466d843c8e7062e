//! Cancel-safe cleanup: run an async undo step when a future is dropped midway.
//!
//! A backend's acquire sends requests that may create server state (a key, a
//! node, a transaction). If the acquire future is dropped at an await point,
//! a [`CleanupOnDrop`] armed before the request spawns the undo step (a
//! compare-and-delete, a node delete, a rollback) on the current runtime.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// A boxed cleanup future.
pub type CleanupFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs `fut` in the background on the current tokio runtime, if there is
/// one. Without a runtime the step is skipped (and logged): the server state
/// then ends by its ttl, session or connection.
pub fn spawn_cleanup<F>(what: &'static str, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(fut);
        }
        Err(_) => {
            tracing::warn!(
                what,
                "no tokio runtime to run a cleanup step on; the server state ends by its ttl"
            );
        }
    }
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

    /// Runs the step now, in place, instead of in the background.
    pub async fn run_now(mut self) {
        if let Some(step) = self.step.take() {
            step.await;
        }
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        if let Some(step) = self.step.take() {
            tracing::debug!(what = self.what, "running cleanup step in the background");
            spawn_cleanup(self.what, step);
        }
    }
}
