//! Metrics of lock operations on the memory backend, seen by a debugging
//! recorder of the `metrics` facade (`spans.rs` has their spans).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockcore::observe::{
    ACQUIRE_WAIT, ACQUISITIONS, HANDOFFS, HOLD, LEASES_HELD, LEASES_LOST, RENEWALS, SERVER_CALL,
};
use lockcore::{LockOptions, Locker, Wait};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// The process's recorder (installed once: the tests of this file share
/// it, and tell their metrics apart by the lock names they use).
fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let s = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        s
    })
}

/// One metric's value by its name and labels (all of `labels`, no other).
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Count(u64),
    Gauge(f64),
    Samples(usize),
}

/// Every metric's value so far: a snapshot takes the values out of the
/// recorder (counters and gauges back to zero, histograms emptied), so
/// they are summed here.
fn kept() -> &'static Mutex<HashMap<String, Seen>> {
    static S: OnceLock<Mutex<HashMap<String, Seen>>> = OnceLock::new();
    S.get_or_init(Mutex::default)
}

fn value(metric: &str, labels: &[(&str, &str)]) -> Option<Seen> {
    let mut want: Vec<(&str, &str)> = labels.to_vec();
    want.sort_unstable();
    let mut kept = kept().lock().unwrap();
    for (key, _, _, v) in snapshotter().snapshot().into_vec() {
        let k = key.key();
        let mut got: Vec<(&str, &str)> = k.labels().map(|l| (l.key(), l.value())).collect();
        got.sort_unstable();
        let id = format!("{} {got:?}", k.name());
        let was = kept.get(&id).cloned();
        let now = match (key.kind(), v, was) {
            (MetricKind::Counter, DebugValue::Counter(n), Some(Seen::Count(m))) => {
                Seen::Count(n + m)
            }
            (MetricKind::Counter, DebugValue::Counter(n), _) => Seen::Count(n),
            (MetricKind::Gauge, DebugValue::Gauge(g), Some(Seen::Gauge(h))) => {
                Seen::Gauge(g.into_inner() + h)
            }
            (MetricKind::Gauge, DebugValue::Gauge(g), _) => Seen::Gauge(g.into_inner()),
            (_, DebugValue::Histogram(h), Some(Seen::Samples(m))) => Seen::Samples(h.len() + m),
            (_, DebugValue::Histogram(h), _) => Seen::Samples(h.len()),
            (_, other, _) => panic!("{metric}: {other:?}"),
        };
        kept.insert(id, now);
    }
    let mut id_want = want.clone();
    id_want.sort_unstable();
    kept.get(&format!("{metric} {id_want:?}")).cloned()
}

/// Waits (up to 10 s) for `metric` with `labels` to be `want`.
async fn until(metric: &str, labels: &[(&str, &str)], want: Seen) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = value(metric, labels);
        if got.as_ref() == Some(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{metric} {labels:?}: {got:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn acquisitions_holds_renewals_and_losses_are_counted() {
    snapshotter();
    let l = Locker::memory().with_defaults(LockOptions::new().metrics_name(true));
    let n = "observe/counted";
    let at = |more: &[(&'static str, &'static str)]| {
        let mut v = vec![("backend", "memory"), ("name", n)];
        v.extend_from_slice(more);
        v
    };
    let granted = at(&[("primitive", "lock"), ("result", "granted")]);
    let opts = LockOptions::new()
        .metrics_name(true)
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let g = l.acquire(n, &opts).await.unwrap().expect("free");
    assert_eq!(value(ACQUISITIONS, &granted), Some(Seen::Count(1)));
    assert_eq!(value(ACQUIRE_WAIT, &granted), Some(Seen::Samples(1)));
    assert_eq!(value(LEASES_HELD, &at(&[])), Some(Seen::Gauge(1.0)));
    let call = at(&[("operation", "acquire")]);
    assert_eq!(value(SERVER_CALL, &call), Some(Seen::Samples(1)));

    assert!(l.try_lock(n).await.unwrap().is_none());
    let contended = at(&[("primitive", "lock"), ("result", "contended")]);
    assert_eq!(value(ACQUISITIONS, &contended), Some(Seen::Count(1)));
    l.lock_timeout(n, Duration::from_millis(50))
        .await
        .unwrap_err();
    let timed_out = at(&[("primitive", "lock"), ("result", "timed_out")]);
    assert_eq!(value(ACQUISITIONS, &timed_out), Some(Seen::Count(1)));
    let err = l.try_lock("").await.unwrap_err();
    assert_eq!(err.kind(), lockcore::ErrorKind::InvalidName);

    // A 1 s ttl is renewed every third of a second.
    until(RENEWALS, &at(&[("result", "ok")]), Seen::Count(2)).await;
    g.release().await.unwrap();
    assert_eq!(value(LEASES_HELD, &at(&[])), Some(Seen::Gauge(0.0)));
    assert_eq!(value(HOLD, &at(&[])), Some(Seen::Samples(1)));
    let call = at(&[("operation", "release")]);
    assert_eq!(value(SERVER_CALL, &call), Some(Seen::Samples(1)));

    let lapsing = opts.renew(false);
    let g = l.acquire(n, &lapsing).await.unwrap().expect("free");
    g.lost().await;
    let reason = g.lost_reason().expect("a reason");
    until(LEASES_LOST, &at(&[("reason", reason)]), Seen::Count(1)).await;
    assert_eq!(value(LEASES_HELD, &at(&[])), Some(Seen::Gauge(0.0)));
    assert_eq!(value(HOLD, &at(&[])), Some(Seen::Samples(2)));
    drop(g);
}

#[tokio::test]
async fn renewals_without_the_name_are_counted() {
    snapshotter();
    let l = Locker::memory();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let ok = [("backend", "memory"), ("result", "ok")];
    let call = [("backend", "memory"), ("operation", "renew")];
    let count = |v: Option<Seen>| match v {
        Some(Seen::Count(n)) => n,
        _ => 0,
    };
    let samples = |v: Option<Seen>| match v {
        Some(Seen::Samples(n)) => n,
        _ => 0,
    };
    let (ok0, call0) = (
        count(value(RENEWALS, &ok)),
        samples(value(SERVER_CALL, &call)),
    );
    let g = l
        .acquire("observe/renewed-unnamed", &opts)
        .await
        .unwrap()
        .expect("free");
    // A 1 s ttl is renewed every third of a second: two renewals within
    // 10 s, each a counted renewal and a timed server call.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (oks, calls) = (
            count(value(RENEWALS, &ok)),
            samples(value(SERVER_CALL, &call)),
        );
        if oks >= ok0 + 2 && calls >= call0 + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "renewals {oks} (from {ok0}), renew calls {calls} (from {call0})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    g.release().await.unwrap();
}

#[tokio::test]
async fn names_are_labels_only_when_asked() {
    snapshotter();
    let l = Locker::memory();
    let g = l.try_lock("observe/unnamed").await.unwrap().expect("free");
    // Through `value`, which keeps what each snapshot takes out.
    let _ = value(ACQUISITIONS, &[]);
    let found = kept()
        .lock()
        .unwrap()
        .keys()
        .any(|k| k.contains("observe/unnamed"));
    assert!(!found, "the name is a label without metrics_name");
    g.release().await.unwrap();
}

#[tokio::test]
async fn an_abandon_is_not_a_loss_and_a_release_that_finds_it_gone_is() {
    snapshotter();
    let server = lockcore::memory::MemoryBackend::new();
    let l = Locker::new(server.clone()).with_defaults(LockOptions::new().metrics_name(true));
    let n = "observe/abandoned";
    let lost = |reason: &'static str| vec![("backend", "memory"), ("name", n), ("reason", reason)];
    l.try_lock(n).await.unwrap().expect("free").abandon();
    let abandoned = lost("the holder abandoned the lease");
    assert_eq!(
        value(LEASES_LOST, &abandoned),
        None,
        "an abandon counted as lost"
    );
    assert_eq!(
        value(LEASES_HELD, &[("backend", "memory"), ("name", n)]),
        Some(Seen::Gauge(0.0))
    );
    server.revoke(n);

    let n = "observe/gone";
    let g = l.try_lock(n).await.unwrap().expect("free");
    assert!(server.expire(n), "held on the server");
    let err = g.release().await.expect_err("the server no longer held it");
    assert_eq!(err.kind(), lockcore::ErrorKind::Lost, "{err}");
    let gone = vec![
        ("backend", "memory"),
        ("name", n),
        ("reason", "the server no longer held the lease at release"),
    ];
    assert_eq!(value(LEASES_LOST, &gone), Some(Seen::Count(1)));
}

#[tokio::test]
async fn only_a_callers_timeout_asks_who_holds() {
    snapshotter();
    let l = Locker::memory().with_defaults(LockOptions::new().metrics_name(true));
    let (a, b) = ("observe/multi-a", "observe/multi-b");
    let held = l.try_lock(b).await.unwrap().expect("free");
    let opts = LockOptions::new()
        .metrics_name(true)
        .wait(Wait::For(Duration::from_millis(50)));
    let err = l.acquire_all(&[a, b], &opts).await.unwrap_err();
    assert_eq!(err.kind(), lockcore::ErrorKind::Timeout, "{err}");
    let asked = [("backend", "memory"), ("name", b), ("operation", "inspect")];
    assert_eq!(
        value(SERVER_CALL, &asked),
        None,
        "a multi-name wait asked who holds {b}"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_grant_after_waiting_is_a_handoff() {
    snapshotter();
    let l = Locker::memory().with_defaults(LockOptions::new().metrics_name(true));
    let n = "observe/handoff";
    let at = [("backend", "memory"), ("name", n), ("primitive", "lock")];
    // Free: granted at once, no hand-off.
    l.lock(n).await.unwrap().release().await.unwrap();
    assert_eq!(
        value(HANDOFFS, &at),
        None,
        "a free name counted as a hand-off"
    );

    let held = l.lock(n).await.unwrap();
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.lock(n).await })
    };
    // The waiter is queued on the server before the holder lets go.
    let deadline = Instant::now() + Duration::from_secs(10);
    while l.inspect(n).await.unwrap().and_then(|i| i.waiters) != Some(1) {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::task::yield_now().await;
    }
    held.release().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    assert_eq!(value(HANDOFFS, &at), Some(Seen::Count(1)));

    // A try that finds the name held is contended, not a hand-off.
    assert!(l.try_lock(n).await.unwrap().is_none());
    g.release().await.unwrap();
    assert_eq!(value(HANDOFFS, &at), Some(Seen::Count(1)));
}
