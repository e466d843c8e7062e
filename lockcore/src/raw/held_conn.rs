//! What every backend whose lease is a connection
//! ([`LeaseKind::Connection`](crate::LeaseKind::Connection)) writes again:
//! the connection held by one lease, used by one request at a time, each
//! run to its end even when its caller is dropped, taken out by the
//! release, and closed without a goodbye on abandon.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::cleanup::spawn_cleanup;
use crate::error::{Error, ErrorKind, Result};

/// The connection a connection lease lives on (`None` once it is released,
/// broken or abandoned).
///
/// A request on it runs in a task of its own ([`HeldConn::run`]), so a
/// caller that goes away (a dropped `extend`, a watchdog that gave up)
/// never leaves a reply unread on the connection; [`HeldConn::abandon`]
/// drops the connection now, or as soon as the request in flight lets go.
///
/// ```
/// use lockcore::raw::held_conn::HeldConn;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockcore::Result<()> {
/// let held = HeldConn::new("mine", String::from("a connection"));
/// let len = held
///     .run(|mut slot| async move { Ok(slot.as_mut().map(|c| c.len())) })
///     .await?;
/// assert_eq!(len, Some(12));
/// assert_eq!(held.take().await.as_deref(), Some("a connection"));
/// assert!(held.take().await.is_none(), "released once");
/// # Ok(()) }
/// ```
pub struct HeldConn<C> {
    backend: &'static str,
    slot: Arc<Mutex<Option<C>>>,
}

impl<C> fmt::Debug for HeldConn<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldConn")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl<C: Send + 'static> HeldConn<C> {
    /// The connection of one granted lease; `backend` names it in errors.
    pub fn new(backend: &'static str, conn: C) -> Self {
        HeldConn {
            backend,
            slot: Arc::new(Mutex::new(Some(conn))),
        }
    }

    /// Runs `work` with the connection (after any request in flight), in a
    /// task of its own that runs to its end even if this call is dropped.
    /// `work` may take the connection out of the slot (a broken one, to
    /// close it).
    ///
    /// # Errors
    ///
    /// `work`'s own error, or [`ErrorKind::Indeterminate`] when its task
    /// ended without an answer (it panicked or the runtime shut down).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves `work` running to its end.
    pub async fn run<R, F, Fut>(&self, work: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(OwnedMutexGuard<Option<C>>) -> Fut,
        Fut: Future<Output = Result<R>> + Send + 'static,
    {
        let slot = self.slot.clone().lock_owned().await;
        match tokio::spawn(work(slot)).await {
            Ok(result) => result,
            Err(e) => Err(Error::new(
                ErrorKind::Indeterminate,
                self.backend,
                format!("a request on the lease's connection ended before it answered: {e}"),
            )),
        }
    }

    /// Takes the connection out (for the release), after any request in
    /// flight; `None` when it was already taken, broken or abandoned.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call takes nothing out.
    pub async fn take(&self) -> Option<C> {
        self.slot.lock().await.take()
    }

    /// Drops the connection as a dead process would, `before` it (to say how
    /// it closes): now, or, while a request is in flight, as soon as that
    /// request lets go of it.
    pub fn abandon(&self, before: impl FnOnce(&mut C) + Send + 'static) {
        fn close<C>(slot: &mut Option<C>, before: impl FnOnce(&mut C)) {
            if let Some(mut c) = slot.take() {
                before(&mut c);
                drop(c);
            }
        }
        match self.slot.try_lock() {
            Ok(mut slot) => close(&mut slot, before),
            Err(_) => {
                let slot = self.slot.clone();
                spawn_cleanup("close an abandoned lease's connection", async move {
                    close(&mut *slot.lock().await, before);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    /// A connection that says when it was closed.
    struct Conn(Arc<AtomicBool>);

    impl Drop for Conn {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_dropped_request_runs_to_its_end() {
        let held = HeldConn::new("test", 0u32);
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let call = held.run(|mut slot| async move {
            let _ = started.send(());
            let _ = wait.await;
            if let Some(n) = slot.as_mut() {
                *n += 1;
            }
            Ok(())
        });
        // Started, then dropped by its caller before it answered.
        tokio::select! {
            _ = call => panic!("answered before it was let go"),
            _ = running => {}
        }
        go.send(()).unwrap();
        assert_eq!(held.take().await, Some(1), "the request did not finish");
    }

    #[tokio::test]
    async fn abandon_waits_for_the_request_in_flight() {
        let closed = Arc::new(AtomicBool::new(false));
        let held = Arc::new(HeldConn::new("test", Conn(closed.clone())));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let h = held.clone();
        let request = tokio::spawn(async move {
            h.run(|slot| async move {
                let _ = started.send(());
                let _ = wait.await;
                assert!(slot.is_some(), "closed under a request in flight");
                Ok(())
            })
            .await
        });
        running.await.unwrap();
        held.abandon(|_| {});
        assert!(
            !closed.load(Ordering::SeqCst),
            "closed under a request in flight"
        );
        go.send(()).unwrap();
        request.await.unwrap().unwrap();
        crate::cleanup::flush(Duration::from_secs(5)).await;
        assert!(
            closed.load(Ordering::SeqCst),
            "not closed after the request"
        );
        assert!(
            held.take().await.is_none(),
            "an abandoned connection was kept"
        );
    }

    #[tokio::test]
    async fn abandon_closes_an_idle_connection_at_once() {
        let closed = Arc::new(AtomicBool::new(false));
        let held = HeldConn::new("test", Conn(closed.clone()));
        let marked = Arc::new(AtomicBool::new(false));
        let m = marked.clone();
        held.abandon(move |_| m.store(true, Ordering::SeqCst));
        assert!(marked.load(Ordering::SeqCst) && closed.load(Ordering::SeqCst));
    }
}
