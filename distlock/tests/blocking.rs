//! `distlock::blocking` on the memory backend and on Redis
//! (`LOCKTEST_REDIS_URL`, from compose/): lock, try, timeout, renewal
//! while the caller's thread works, lost while held, release, drop, and
//! the clear refusal inside a tokio runtime. Who holds a name is asked of
//! the backend through a second handle, not of the guard.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use distlock::blocking::{self, Locker};
use distlock::{ErrorKind, LockOptions, Wait};

/// Two handles on one backend, and a prefix for names of this test.
struct Pair {
    a: Locker,
    b: Locker,
    prefix: String,
}

impl Pair {
    fn name(&self, n: &str) -> String {
        format!("{}/{n}", self.prefix)
    }
}

fn unique() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("blocking-{}-{t}", std::process::id())
}

/// The pairs to run a case on: memory always, Redis when its URL is set
/// (required under `LOCKTEST_REQUIRE`).
fn pairs() -> Vec<Pair> {
    let memory = format!("memory://{}", unique());
    let mut out = vec![Pair {
        a: blocking::connect(&memory).expect("memory"),
        b: blocking::connect(&memory).expect("memory"),
        prefix: unique(),
    }];
    match std::env::var("LOCKTEST_REDIS_URL") {
        Ok(url) => out.push(Pair {
            a: blocking::connect(&url).expect("redis"),
            b: blocking::connect(&url).expect("redis"),
            prefix: unique(),
        }),
        Err(_) => {
            let required = std::env::var("LOCKTEST_REQUIRE").is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim() == "all" || t.trim() == "redis")
            });
            assert!(
                !required,
                "LOCKTEST_REDIS_URL is required by LOCKTEST_REQUIRE (compose/local env)"
            );
            eprintln!("LOCKTEST_REDIS_URL unset: the blocking API is tested on memory only");
        }
    }
    out
}

#[test]
fn lock_excludes_and_release_frees() {
    for p in pairs() {
        let name = p.name("lock");
        let g = p.a.lock(&name).expect("lock");
        assert!(
            g.fence().is_some(),
            "{}: a fencing token",
            p.a.backend_name()
        );
        assert!(
            p.b.try_lock(&name).expect("try").is_none(),
            "{}: another handle took a held name",
            p.a.backend_name()
        );
        let info = p.b.inspect(&name).expect("inspect");
        assert!(
            info.is_some(),
            "{}: inspect sees no holder",
            p.a.backend_name()
        );
        match p.b.try_lock_or_holder(&name).expect("try") {
            blocking::Attempt::Held(h) => {
                assert_eq!(h.and_then(|h| h.fence), g.fence(), "{}", p.a.backend_name());
            }
            blocking::Attempt::Acquired(_) => panic!("{}: took a held name", p.a.backend_name()),
        }
        g.release().expect("release");
        let again = p.b.try_lock(&name).expect("try");
        assert!(
            again.is_some(),
            "{}: not free after release",
            p.a.backend_name()
        );
    }
}

#[test]
fn lock_timeout_times_out_while_held() {
    for p in pairs() {
        let name = p.name("timeout");
        let _g = p.a.lock(&name).expect("lock");
        let start = Instant::now();
        let err =
            p.b.lock_timeout(&name, Duration::from_millis(300))
                .expect_err("held");
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(10),
            "timed out after {took:?}"
        );
    }
}

#[test]
fn a_guard_is_renewed_while_the_caller_works() {
    for p in pairs() {
        let name = p.name("renewed");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Wait::Try);
        let g = p.a.acquire(&name, &opts).expect("acquire").expect("free");
        // The caller's thread is busy (not in any call of ours) for three
        // ttls: time is the subject.
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            p.b.try_lock(&name).expect("try").is_none(),
            "{}: the name was free after three ttls: not renewed",
            p.a.backend_name()
        );
        assert!(!g.wait_lost(Duration::ZERO));
        g.release().expect("release");
    }
}

#[test]
fn lost_while_held_is_seen_blocking_and_by_callback() {
    for p in pairs() {
        let name = p.name("lost");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .renew(false)
            .wait(Wait::Try);
        let g = p.a.acquire(&name, &opts).expect("acquire").expect("free");
        let (tx, rx) = mpsc::channel();
        g.on_lost(move || tx.send(()).expect("send"));
        assert!(
            g.wait_lost(Duration::from_secs(10)),
            "{}: not lost 10 s after a 1 s ttl without renewal",
            p.a.backend_name()
        );
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the lost callback was called");
        assert!(!g.is_held());
        let err = g.release().expect_err("released a lost lease");
        assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
        assert!(p.b.try_lock(&name).expect("try").is_some());
    }
}

#[test]
fn a_callback_is_not_called_after_a_release() {
    for p in pairs() {
        let name = p.name("callback");
        let g = p.a.lock(&name).expect("lock");
        let (tx, rx) = mpsc::channel::<()>();
        g.on_lost(move || tx.send(()).expect("send"));
        g.release().expect("release");
        // The callback's task ended without calling it: the sender is gone.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}

#[test]
fn drop_releases_before_it_returns() {
    for p in pairs() {
        let name = p.name("drop");
        let g = p.a.lock(&name).expect("lock");
        drop(g);
        // At once, with no wait: the release ran inside drop.
        assert!(
            p.b.try_lock(&name).expect("try").is_some(),
            "{}: still held right after the guard was dropped",
            p.a.backend_name()
        );
    }
}

#[test]
fn a_guard_outlives_its_handle() {
    for p in pairs() {
        let name = p.name("outlives");
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .wait(Wait::Try);
        let g = p.a.acquire(&name, &opts).expect("acquire").expect("free");
        drop(p.a);
        std::thread::sleep(Duration::from_secs(2));
        assert!(p.b.try_lock(&name).expect("try").is_none());
        g.release().expect("release");
        assert!(p.b.try_lock(&name).expect("try").is_some());
    }
}

#[test]
fn inside_a_runtime_it_refuses_clearly() {
    let p = pairs().remove(0);
    let name = p.name("inside");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let g = p.a.lock(&name).expect("lock");
    rt.block_on(async {
        let err = blocking::connect("memory://").expect_err("inside a runtime");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        assert!(err.to_string().contains("inside a tokio runtime"), "{err}");
        let err = p.b.try_lock(&name).expect_err("inside a runtime");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        // Dropped inside a runtime: released in the background, no panic.
        drop(g);
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.b.try_lock(&name).expect("try").is_none() {
        assert!(Instant::now() < deadline, "never released");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_guard_that_outlived_its_handle_dropped_in_a_runtime_is_released() {
    let p = pairs().remove(0);
    let name = p.name("last-inside");
    let Pair { a, b, .. } = p;
    // The guard holds the only reference to the handle's runtime.
    let g = a.lock(&name).expect("lock");
    drop(a);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { drop(g) });
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.try_lock(&name).expect("try").is_none() {
        assert!(
            Instant::now() < deadline,
            "still held 10 s after the drop (the default ttl is longer)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
