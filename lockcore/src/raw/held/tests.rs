//! A held lease's renewals, lost signal and release, on faulty backends.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::locker::Locker;
use crate::memory::MemoryBackend;
use crate::options::{LockOptions, Wait};
use crate::raw::{AcquireRequest, Backend, BackendLease, Grant, Released, Renewal};

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
    /// Every renewal panics.
    panics: bool,
    /// Renewals answered at once (`renew_known`): by the server's renewal
    /// (`Some(true)`), or as lost (`Some(false)`).
    known: Option<bool>,
    /// Renewals asked of `renew`.
    asked: std::sync::atomic::AtomicUsize,
    /// Renewals taken by `renew_then`, and what becomes of them.
    then: Option<Then>,
    /// Renewals taken by `renew_then`.
    then_asked: std::sync::atomic::AtomicUsize,
    /// The renewals `renew_then` keeps unanswered.
    unanswered: Mutex<Vec<crate::raw::Renewing>>,
}

/// What a [`Faulty`] backend does with a renewal given to `renew_then`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Answered from a task of its own, as `renew` would answer.
    Answer,
    /// The first dropped unanswered, the others answered.
    DropFirst,
    /// Kept, never answered.
    Never,
    /// The first this many answered, as `Answer`; the rest never.
    AnswerFirst(usize),
    /// Answered before `renew_then` returns, with the memory server's
    /// own answer (no faults, no drift allowance).
    AtOnce,
}

impl Faults {
    /// Every renewal's reply lost after the server applied it.
    fn losing_replies() -> Arc<Faults> {
        Arc::new(Faults {
            lose_replies: true,
            ..Faults::default()
        })
    }

    fn late<const N: usize>(delays: [Duration; N]) -> Arc<Faults> {
        Arc::new(Faults {
            late: Mutex::new(delays.into()),
            ..Faults::default()
        })
    }
}

/// The memory server behind a faulty network: its own lost signal does
/// not reach the client, its renewals count their validity as a networked
/// server's do, and they go wrong as its `Faults` say.
#[derive(Debug, Clone)]
struct Faulty {
    server: MemoryBackend,
    faults: Arc<Faults>,
}

#[derive(Debug)]
struct FaultyLease {
    inner: Arc<dyn BackendLease>,
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
                inner: g.lease.into(),
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
        f.asked.fetch_add(1, SeqCst);
        assert!(!f.panics, "a renewal that panics");
        f.renewing.store(true, SeqCst);
        let sent = crate::raw::now();
        tokio::time::sleep(f.before).await;
        // Counted as a networked backend counts it: from the send, less
        // the drift allowance (the memory server's own count has none).
        let r = self.inner.renew(ttl).await.map(|r| match r {
            Renewal::Renewed { .. } => Renewal::Renewed {
                valid_until: crate::raw::validity_deadline(sent, ttl),
            },
            lost => lost,
        });
        f.renewing.store(false, SeqCst);
        let late = crate::raw::sync::lock(&f.late)
            .pop_front()
            .unwrap_or_default();
        tokio::time::sleep(late).await;
        if f.lose_replies {
            return Err(crate::error::Error::new(
                crate::error::ErrorKind::Indeterminate,
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

    fn renew_then(
        &self,
        ttl: Duration,
        done: crate::raw::Renewing,
    ) -> std::result::Result<(), crate::raw::Renewing> {
        let Some(then) = self.faults.then else {
            return Err(done);
        };
        let n = self.faults.then_asked.fetch_add(1, SeqCst);
        match then {
            Then::Never => crate::raw::sync::lock(&self.faults.unanswered).push(done),
            Then::AnswerFirst(first) if n >= first => {
                crate::raw::sync::lock(&self.faults.unanswered).push(done);
            }
            Then::AtOnce => {
                use futures_util::FutureExt;
                let renewed = self.inner.renew(ttl).now_or_never();
                done.answer(renewed.expect("the memory server renews at once"));
            }
            Then::DropFirst if n == 0 => drop(done),
            Then::Answer | Then::DropFirst | Then::AnswerFirst(_) => {
                let lease = FaultyLease {
                    inner: self.inner.clone(),
                    faults: self.faults.clone(),
                };
                tokio::spawn(async move { done.answer(lease.renew(ttl).await) });
            }
        }
        Ok(())
    }

    fn renew_known(&self, ttl: Duration) -> Option<Renewal> {
        use futures_util::FutureExt;
        match self.faults.known? {
            // The memory server renews without waiting; counted as `renew`
            // counts it.
            true => {
                let sent = crate::raw::now();
                match self.inner.renew(ttl).now_or_never()?.ok()? {
                    Renewal::Renewed { .. } => Some(Renewal::Renewed {
                        valid_until: crate::raw::validity_deadline(sent, ttl),
                    }),
                    lost => Some(lost),
                }
            }
            false => Some(Renewal::Lost),
        }
    }
}

/// Renewals the backend answers at once keep the lease on the server with
/// no `renew` call; an answer of lost raises the lost signal at once.
#[tokio::test(start_paused = true)]
async fn renewals_answered_at_once_ask_nothing_more() {
    let server = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let opts = LockOptions::new().ttl(ttl).wait(Wait::Try);
    for known in [true, false] {
        let faults = Arc::new(Faults {
            known: Some(known),
            ..Faults::default()
        });
        let l = faulty(&server, &faults);
        let g = l.acquire("x", &opts).await.unwrap().unwrap();
        tokio::time::sleep(ttl * 4).await;
        assert_eq!(faults.asked.load(SeqCst), 0, "renew was asked");
        let other = Locker::new(server.clone());
        let taken = other.acquire("x", &opts).await.unwrap();
        if known {
            assert!(taken.is_none(), "the server let the name go");
            assert!(g.is_held());
            g.release().await.unwrap();
        } else {
            assert!(taken.is_some(), "the name is still held");
            let reason = g.lost_reason().unwrap_or_default();
            assert!(reason.starts_with("renewal refused"), "lost: {reason}");
        }
    }
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

/// A renewal that panics raises the lost signal (the lease is no longer
/// renewed), rather than leaving the holder waiting on a signal that
/// would never come while the server lets the lease go.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_panics_raises_lost() {
    let server = MemoryBackend::new();
    let faults = Arc::new(Faults {
        panics: true,
        ..Faults::default()
    });
    let locker = faulty(&server, &faults);
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .wait(Wait::Try);
    let g = locker.acquire("panics", &opts).await.unwrap().unwrap();
    // The first renewal is due after a second; the lease is valid 3 s.
    tokio::time::timeout(Duration::from_millis(1500), g.lost())
        .await
        .expect("lost fired when the renewal panicked");
    assert!(
        g.lost_reason().is_some_and(|r| r.contains("panicked")),
        "{:?}",
        g.lost_reason()
    );
}

/// The memory backend answers a renewal at once (the watchdog makes no
/// future for it): renewed from now by the ttl while the map has the
/// holder, lost once it does not.
#[tokio::test(start_paused = true)]
async fn memory_renewals_are_answered_at_once() {
    use crate::raw::{Deadline, Mode, OwnerToken};
    let server = MemoryBackend::new();
    let ttl = Duration::from_secs(3);
    let lost = tokio_util::sync::CancellationToken::new();
    let req = AcquireRequest {
        name: "x",
        owner: OwnerToken::random(),
        ttl,
        lock_delay: Duration::ZERO,
        deadline: Deadline::Now,
        lost: &lost,
        value: None,
        mode: Mode::Exclusive,
        renew: true,
    };
    let lease = server.acquire(req).await.unwrap().unwrap().lease;
    tokio::time::sleep(ttl / 2).await;
    let asked = crate::raw::now();
    match lease.renew_known(ttl) {
        Some(Renewal::Renewed { valid_until }) => assert_eq!(valid_until, asked + ttl),
        other => panic!("renewal answered {other:?}"),
    }
    // Still held on the server a whole ttl after the renewal, not after
    // the grant.
    tokio::time::sleep(ttl - Duration::from_millis(1)).await;
    let other = Locker::new(server.clone());
    let opts = LockOptions::new().ttl(ttl).wait(Wait::Try);
    assert!(other.acquire("x", &opts).await.unwrap().is_none());
    tokio::time::sleep(Duration::from_millis(2)).await;
    let taken = other.acquire("x", &opts).await.unwrap().unwrap();
    assert!(matches!(lease.renew_known(ttl), Some(Renewal::Lost)));
    taken.release().await.unwrap();
}

mod extend;
mod then;
