//! The state of one held lease, shared by its guards (one per hold) and the
//! watchdog: validity, renewal in send order, the lost signal, release.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, ErrorKind, Result};
use crate::observe;
use crate::options::LockOptions;
use crate::raw::sync::lock;
use crate::raw::watchdog::{Timer, Watchdog, Watched};
use crate::raw::{BackendLease, Grant, Released, Renewal};

/// Deadlines checked for having passed are scheduled this much later: a
/// margin over the queue's resolution of a millisecond (it rounds an
/// entry's instant up to its millisecond, as the runtime's timer does).
const TIMER_SLACK: Duration = Duration::from_millis(1);

/// The lost reason of a lease that its release found gone.
const GONE_AT_RELEASE: &str = "the server no longer held the lease at release";

fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// One lease, shared by its guards and its watchdog.
pub(crate) struct Held {
    pub(crate) name: String,
    pub(crate) backend: &'static str,
    pub(crate) fence: Option<u64>,
    pub(crate) lease: Box<dyn BackendLease>,
    pub(crate) lost: CancellationToken,
    pub(crate) renew: bool,
    pub(crate) holds: AtomicUsize,
    timer: Timer,
    /// A strong reference: the lease keeps its renewals going however long
    /// it outlives the `Locker` it came from.
    watchdog: Arc<Watchdog>,
    /// The renewal turn (one permit): one renewal at a time, so results
    /// apply in the order sent. A renewal the backend's task answers
    /// (`renew_then`) holds it until its answer.
    renewing: tokio::sync::Semaphore,
    /// The backend has not refused `renew_then` for this lease.
    then: AtomicBool,
    /// Its last renewal went by `renew_then`: it stays in the queue at its
    /// deadline while the next one is out (see `Watched::while_checked`).
    then_out: AtomicBool,
    failures: AtomicU32,
    ttl: Mutex<Duration>,
    /// The lock-delay: the server keeps the lease this long beyond the
    /// validity the holder counts (renewed with `ttl + delay`).
    delay: Duration,
    valid_until: Mutex<Instant>,
    released: AtomicBool,
    /// The holder abandoned the lease: no hold releases it on the server.
    pub(crate) abandoned: AtomicBool,
    lost_reason: OnceLock<&'static str>,
    lost_at: OnceLock<Instant>,
    /// When it was granted, for the hold's metric.
    started: Instant,
    /// The name is a label of its metrics.
    name_label: bool,
    /// Its end (release, loss, abandon) was counted.
    ended: AtomicBool,
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("fence", &self.fence)
            .field("lost", &self.lost.is_cancelled())
            .field("released", &self.released.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Held {
    /// A new lease from `grant` with the ttl, lock-delay and renewal of
    /// `opts`, watched by `watchdog` from now on.
    pub(crate) fn start(
        name: String,
        backend: &'static str,
        grant: Grant,
        lost: CancellationToken,
        opts: &LockOptions,
        watchdog: Arc<Watchdog>,
    ) -> Arc<Held> {
        let (ttl, delay, renew) = (opts.get_ttl(), opts.get_lock_delay(), opts.get_renew());
        // With a lock-delay the holder counts the server's deadline less the
        // delay. A grant that arrives with less than a renewal interval of
        // that left (a waiter whose lease was kept alive at the server's
        // pace, a slow quorum) counts the server's deadline until its first
        // renewal, which the acquisition makes before it hands the guard
        // out (see `needs_top_up`).
        let valid = if Held::needs_top_up(&grant, ttl, delay) {
            grant.valid_until
        } else {
            grant.valid_until - delay
        };
        let held = Arc::new(Held {
            name,
            backend,
            fence: grant.fence,
            lease: grant.lease,
            lost,
            renew,
            holds: AtomicUsize::new(1),
            timer: Timer::default(),
            watchdog,
            renewing: tokio::sync::Semaphore::new(1),
            then: AtomicBool::new(true),
            then_out: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            ttl: Mutex::new(ttl),
            delay,
            valid_until: Mutex::new(valid),
            released: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            lost_reason: OnceLock::new(),
            lost_at: OnceLock::new(),
            started: crate::raw::now(),
            name_label: opts.get_metrics_name(),
            ended: AtomicBool::new(false),
        });
        observe::gauge(observe::LEASES_HELD, held.labels(), 1.0);
        let first = if renew {
            (crate::raw::now() + renew_interval(ttl)).min(held.valid_until())
        } else {
            held.valid_until() + TIMER_SLACK
        };
        held.schedule(first, true);
        held
    }

    /// Whether a grant with a lock-delay has less than a renewal interval
    /// of the holder's validity left (or none): it must be renewed before
    /// the guard is handed out.
    pub(crate) fn needs_top_up(grant: &Grant, ttl: Duration, delay: Duration) -> bool {
        !delay.is_zero()
            && grant
                .valid_until
                .checked_sub(delay)
                .is_none_or(|v| v < crate::raw::now() + renew_interval(ttl))
    }

    fn schedule(self: &Arc<Self>, at: Instant, new: bool) {
        let me: Arc<dyn Watched> = self.clone();
        self.watchdog.schedule(&me, at, new);
    }

    /// Schedules the next check after `extend` changed the lease (or may
    /// have): a renewal, or the validity deadline, whichever comes first.
    pub(crate) fn rescheduled(self: &Arc<Self>) {
        let next = if self.renew {
            (crate::raw::now() + renew_interval(self.ttl())).min(self.valid_until())
        } else {
            self.valid_until() + TIMER_SLACK
        };
        self.schedule(next, false);
    }

    /// Before a renewal with `ttl` is sent: whatever comes of it (a lost
    /// reply, a dropped call), the server may have shortened the lease to
    /// `ttl` from now, so the lease counts as valid no longer than that, and
    /// the watchdog looks at that deadline.
    pub(crate) fn may_shorten_to(self: &Arc<Self>, ttl: Duration) {
        let bound = self.counted(crate::raw::now(), ttl);
        let lowered = {
            let mut until = lock(&self.valid_until);
            let lower = bound < *until;
            if lower {
                *until = bound;
            }
            lower
        };
        if lowered {
            self.rescheduled();
        }
    }

    /// The validity a renewal with `ttl` sent at `sent` gives the holder:
    /// the server is sent `ttl` plus the lock-delay, and the drift
    /// allowance is taken on that whole ttl (as the backend's reply has
    /// it), then the delay comes off. An allowance on `ttl` alone would
    /// count up to a hundredth of the delay longer, and wear down the
    /// quiet time the delay keeps after the holder's count ends.
    fn counted(&self, sent: Instant, ttl: Duration) -> Instant {
        crate::raw::validity_deadline(sent, ttl + self.delay)
            .checked_sub(self.delay)
            .unwrap_or(sent)
    }

    pub(crate) fn ttl(&self) -> Duration {
        *lock(&self.ttl)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    pub(crate) fn lost_reason(&self) -> Option<&'static str> {
        self.lost_reason.get().copied()
    }

    pub(crate) fn lost_at(&self) -> Option<Instant> {
        self.lost_at.get().copied()
    }

    pub(crate) fn stop_watchdog(&self) {
        self.watchdog.forget(&self.timer);
    }

    /// Resolves when the lost signal is raised. Raises it itself when the
    /// validity deadline passes first, as [`Held::is_held`] does: the
    /// watchdog that would raise it may not run again (its runtime ended).
    /// Holds the lease only weakly (a pending future keeps nothing alive);
    /// never resolves after a release. Off a tokio runtime (no timer to
    /// wait on) it waits for the signal only.
    pub(crate) fn lost_or_lapsed(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let (held, lost) = (Arc::downgrade(self), self.lost.clone());
        async move {
            if tokio::runtime::Handle::try_current().is_err() {
                return lost.cancelled().await;
            }
            loop {
                let until = match held.upgrade() {
                    Some(h) if !h.released.load(Ordering::Acquire) => h.valid_until(),
                    _ => return lost.cancelled().await,
                };
                tokio::select! {
                    () = lost.cancelled() => return,
                    () = tokio::time::sleep_until(until.into()) => {
                        // Renewed meanwhile: wait for the new deadline.
                        if let Some(h) = held.upgrade() {
                            if !h.released.load(Ordering::Acquire) {
                                let _ = h.is_held();
                            }
                        }
                    }
                }
            }
        }
    }

    /// Raises the lost signal (once) with a reason.
    pub(crate) fn mark_lost(&self, reason: &'static str) {
        let _ = self.lost_at.set(crate::raw::now().min(self.valid_until()));
        let first = self.lost_reason.set(reason).is_ok();
        // A loss the holder learns of at its release is a loss too; its
        // own abandon is not.
        let by_release = reason == GONE_AT_RELEASE;
        if first && (by_release || !self.released.load(Ordering::Relaxed)) {
            tracing::warn!(backend = self.backend, name = %self.name, fence = ?self.fence, reason, "lock lease lost");
            if !self.abandoned.load(Ordering::Acquire) {
                observe::count(observe::LEASES_LOST, self.labels(), &[("reason", reason)]);
            }
        }
        self.lost.cancel();
        self.ended();
    }

    /// Drops one hold; true when it was the last one (the lease must go).
    pub(crate) fn drop_hold(&self) -> bool {
        self.holds.fetch_sub(1, Ordering::AcqRel) == 1
    }

    pub(crate) fn is_held(&self) -> bool {
        self.is_held_at(crate::raw::now())
    }

    /// [`Held::is_held`] at `now`, read by the caller.
    fn is_held_at(&self, now: Instant) -> bool {
        if self.released.load(Ordering::Acquire) || self.lost.is_cancelled() {
            return false;
        }
        if now >= self.valid_until() {
            self.mark_lost("the validity deadline passed without a successful renewal");
            return false;
        }
        true
    }

    pub(crate) fn lost_error(&self, what: &str) -> Error {
        let reason = self
            .lost_reason
            .get()
            .copied()
            .unwrap_or("the lease is no longer held");
        Error::new(ErrorKind::Lost, self.backend, format!("{what}: {reason}"))
            .with_name(self.name.clone())
    }

    /// Releases the lease on the server (the last hold is gone).
    /// Waits for a renewal in flight first: a renewal that lands after the
    /// release could take the lease back on the server (RedLock retakes a
    /// key an instance lost).
    pub(crate) async fn release_lease(&self) -> Result<()> {
        let span = tracing::info_span!("lockcore.release", backend = self.backend, name = %self.name, fence = ?self.fence);
        self.release_now().instrument(span).await
    }

    /// [`release_lease`](Held::release_lease), in its span.
    async fn release_now(&self) -> Result<()> {
        self.stop_watchdog();
        if self.abandoned.load(Ordering::Acquire) {
            // Left to end by its ttl, session or connection.
            return Err(self.lost_error("the lease was abandoned"));
        }
        let was_lost = !self.is_held();
        self.released.store(true, Ordering::Release);
        self.ended();
        let _turn = self.turn().await;
        let sent = crate::raw::now();
        let released = self.lease.release().await;
        observe::server_call(self.labels(), "release", sent.elapsed());
        match released {
            Ok(Released::Released) if !was_lost => Ok(()),
            Ok(Released::Released) => Err(self.lost_error(
                "released, but the lease had been lost before (the server still had it)",
            )),
            Ok(Released::NotHeld) => {
                self.mark_lost(GONE_AT_RELEASE);
                Err(self.lost_error("release found the lease gone"))
            }
            Err(e) => Err(e.or_name(&self.name)),
        }
    }

    /// Renews now, with `ttl` from then on if given (else the current ttl);
    /// returns when the renewal was sent. Renewals run one at a time, so
    /// their results apply in the order they were sent: a slow earlier
    /// reply never overwrites a later one.
    pub(crate) async fn renew_now(self: &Arc<Self>, ttl: Option<Duration>) -> Result<Instant> {
        let Some(_turn) = self.turn().await else {
            // A renewal still unanswered at the deadline: lost by now.
            let _ = self.is_held();
            return Err(self.lost_error("cannot renew"));
        };
        // The send time, read once. Read before a shorter ttl's
        // `may_shorten_to` below, it only makes the validity counted from
        // it shorter.
        let sent = crate::raw::now();
        if !self.is_held_at(sent) {
            return Err(self.lost_error("cannot renew"));
        }
        if let Some(t) = ttl {
            if t + self.delay > crate::options::MAX_TTL {
                return Err(Error::invalid_config(
                    self.backend,
                    format!(
                        "ttl {t:?} plus the lock-delay {:?} is beyond the longest ttl {:?}",
                        self.delay,
                        crate::options::MAX_TTL
                    ),
                )
                .with_name(self.name.clone()));
            }
            crate::options::check_delay(t, self.delay).map_err(|why| {
                Error::invalid_config(self.backend, why).with_name(self.name.clone())
            })?;
            // A ttl the lease cannot take is refused before anything
            // changes, on the client as on the server.
            self.lease
                .check_ttl(t + self.delay)
                .map_err(|e| e.or_name(&self.name))?;
            // Under the turn, so that no renewal sent earlier can restore
            // the longer validity afterwards.
            self.may_shorten_to(t);
        }
        let use_ttl = ttl.unwrap_or_else(|| self.ttl());
        let deadline = self.valid_until();
        let outcome =
            tokio::time::timeout_at(deadline.into(), self.lease.renew(use_ttl + self.delay)).await;
        self.settle(sent, crate::raw::now(), ttl, outcome)
    }

    /// Applies the outcome of a renewal sent at `sent` (`Err`: no answer
    /// by the validity deadline), come at `now`, with `ttl` from then on if
    /// given; under the renewal turn. Returns `sent` when renewed.
    fn settle<E>(
        &self,
        sent: Instant,
        now: Instant,
        ttl: Option<Duration>,
        outcome: std::result::Result<Result<Renewal>, E>,
    ) -> Result<Instant> {
        let use_ttl = ttl.unwrap_or_else(|| self.ttl());
        self.renewed(sent, now, &outcome);
        if !matches!(outcome, Ok(Ok(_))) {
            // The request may have applied: a shorter ttl may then have
            // shortened the lease on the server. Count it valid no longer
            // than that would allow.
            let mut until = lock(&self.valid_until);
            *until = (*until).min(self.counted(sent, use_ttl));
        }
        match outcome {
            Ok(Ok(Renewal::Renewed { valid_until })) => {
                if !self.lost.is_cancelled() {
                    // No instant as early as the deadline less the delay
                    // (a clock that starts near zero): nothing is valid.
                    *lock(&self.valid_until) = valid_until.checked_sub(self.delay).unwrap_or(now);
                    if let Some(t) = ttl {
                        *lock(&self.ttl) = t;
                    }
                }
                Ok(sent)
            }
            Ok(Ok(Renewal::Lost)) => {
                self.mark_lost(
                    "renewal refused: the server no longer holds this lease for this owner",
                );
                Err(self.lost_error("renewal refused"))
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Lost => {
                self.mark_lost("the backend reported the lease lost during renewal");
                Err(e.or_name(&self.name))
            }
            Ok(Err(e)) => Err(e.or_name(&self.name)),
            Err(_) => {
                self.mark_lost("the validity deadline passed while a renewal was in flight");
                Err(self.lost_error("renewal did not answer before the validity deadline"))
            }
        }
    }
}

mod observed;
#[cfg(test)]
mod tests;
mod watched;
