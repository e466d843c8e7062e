//! A check running in the watchdog's task: started at once where it can
//! be, else a future polled beside the others, a panic in it caught and
//! told to its item alone.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::stream::FuturesUnordered;

use super::{CheckFuture, Watched};

/// One check running in the watchdog's task, with its item.
pub(super) struct Running {
    pub(super) item: Arc<dyn Watched>,
    check: tokio::task::coop::Unconstrained<CheckFuture>,
}

impl Future for Running {
    /// The item, and when to check it next (`None`: stop watching).
    type Output = (Arc<dyn Watched>, Option<Instant>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // A panic in one check ends that item's watch, not the others'.
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut this.check).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(next)) => Poll::Ready((this.item.clone(), next)),
            Err(_) => {
                panicked(&*this.item);
                Poll::Ready((this.item.clone(), None))
            }
        }
    }
}

/// Tells `item` that its check panicked.
fn panicked(item: &dyn Watched) {
    let told = std::panic::catch_unwind(AssertUnwindSafe(|| item.check_panicked()));
    if told.is_err() {
        tracing::error!("a watched item's check panicked, and so did telling it");
    }
}

/// Starts `item`'s check: done at once when it can be (its next check then
/// joins `again`), else its future joins `running`.
pub(super) fn start_check(
    item: Arc<dyn Watched>,
    running: &mut FuturesUnordered<Running>,
    again: &mut Vec<(Arc<dyn Watched>, Instant)>,
) {
    // A panic in one check, or in making it, ends that item's watch, not
    // the others'.
    let started = std::panic::catch_unwind(AssertUnwindSafe(|| match item.clone().check_now() {
        Some(next) => Ok(next),
        None => Err(item.clone().check()),
    }));
    match started {
        Ok(Ok(Some(next))) => again.push((item, next)),
        Ok(Ok(None)) => {}
        Ok(Err(check)) => {
            let check = tokio::task::coop::unconstrained(check);
            running.push(Running { item, check });
        }
        Err(_) => panicked(&*item),
    }
}
