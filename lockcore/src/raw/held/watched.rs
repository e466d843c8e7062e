//! What the watchdog does with a held lease: its check (a renewal, or a
//! look at the validity deadline), and the lease as a [`Watched`] item.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{renew_interval, Held, TIMER_SLACK};
use crate::error::{Error, ErrorKind};
use crate::raw::renewing::Answered;
use crate::raw::retry::Backoff;
use crate::raw::watchdog::{CheckFuture, Timer, Watchdog, Watched};
use crate::raw::{Renewal, Renewing};

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
        // Not held (released, lost, past its validity deadline): the watch
        // ends. A renewal the backend's task answers may still be out
        // then: past the deadline, where the watchdog looks meanwhile,
        // the lease is lost rather than renewed again.
        if !self.is_held() {
            return None;
        }
        let renewed = self.renew_now(None).await;
        self.after_renewal(renewed)
    }

    /// The renewal turn, waited for until the validity deadline: a
    /// renewal that holds it longer (one the backend's task left
    /// unanswered) is lost by then, and a release goes ahead without it.
    /// Off a tokio runtime (no timer) it waits for the turn only.
    pub(super) async fn turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.renewing.acquire().await.ok();
        }
        loop {
            let until = self.valid_until() + TIMER_SLACK;
            match tokio::time::timeout_at(until.into(), self.renewing.acquire()).await {
                Ok(turn) => return turn.ok(),
                // Renewed just now, its turn about to come back.
                Err(_) if crate::raw::now() < self.valid_until() => {}
                Err(_) => return None,
            }
        }
    }

    /// When to check next after a renewal that returned `renewed`: a
    /// renewal interval after it was sent; a retry with jittered backoff
    /// while the lease is valid when it failed; never once it is lost.
    fn after_renewal(&self, renewed: crate::error::Result<Instant>) -> Option<Instant> {
        match renewed {
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

    /// The watchdog's check done at once, with no future of its own:
    /// when the backend answers the renewal from what it already knows, or
    /// renews in place
    /// ([`BackendLease::renew_known`](crate::raw::BackendLease::renew_known)),
    /// with the same outcome as [`watchdog_check`](Held::watchdog_check);
    /// or when it takes the renewal to answer from its own task
    /// ([`BackendLease::renew_then`](crate::raw::BackendLease::renew_then)),
    /// `Some(None)`: the lease is then watched at its validity deadline
    /// until the answer moves it to its next check. `None` when the check
    /// must run as a future: renewal is off, another renewal runs, the
    /// lease is not held, or the backend renews only by `renew`.
    fn known_check(self: Arc<Self>) -> Option<Option<Instant>> {
        if !self.renew {
            return None;
        }
        let turn = self.renewing.try_acquire().ok()?;
        let sent = crate::raw::now();
        let held = !self.released.load(Ordering::Acquire) && !self.lost.is_cancelled();
        if !held || sent >= self.valid_until() {
            return None;
        }
        let ttl = self.ttl() + self.delay;
        if let Some(renewal) = self.lease.renew_known(ttl) {
            let outcome: std::result::Result<_, std::convert::Infallible> = Ok(Ok(renewal));
            // Refused: `settle` raised the lost signal, and the watch ends.
            return Some(
                self.settle(sent, sent, None, outcome)
                    .ok()
                    .map(|at| self.renewed_at(at)),
            );
        }
        if !self.then.load(Ordering::Relaxed) {
            return None;
        }
        // In the queue at the deadline before the renewal goes out, so
        // that its answer (which moves the lease on) cannot come first:
        // put there as it came due when its last renewal went this way too
        // (`while_checked`).
        let until = self.valid_until();
        if !self.then_out.load(Ordering::Relaxed) {
            self.schedule(self.not_after(), false);
        }
        // The turn is lent to the renewal until its answer is applied.
        turn.forget();
        let done = Renewing::of_lease(self.clone(), until, sent);
        match self.lease.renew_then(ttl, done) {
            Ok(()) => {
                self.then_out.store(true, Ordering::Relaxed);
                Some(None)
            }
            Err(done) => {
                // Not for this lease: its renewals go by `renew` from now.
                // (The turn comes back.)
                done.unsent();
                self.then.store(false, Ordering::Relaxed);
                self.then_out.store(false, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A renewal the backend's task answers
/// ([`renew_then`](crate::raw::BackendLease::renew_then)) holds the
/// renewal turn until its answer is applied and the lease is back in the
/// queue (so that an `extend` waiting for the turn schedules last).
impl Answered for Held {
    /// Applied as [`renew_now`](Held::renew_now) applies an answer (one
    /// after the validity deadline as none by then): the lease's next
    /// check, or `None` once it is released or lost.
    fn apply(
        &self,
        sent: Instant,
        now: Instant,
        answer: Option<crate::error::Result<Renewal>>,
    ) -> Option<Instant> {
        let answer = answer.unwrap_or_else(|| {
            Err(Error::unavailable(
                self.backend,
                "the renewal was dropped unanswered (the backend's task ended)",
            ))
        });
        let outcome = if now >= self.valid_until() {
            Err(())
        } else {
            Ok(answer)
        };
        let settled = self.settle(sent, now, None, outcome);
        self.after_renewal(settled)
            .filter(|_| !self.released.load(Ordering::Acquire))
    }

    fn watchdog(&self) -> &Arc<Watchdog> {
        &self.watchdog
    }

    fn turn_back(&self) {
        self.renewing.add_permits(1);
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

    fn check_now(self: Arc<Self>) -> Option<Option<Instant>> {
        self.known_check()
    }

    fn while_checked(&self) -> Option<Instant> {
        let renewing = self.renew
            && self.then_out.load(Ordering::Relaxed)
            && !self.released.load(Ordering::Acquire);
        renewing.then(|| self.not_after())
    }

    fn check_panicked(&self) {
        if self.released.load(Ordering::Acquire) {
            return;
        }
        tracing::error!(backend = self.backend, name = %self.name, "a renewal of this lease panicked");
        self.mark_lost("a renewal panicked: the lease is no longer renewed");
    }
}
