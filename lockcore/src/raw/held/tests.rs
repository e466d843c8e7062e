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
        let _ = tokio::time::timeout(Duration::from_millis(600), g.extend(Duration::from_secs(1)))
            .await;
    });
    first.unwrap();
    let info = server.inspect("x").await.unwrap().unwrap();
    let left = info.holder.unwrap().ttl_remaining.unwrap();
    let server_expiry = crate::raw::now() + left;
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
    let l = faulty(&server, &Faults::losing_replies());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::Try)
        .renew(false);
    let g = l.acquire("x", &opts).await.unwrap().unwrap();
    let err = g.extend(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(err.kind(), crate::error::ErrorKind::Indeterminate);
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
    let l = faulty(&server, &Faults::losing_replies());
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
        tokio::time::timeout(Duration::from_millis(100), g.extend(Duration::from_secs(1))).await;
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

/// With a lock-delay, an extend whose reply is lost leaves the lease
/// counted valid no longer than the reply would have: the drift allowance
/// is taken on the ttl the server was sent (ttl and delay together), as a
/// renewal's reply has it, so the delay's quiet time after the holder's
/// count is not worn down.
#[tokio::test(start_paused = true)]
async fn a_lost_reply_with_a_lock_delay_counts_no_longer_than_the_reply() {
    let server = MemoryBackend::new();
    let answered = faulty(&server, &Arc::new(Faults::default()));
    let unanswered = faulty(&server, &Faults::losing_replies());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .lock_delay(Duration::from_secs(10))
        .wait(Wait::Try)
        .renew(false);
    let a = answered.acquire("a", &opts).await.unwrap().unwrap();
    let b = unanswered.acquire("b", &opts).await.unwrap().unwrap();
    let sent_a = crate::raw::now();
    a.extend(Duration::from_secs(1)).await.unwrap();
    let span_a = a.valid_until().unwrap() - sent_a;
    let sent_b = crate::raw::now();
    assert!(b.extend(Duration::from_secs(1)).await.is_err());
    let span_b = b.valid_until().unwrap() - sent_b;
    assert!(
        span_b <= span_a,
        "a lost reply counts the lease valid {:?} from its send, the reply {span_a:?}",
        span_b
    );
}
