//! The state of one held lease, shared by its guards (one per hold) and the
//! watchdog: validity, renewal in send order, the lost signal, release.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backend::{BackendLease, Grant, Released, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::retry::Backoff;
use crate::sync::lock;
use crate::watchdog::{CheckFuture, Timer, Watchdog, Watched};

/// The queue's resolution is a millisecond and may fire up to one early:
/// deadlines checked for having passed are scheduled this much later.
const TIMER_SLACK: Duration = Duration::from_millis(1);

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
    /// One renewal at a time, so results apply in the order sent.
    renewing: tokio::sync::Mutex<()>,
    failures: AtomicU32,
    ttl: Mutex<Duration>,
    valid_until: Mutex<Instant>,
    released: AtomicBool,
    /// The holder abandoned the lease: no hold releases it on the server.
    pub(crate) abandoned: AtomicBool,
    lost_reason: OnceLock<&'static str>,
    lost_at: OnceLock<Instant>,
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
    /// A new lease from `grant`, watched by `watchdog` from now on.
    pub(crate) fn start(
        name: String,
        backend: &'static str,
        grant: Grant,
        lost: CancellationToken,
        ttl: Duration,
        renew: bool,
        watchdog: Arc<Watchdog>,
    ) -> Arc<Held> {
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
            renewing: tokio::sync::Mutex::new(()),
            failures: AtomicU32::new(0),
            ttl: Mutex::new(ttl),
            valid_until: Mutex::new(grant.valid_until),
            released: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            lost_reason: OnceLock::new(),
            lost_at: OnceLock::new(),
        });
        let first = if renew {
            (crate::backend::now() + renew_interval(ttl)).min(held.valid_until())
        } else {
            held.valid_until() + TIMER_SLACK
        };
        held.schedule(first, true);
        held
    }

    fn schedule(self: &Arc<Self>, at: Instant, new: bool) {
        let me: Arc<dyn Watched> = self.clone();
        self.watchdog.schedule(&me, at, new);
    }

    /// Schedules the next check after `extend` changed the lease (or may
    /// have): a renewal, or the validity deadline, whichever comes first.
    pub(crate) fn rescheduled(self: &Arc<Self>) {
        let next = if self.renew {
            (crate::backend::now() + renew_interval(self.ttl())).min(self.valid_until())
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
        let bound = crate::backend::validity_deadline(crate::backend::now(), ttl);
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

    /// Raises the lost signal (once) with a reason.
    pub(crate) fn mark_lost(&self, reason: &'static str) {
        let _ = self
            .lost_at
            .set(crate::backend::now().min(self.valid_until()));
        if self.lost_reason.set(reason).is_ok() && !self.released.load(Ordering::Relaxed) {
            tracing::warn!(backend = self.backend, name = %self.name, fence = ?self.fence, reason, "lock lease lost");
        }
        self.lost.cancel();
    }

    /// Drops one hold; true when it was the last one (the lease must go).
    pub(crate) fn drop_hold(&self) -> bool {
        self.holds.fetch_sub(1, Ordering::AcqRel) == 1
    }

    pub(crate) fn is_held(&self) -> bool {
        if self.released.load(Ordering::Acquire) || self.lost.is_cancelled() {
            return false;
        }
        if crate::backend::now() >= self.valid_until() {
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
        self.stop_watchdog();
        if self.abandoned.load(Ordering::Acquire) {
            // Left to end by its ttl, session or connection.
            return Err(self.lost_error("the lease was abandoned"));
        }
        let was_lost = !self.is_held();
        self.released.store(true, Ordering::Release);
        let _turn = self.renewing.lock().await;
        match self.lease.release().await {
            Ok(Released::Released) if !was_lost => Ok(()),
            Ok(Released::Released) => Err(self.lost_error(
                "released, but the lease had been lost before (the server still had it)",
            )),
            Ok(Released::NotHeld) => {
                self.mark_lost("the server no longer held the lease at release");
                Err(self.lost_error("release found the lease gone"))
            }
            Err(e) => Err(e.or_name(&self.name)),
        }
    }

    /// Renews now, with `ttl` from then on if given (else the current ttl).
    /// Renewals run one at a time, so their results apply in the order they
    /// were sent: a slow earlier reply never overwrites a later one.
    pub(crate) async fn renew_now(self: &Arc<Self>, ttl: Option<Duration>) -> Result<()> {
        let _turn = self.renewing.lock().await;
        if !self.is_held() {
            return Err(self.lost_error("cannot renew"));
        }
        if let Some(t) = ttl {
            // A ttl the lease cannot take is refused before anything
            // changes, on the client as on the server.
            self.lease.check_ttl(t).map_err(|e| e.or_name(&self.name))?;
            // Under the turn, so that no renewal sent earlier can restore
            // the longer validity afterwards.
            self.may_shorten_to(t);
        }
        let use_ttl = ttl.unwrap_or_else(|| self.ttl());
        let deadline = self.valid_until();
        let sent = crate::backend::now();
        let outcome = tokio::time::timeout_at(deadline.into(), self.lease.renew(use_ttl)).await;
        if !matches!(outcome, Ok(Ok(_))) {
            // The request may have applied: a shorter ttl may then have
            // shortened the lease on the server. Count it valid no longer
            // than that would allow.
            let mut until = lock(&self.valid_until);
            *until = (*until).min(crate::backend::validity_deadline(sent, use_ttl));
        }
        match outcome {
            Ok(Ok(Renewal::Renewed { valid_until })) => {
                if !self.lost.is_cancelled() {
                    *lock(&self.valid_until) = valid_until;
                    if let Some(t) = ttl {
                        *lock(&self.ttl) = t;
                    }
                }
                Ok(())
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

    /// The watchdog's check: renew (or look again at the validity deadline
    /// when renewal is off); retry a failed renewal with jittered backoff
    /// while the lease is valid; stop once it is lost or released.
    async fn watchdog_check(self: Arc<Self>) -> Option<Instant> {
        if !self.is_held() {
            // Released, lost, or its validity deadline passed (is_held raised
            // the lost signal then).
            return None;
        }
        if !self.renew {
            // Not due yet (the deadline was moved by extend): look again then.
            return Some(self.valid_until() + TIMER_SLACK);
        }
        let sent = crate::backend::now();
        match self.renew_now(None).await {
            Ok(()) => {
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
                Some((crate::backend::now() + delay).min(self.valid_until()))
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
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use async_trait::async_trait;

    use crate::backend::{AcquireRequest, Backend, BackendLease, Grant, Released, Renewal};
    use crate::memory::MemoryBackend;
    use crate::{Capabilities, LockOptions, Locker, Result, Wait};

    /// What goes wrong with the renewals of a [`Faulty`] backend.
    #[derive(Debug, Default)]
    struct Faults {
        /// How long each renewal takes before it reaches the server.
        before: Duration,
        /// Per renewal, how long its reply is held after the server applied
        /// it.
        late: Mutex<VecDeque<Duration>>,
        /// Every renewal's reply is lost after the server applied it.
        lose_replies: bool,
        /// A renewal is on its way.
        renewing: AtomicBool,
        /// A release ran while a renewal was on its way.
        overlapped: AtomicBool,
    }

    impl Faults {
        fn late<const N: usize>(delays: [Duration; N]) -> Arc<Faults> {
            Arc::new(Faults {
                late: Mutex::new(delays.into()),
                ..Faults::default()
            })
        }
    }

    /// The memory server behind a faulty network: its own lost signal does
    /// not reach the client (as with a networked server), and its renewals
    /// go wrong as its `Faults` say.
    #[derive(Debug, Clone)]
    struct Faulty {
        server: MemoryBackend,
        faults: Arc<Faults>,
    }

    #[derive(Debug)]
    struct FaultyLease {
        inner: Box<dyn BackendLease>,
        faults: Arc<Faults>,
    }

    fn faulty(server: &MemoryBackend, faults: &Arc<Faults>) -> Locker {
        Locker::new(Faulty {
            server: server.clone(),
            faults: faults.clone(),
        })
    }

    #[async_trait]
    impl Backend for Faulty {
        fn name(&self) -> &'static str {
            "faulty"
        }

        fn capabilities(&self) -> Capabilities {
            self.server.capabilities()
        }

        async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
            let unseen = tokio_util::sync::CancellationToken::new();
            let req = AcquireRequest {
                lost: &unseen,
                ..req
            };
            Ok(self.server.acquire(req).await?.map(|g| Grant {
                lease: Box::new(FaultyLease {
                    inner: g.lease,
                    faults: self.faults.clone(),
                }),
                ..g
            }))
        }
    }

    #[async_trait]
    impl BackendLease for FaultyLease {
        async fn renew(&self, ttl: Duration) -> Result<Renewal> {
            let f = &self.faults;
            f.renewing.store(true, SeqCst);
            tokio::time::sleep(f.before).await;
            let r = self.inner.renew(ttl).await;
            f.renewing.store(false, SeqCst);
            let late = crate::sync::lock(&f.late).pop_front().unwrap_or_default();
            tokio::time::sleep(late).await;
            if f.lose_replies {
                return Err(crate::Error::new(
                    crate::ErrorKind::Indeterminate,
                    "faulty",
                    "the reply was lost",
                ));
            }
            r
        }

        async fn release(&self) -> Result<Released> {
            if self.faults.renewing.load(SeqCst) {
                self.faults.overlapped.store(true, SeqCst);
            }
            self.inner.release().await
        }

        fn abandon(&self) {
            self.inner.abandon();
        }
    }

    /// `extend(1 s)` sent while the reply to an earlier `extend(30 s)` is
    /// still on its way: the server keeps the later one (1 s), and so must
    /// the client, whatever order the replies arrive in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_apply_in_the_order_sent() {
        let server = MemoryBackend::new();
        let l = faulty(
            &server,
            &Faults::late([Duration::from_millis(300), Duration::ZERO]),
        );
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Wait::Try)
            .renew(false);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        let (first, second) = tokio::join!(g.extend(Duration::from_secs(30)), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.extend(Duration::from_secs(1)).await
        });
        first.unwrap();
        second.unwrap();
        let info = server.inspect("x").await.unwrap().unwrap();
        let left = info.holder.unwrap().ttl_remaining.unwrap();
        let server_expiry = Instant::now() + left;
        let client = g.valid_until().unwrap();
        assert!(
            client <= server_expiry + Duration::from_millis(5),
            "the client counts the lease valid {:?} past the server's expiry",
            client.saturating_duration_since(server_expiry)
        );
        assert_eq!(g.ttl(), Duration::from_secs(1));
    }

    /// A shorter extend dropped in flight, behind a longer renewal that was
    /// in flight when it began: the longer renewal's reply must not restore
    /// the longer validity over the shorter one, which may have applied.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_shorter_extend_behind_a_renewal_shortens_validity() {
        let server = MemoryBackend::new();
        let l = faulty(
            &server,
            &Faults::late([Duration::from_millis(300), Duration::from_secs(2)]),
        );
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Wait::Try)
            .renew(false);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        let (first, _) = tokio::join!(g.extend(Duration::from_secs(30)), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ =
                tokio::time::timeout(Duration::from_millis(600), g.extend(Duration::from_secs(1)))
                    .await;
        });
        first.unwrap();
        let info = server.inspect("x").await.unwrap().unwrap();
        let left = info.holder.unwrap().ttl_remaining.unwrap();
        let server_expiry = crate::backend::now() + left;
        let client = g.valid_until().unwrap();
        assert!(
            client <= server_expiry + Duration::from_millis(5),
            "the client counts the lease valid {:?} past the server's expiry",
            client.saturating_duration_since(server_expiry)
        );
    }

    /// `extend` to a shorter ttl whose reply is lost may have shortened the
    /// lease on the server: the client must count it valid no longer than
    /// the shorter ttl allows (found by the simulation, seed 341).
    #[tokio::test]
    async fn a_shorter_extend_that_may_have_applied_shortens_validity() {
        let server = MemoryBackend::new();
        let l = faulty(
            &server,
            &Arc::new(Faults {
                lose_replies: true,
                ..Faults::default()
            }),
        );
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Wait::Try)
            .renew(false);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        let err = g.extend(Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Indeterminate);
        let info = server.inspect("x").await.unwrap().unwrap();
        let left = info.holder.unwrap().ttl_remaining.unwrap();
        let server_expiry = Instant::now() + left;
        let client = g.valid_until().unwrap();
        assert!(
            client <= server_expiry + Duration::from_millis(5),
            "the client counts the lease valid {:?} past the server's expiry",
            client.saturating_duration_since(server_expiry)
        );
    }

    /// The shortened validity is watched: the lost signal fires when it
    /// passes, without anyone asking `is_held`, while another client may
    /// already hold the name; not at the watchdog's next renewal, which was
    /// scheduled for the longer ttl.
    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_the_deadline_a_shorter_extend_set() {
        let server = MemoryBackend::new();
        let l = faulty(
            &server,
            &Arc::new(Faults {
                lose_replies: true,
                ..Faults::default()
            }),
        );
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Wait::Try);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        assert!(g.extend(Duration::from_secs(1)).await.is_err());
        let other = Locker::new(server.clone());
        let taken = other
            .acquire(
                "x",
                &LockOptions::new().wait(Wait::For(Duration::from_secs(5))),
            )
            .await
            .unwrap();
        assert!(taken.is_some(), "the server freed the name after 1 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            tokio::time::timeout(Duration::ZERO, g.lost()).await.is_ok(),
            "the lost signal had not fired while another client held the name"
        );
    }

    /// A shorter extend dropped while in flight may have applied: the
    /// client counts the lease valid no longer than the shorter ttl allows.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_shorter_extend_shortens_validity() {
        let server = MemoryBackend::new();
        let l = faulty(&server, &Faults::late([Duration::from_secs(60)]));
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Wait::Try)
            .renew(false);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        // The renewal applies on the server at once; its reply is slow, and
        // the call is dropped before it comes.
        let dropped =
            tokio::time::timeout(Duration::from_millis(100), g.extend(Duration::from_secs(1)))
                .await;
        assert!(dropped.is_err(), "the extend was not cut short");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            tokio::time::timeout(Duration::ZERO, g.lost()).await.is_ok(),
            "the client counts the lease valid after the server let it go"
        );
    }

    /// A release waits for the renewal in flight: a renewal that lands after
    /// the release could take the lease back on the server (RedLock retakes
    /// a key an instance lost).
    #[tokio::test(start_paused = true)]
    async fn a_release_waits_for_the_renewal_in_flight() {
        let backend = Arc::new(Faults {
            before: Duration::from_millis(500),
            ..Faults::default()
        });
        let l = faulty(&MemoryBackend::new(), &backend);
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(3))
            .wait(Wait::Try);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        // The watchdog renews at 1 s; its renewal is in flight until 1.5 s.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(backend.renewing.load(SeqCst));
        g.release().await.unwrap();
        assert!(
            !backend.overlapped.load(SeqCst),
            "the release ran while a renewal was in flight"
        );
    }
}
