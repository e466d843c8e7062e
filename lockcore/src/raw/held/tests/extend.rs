//! Extends and renewals whose replies are late, lost or dropped: the
//! client never counts the lease valid past what the server may keep.

use super::*;

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
