//! What the watchdog does with a held lease: its check (a renewal, or a
//! look at the validity deadline), and the lease as a [`Watched`] item.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{renew_interval, Held, TIMER_SLACK};
use crate::error::ErrorKind;
use crate::raw::retry::Backoff;
use crate::raw::watchdog::{CheckFuture, Timer, Watched};

impl Held {
    /// The watchdog's check: renew (or look again at the validity deadline
    /// when renewal is off); retry a failed renewal with jittered backoff
    /// while the lease is valid; stop once it is lost or released.
    async fn watchdog_check(self: Arc<Self>) -> Option<Instant> {
        if !self.renew {
            if !self.is_held() {
                // Released, lost, or its validity deadline passed (is_held
                // raised the lost signal then).
                return None;
            }
            // Not due yet (the deadline was moved by extend): look again then.
            return Some(self.valid_until() + TIMER_SLACK);
        }
        // Not held (released, lost, past its validity deadline): a `Lost`
        // error, and the watch ends.
        match self.renew_now(None).await {
            Ok(sent) => {
                self.failures.store(0, Ordering::Relaxed);
                Some((sent + renew_interval(self.ttl())).min(self.valid_until()))
            }
            Err(e) if e.kind() == ErrorKind::Lost => None,
            Err(e) => {
                let ttl = self.ttl();
                let failures = self.failures.fetch_add(1, Ordering::Relaxed);
                let mut backoff = Backoff::new(
                    (ttl / 30).max(Duration::from_millis(10)),
                    (ttl / 6).max(Duration::from_millis(20)),
                );
                let mut delay = backoff.next_delay();
                for _ in 0..failures.min(16) {
                    delay = backoff.next_delay();
                }
                tracing::warn!(backend = self.backend, name = %self.name, error = %e, retry_in = ?delay, "lease renewal failed; retrying while the lease is valid");
                Some((crate::raw::now() + delay).min(self.valid_until()))
            }
        }
    }
}

impl Watched for Held {
    fn timer(&self) -> &Timer {
        &self.timer
    }

    fn not_after(&self) -> Instant {
        self.valid_until() + TIMER_SLACK
    }

    fn check(self: Arc<Self>) -> CheckFuture {
        Box::pin(self.watchdog_check())
    }

    fn check_panicked(&self) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        tracing::error!(backend = self.backend, name = %self.name, "a renewal of this lease panicked");
        self.mark_lost("a renewal panicked: the lease is no longer renewed");
    }
}
