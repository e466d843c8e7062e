//! Renewals answered by the backend's own task (`renew_then`): the lease
//! kept on the server, an answer dropped or never given, a late answer,
//! and a release behind a renewal still out.

use super::*;

fn then(then: Then, before: Duration) -> Arc<Faults> {
    Arc::new(Faults {
        then: Some(then),
        before,
        ..Faults::default()
    })
}

const TTL: Duration = Duration::from_secs(3);

fn opts() -> LockOptions {
    LockOptions::new().ttl(TTL).wait(Wait::Try)
}

/// Renewals answered from the backend's task keep the lease on the
/// server; once released, the name is free. An answer given within
/// `renew_then` itself (`Then::AtOnce`) keeps the lease's next renewal
/// where the answer put it: renewed every third of the ttl, not at each
/// validity deadline (where the lease is watched until the answer).
#[tokio::test(start_paused = true)]
async fn renewals_answered_by_the_backends_task_keep_the_lease() {
    for answered in [Then::Answer, Then::AtOnce] {
        let server = MemoryBackend::new();
        let faults = then(answered, Duration::ZERO);
        let g = faulty(&server, &faults)
            .acquire("x", &opts())
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(TTL * 4).await;
        let taken = faults.then_asked.load(SeqCst);
        assert!(
            taken >= 10,
            "{answered:?}: {taken} renewals went by renew_then in 12 s"
        );
        let other = Locker::new(server.clone());
        assert!(
            other.acquire("x", &opts()).await.unwrap().is_none(),
            "{answered:?}: the server let the name go"
        );
        g.release().await.unwrap();
        assert!(other.acquire("x", &opts()).await.unwrap().is_some());
    }
}

/// A renewal dropped unanswered (the backend's task ended) is a failed
/// renewal: retried while the lease is valid, and the lease is kept.
#[tokio::test(start_paused = true)]
async fn a_renewal_dropped_unanswered_is_retried() {
    let server = MemoryBackend::new();
    let faults = then(Then::DropFirst, Duration::ZERO);
    let g = faulty(&server, &faults)
        .acquire("x", &opts())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(TTL * 3).await;
    assert!(faults.then_asked.load(SeqCst) >= 2);
    let other = Locker::new(server.clone());
    assert!(
        other.acquire("x", &opts()).await.unwrap().is_none(),
        "the server let the name go"
    );
    assert!(g.lost_reason().is_none(), "{:?}", g.lost_reason());
    g.release().await.unwrap();
}

/// A lease taken on a backend with `faults`, and how long after it was
/// asked for its lost signal (the token itself, not the guard's `lost`,
/// which watches the deadline on its own) was raised, within `within`.
async fn lost_after(faults: &Arc<Faults>, within: Duration) -> (crate::LockGuard, Duration) {
    let started = tokio::time::Instant::now();
    let g = faulty(&MemoryBackend::new(), faults)
        .acquire("x", &opts())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(within, g.lost_token().cancelled())
        .await
        .expect("the lost signal was raised");
    (g, started.elapsed())
}

/// A renewal the backend never answers: the lost signal (the token
/// itself, not the guard's `lost`, which watches the deadline on its own)
/// is raised at the validity deadline, and a release does not wait for
/// the answer past it.
#[tokio::test(start_paused = true)]
async fn a_renewal_never_answered_is_lost_at_the_deadline() {
    let faults = then(Then::Never, Duration::ZERO);
    let (g, at) = lost_after(&faults, TTL * 2).await;
    assert!(
        at >= TTL * 9 / 10 && at <= TTL + Duration::from_millis(50),
        "lost after {at:?}"
    );
    assert_eq!(faults.then_asked.load(SeqCst), 1);
    let released = tokio::time::timeout(Duration::from_secs(1), g.release())
        .await
        .expect("the release waited for a renewal never answered");
    assert!(released.is_err(), "a lost lease released cleanly");
}

/// A renewal never answered after others were: the lease is watched at
/// its deadline from as it comes due (its last renewal went the same
/// way), and the lost signal is raised there, a ttl after the last answered
/// renewal was sent.
#[tokio::test(start_paused = true)]
async fn a_later_renewal_never_answered_is_lost_at_its_deadline() {
    let faults = then(Then::AnswerFirst(2), Duration::ZERO);
    let (_g, at) = lost_after(&faults, TTL * 3).await;
    // Renewals go out every third of the ttl, the second (the last
    // answered) at about two thirds of it.
    let last = TTL * 2 / 3;
    assert!(
        at >= last + TTL * 9 / 10 && at <= last + TTL + Duration::from_millis(50),
        "lost after {at:?}"
    );
    assert_eq!(faults.then_asked.load(SeqCst), 3);
}

/// Renewals of leases of two handles (two watchdogs) answered together,
/// as a backend's task answers the renewals of one reply: each lease goes
/// back in its own watchdog's queue and gets its turn back, so its next
/// renewal goes out a third of the ttl later.
#[tokio::test(start_paused = true)]
async fn renewals_answered_together_go_back_to_their_own_watchdogs() {
    let server = MemoryBackend::new();
    let faults = then(Then::Never, Duration::ZERO);
    let (one, two) = (faulty(&server, &faults), faulty(&server, &faults));
    let a = one.acquire("a", &opts()).await.unwrap().unwrap();
    let b = two.acquire("b", &opts()).await.unwrap().unwrap();
    tokio::time::sleep(TTL / 3 + Duration::from_millis(100)).await;
    let out = std::mem::take(&mut *crate::raw::sync::lock(&faults.unanswered));
    assert_eq!(out.len(), 2, "both leases' first renewals are out");
    let mut answers = crate::raw::Answers::new();
    for done in out {
        let valid_until = crate::raw::validity_deadline(done.sent(), TTL);
        done.answer_with(Ok(Renewal::Renewed { valid_until }), &mut answers);
    }
    drop(answers);
    tokio::time::sleep(TTL / 3).await;
    assert_eq!(
        faults.then_asked.load(SeqCst),
        4,
        "each lease's next renewal went out"
    );
    assert!(a.lost_reason().is_none() && b.lost_reason().is_none());
}

/// An answer that comes after the validity deadline does not bring the
/// lease back: it was lost at the deadline (the watchdog looks there
/// while the answer is out) and stays lost, its validity not extended by
/// the late reply.
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_after_the_deadline_is_none() {
    let server = MemoryBackend::new();
    // The first renewal is sent at 1 s and answered at 3.5 s.
    let faults = then(Then::Answer, Duration::from_millis(2500));
    let g = faulty(&server, &faults)
        .acquire("x", &opts())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(TTL * 2, g.lost_token().cancelled())
        .await
        .expect("the lost signal was raised");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!g.is_held());
    let reason = g.lost_reason().unwrap_or_default();
    assert!(reason.contains("validity deadline"), "lost: {reason}");
}

/// A release waits for the renewal the backend's task has not answered
/// yet: a renewal that lands after the release could take the lease back
/// on the server.
#[tokio::test(start_paused = true)]
async fn a_release_waits_for_the_renewal_the_backend_answers() {
    let faults = then(Then::Answer, Duration::from_millis(500));
    let g = faulty(&MemoryBackend::new(), &faults)
        .acquire("x", &opts())
        .await
        .unwrap()
        .unwrap();
    // Renewed at 1 s, in flight until 1.5 s.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(faults.renewing.load(SeqCst));
    g.release().await.unwrap();
    assert!(
        !faults.overlapped.load(SeqCst),
        "the release ran while a renewal was in flight"
    );
}
