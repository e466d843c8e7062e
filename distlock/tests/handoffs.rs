//! Hand-offs counted by the `metrics` feature on the server backends that
//! say when an acquisition waited (`lockcore::raw::waiting`): a grant after
//! waiting behind a holder counts once, a free name and a refused try do
//! not. The servers come from compose/ (`LOCKTEST_*_URL`, required under
//! `LOCKTEST_REQUIRE`); the memory backend's case is in lockcore's
//! `tests/observe.rs`.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use distlock::observe::HANDOFFS;
use distlock::{LockOptions, Locker};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The process's recorder, installed once.
fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let s = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        s
    })
}

/// Hand-offs of `name` counted since the last call (a snapshot takes the
/// counts out of the recorder).
fn handoffs(name: &str) -> u64 {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| {
            k.key().name() == HANDOFFS
                && k.key()
                    .labels()
                    .any(|l| l.key() == "name" && l.value() == name)
        })
        .map(|(.., v)| match v {
            DebugValue::Counter(n) => n,
            other => panic!("{HANDOFFS} is not a counter: {other:?}"),
        })
        .sum()
}

fn unique(backend: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("handoffs-{backend}-{}-{t}", std::process::id())
}

/// Waits until `name` has a waiter on the server (where the backend counts
/// waiters), or half a second where it cannot: the waiter's first try is
/// then long made.
async fn until_waiting(l: &Locker, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let Some(waiters) = l.inspect(name).await.unwrap().and_then(|i| i.waiters) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return;
        };
        if waiters >= 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn counts_handoffs(target: &str, var: &str) {
    let Ok(url) = std::env::var(var) else {
        let required = std::env::var("LOCKTEST_REQUIRE").is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|t| t == "all" || t == target)
        });
        assert!(
            !required,
            "{var} is required by LOCKTEST_REQUIRE (compose/local env)"
        );
        eprintln!("{var} unset: skipped");
        return;
    };
    snapshotter();
    let opts = LockOptions::new().metrics_name(true);
    let a = distlock::connect(&url).await.unwrap().with_defaults(opts);
    let b = distlock::connect(&url).await.unwrap().with_defaults(opts);
    let name = unique(a.backend_name());
    handoffs(&name);

    a.lock(&name).await.unwrap().release().await.unwrap();
    assert_eq!(
        handoffs(&name),
        0,
        "{var}: a free name counted as a hand-off"
    );

    let held = a.lock(&name).await.unwrap();
    assert!(b.try_lock(&name).await.unwrap().is_none(), "{var}: held");
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.lock(&name).await })
    };
    until_waiting(&a, &name).await;
    held.release().await.unwrap();
    let g = waiter.await.unwrap().unwrap();
    assert_eq!(handoffs(&name), 1, "{var}: the grant after waiting");
    g.release().await.unwrap();
}

#[tokio::test]
async fn redis() {
    counts_handoffs("redis", "LOCKTEST_REDIS_URL").await;
}

#[tokio::test]
async fn redlock() {
    counts_handoffs("redlock", "LOCKTEST_REDLOCK_URL").await;
}

#[tokio::test]
async fn redis_cluster() {
    counts_handoffs("redis-cluster", "LOCKTEST_REDIS_CLUSTER_URL").await;
}

#[tokio::test]
async fn zookeeper() {
    counts_handoffs("zk", "LOCKTEST_ZK_URL").await;
}

#[tokio::test]
async fn etcd() {
    counts_handoffs("etcd", "LOCKTEST_ETCD_URL").await;
}
