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
            Ok(sent) => Some(self.renewed_at(sent)),
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

impl Held {
    /// A renewal sent at `sent` succeeded: failures are forgotten, and the
    /// next renewal is due a renewal interval later (or at the validity
    /// deadline, if sooner).
    fn renewed_at(&self, sent: Instant) -> Instant {
        self.failures.store(0, Ordering::Relaxed);
        (sent + renew_interval(self.ttl())).min(self.valid_until())
    }

    /// The watchdog's check done at once, when the backend answers the
    /// renewal from what it already knows
    /// ([`BackendLease::renew_known`](crate::raw::BackendLease::renew_known)):
    /// the same outcome as [`watchdog_check`](Held::watchdog_check), with
    /// no future, timer or request of its own. `None` when the check must
    /// run as a future: renewal is off, another renewal runs, the lease is
    /// not held, or the backend must ask its server.
    fn known_check(&self) -> Option<Option<Instant>> {
        if !self.renew {
            return None;
        }
        let _turn = self.renewing.try_lock().ok()?;
        let sent = crate::raw::now();
        let held = !self.released.load(Ordering::Acquire) && !self.lost.is_cancelled();
        if !held || sent >= self.valid_until() {
            return None;
        }
        let renewal = self.lease.renew_known(self.ttl() + self.delay)?;
        let outcome: std::result::Result<_, std::convert::Infallible> = Ok(Ok(renewal));
        // Refused: `settle` raised the lost signal, and the watch ends.
        Some(
            self.settle(sent, None, outcome)
                .ok()
                .map(|at| self.renewed_at(at)),
        )
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

    fn check_now(&self) -> Option<Option<Instant>> {
        self.known_check()
    }

    fn check_panicked(&self) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        tracing::error!(backend = self.backend, name = %self.name, "a renewal of this lease panicked");
        self.mark_lost("a renewal panicked: the lease is no longer renewed");
    }
}
