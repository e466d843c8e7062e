//! Migration with real servers: the conformance suite passes on the
//! migrating backend; the overlap that must not happen (an old-only client
//! beside a new-only one) does grant a name twice, so the warning is
//! proven; the fence offset puts the new tokens above the old ones. (The
//! phases that may overlap are in `migration_phases.rs`.)
//!
//! Redis → ZooKeeper and Redis → etcd.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lockcore::{LockOptions, Wait};
use lockcore_conformance::run;

mod migrating;

use migrating::{migrating, target, var, OFFSET, REDIS_ETCD, REDIS_POSTGRES, REDIS_ZK};

/// An old-only and a new-only client at once: both hold the name.
async fn forbidden_overlap(old_url: String, new_url: String, name: String) {
    let old_only = distlock::connect(&old_url).await.expect("old");
    let new_only = distlock::connect(&new_url).await.expect("new");
    let opts = LockOptions::new().wait(Wait::Try);
    let a = old_only
        .acquire(&name, &opts)
        .await
        .expect("old")
        .expect("free on the old backend");
    let b = new_only
        .acquire(&name, &opts)
        .await
        .expect("new")
        .expect("an old-only and a new-only client share no backend: both get the name");
    assert!(a.is_held() && b.is_held());
    eprintln!("FIGURES forbidden_overlap {old_url} + {new_url}: both_held=true");
    a.release().await.expect("release");
    b.release().await.expect("release");
}

/// Migrating tokens (the new backend's plus the offset) compare above the
/// old backend's; new-only clients that keep the offset go on above them.
async fn offset_keeps_tokens_rising(
    old_url: String,
    migrating_url: String,
    new_url: String,
    name: String,
) {
    let old_only = distlock::connect(&old_url).await.expect("old");
    let migrating = distlock::connect(&migrating_url).await.expect("migrating");
    let new_only = distlock::connect(&format!("{new_url}#fence_offset={OFFSET}"))
        .await
        .expect("new");
    let mut last = 0;
    for l in [&old_only, &migrating, &migrating, &new_only, &new_only] {
        let g = l
            .lock_timeout(&name, Duration::from_secs(10))
            .await
            .expect("lock");
        let f = g.fence().expect("a token");
        assert!(f > last, "tokens fell across the change: {last} then {f}");
        last = f;
        g.release().await.expect("release");
    }
}

/// A read-write lock under `migrate:` from Redis to ZooKeeper: refused
/// while ZooKeeper keeps Curator's layout, and with `rwlock=built` on the
/// ZooKeeper URL, a migrating reader and the plain clients' writers on
/// either server exclude each other.
async fn rwlock_migrates_with_the_built_layout(name: String) {
    let (redis, zk) = (var("LOCKTEST_REDIS_URL"), var("LOCKTEST_ZK_URL"));
    let refused = distlock::connect(&migrating("LOCKTEST_ZK_URL"))
        .await
        .expect("migrating");
    let e = distlock::RwLock::new(&refused, &name).expect_err("layouts differ");
    assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("rwlock=built"), "{e}");

    let built = format!("{zk}?rwlock=built");
    let url = format!("migrate:{redis}|{built}#fence_offset={OFFSET}");
    let rw = |l: &lockcore::Locker| distlock::RwLock::new(l, &name).expect("rwlock");
    let migrating = rw(&distlock::connect(&url).await.expect("migrating"));
    let old_only = rw(&distlock::connect(&redis).await.expect("old"));
    let new_only = rw(&distlock::connect(&built).await.expect("new"));

    let w = old_only.try_write().await.expect("try").expect("free");
    assert!(
        migrating.try_read().await.expect("try").is_none(),
        "a migrating reader beside a Redis writer"
    );
    w.release().await.expect("release");
    let r = migrating.try_read().await.expect("try").expect("free");
    for (side, l) in [("Redis", &old_only), ("ZooKeeper", &new_only)] {
        assert!(
            l.try_write().await.expect("try").is_none(),
            "a {side} writer beside a migrating reader"
        );
        let other = l.try_read().await.expect("try").expect("readers share");
        other.release().await.expect("release");
    }
    r.release().await.expect("release");
    let w = new_only.try_write().await.expect("try").expect("free");
    assert!(
        migrating.try_write().await.expect("try").is_none(),
        "a migrating writer beside a ZooKeeper writer"
    );
    w.release().await.expect("release");
}

/// A semaphore under `migrate:` from Redis to ZooKeeper: refused while
/// ZooKeeper keeps Curator's layout; with `semaphore=built` on the
/// ZooKeeper URL, a migrating holder and the plain clients of either
/// server share one permit.
async fn semaphore_migrates_with_the_built_layout(name: String) {
    let (redis, zk) = (var("LOCKTEST_REDIS_URL"), var("LOCKTEST_ZK_URL"));
    let refused = distlock::connect(&migrating("LOCKTEST_ZK_URL"))
        .await
        .expect("migrating");
    let e = distlock::Semaphore::new(&refused, &name, 1).expect_err("layouts differ");
    assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("semaphore=built"), "{e}");

    let built = format!("{zk}?semaphore=built");
    let url = format!("migrate:{redis}|{built}#fence_offset={OFFSET}");
    let sem = |l: &lockcore::Locker| distlock::Semaphore::new(l, &name, 1).expect("semaphore");
    let migrating = sem(&distlock::connect(&url).await.expect("migrating"));
    let old_only = sem(&distlock::connect(&redis).await.expect("old"));
    let new_only = sem(&distlock::connect(&built).await.expect("new"));
    let p = migrating.try_acquire().await.expect("try").expect("free");
    for (side, s) in [("Redis", &old_only), ("ZooKeeper", &new_only)] {
        assert!(
            s.try_acquire().await.expect("try").is_none(),
            "a {side} permit beside the migrating one"
        );
    }
    p.release().await.expect("release");
    let p = new_only.try_acquire().await.expect("try").expect("free");
    assert!(migrating.try_acquire().await.expect("try").is_none());
    p.release().await.expect("release");
}

/// `migrate:` with one store given twice (two spellings of one server) is
/// refused at connect with `InvalidConfig` naming both URLs, in the library
/// and on the command line (exit 64): every client would otherwise block
/// each name against itself.
async fn one_store_twice_is_refused() {
    let (redis, zk) = (var("LOCKTEST_REDIS_URL"), var("LOCKTEST_ZK_URL"));
    let pairs = [
        (redis.clone(), format!("{redis}/0")),
        (zk.clone(), format!("{zk}/")),
    ];
    for (old, new) in &pairs {
        let url = format!("migrate:{old}|{new}");
        let e = distlock::connect(&url)
            .await
            .expect_err("one store given as old and new was accepted");
        assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig, "{url}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(old.as_str()) && text.contains(new.as_str()),
            "the error names neither URL: {text}"
        );
    }
    let bin = std::env::var("LOCKTEST_DISTLOCK_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_distlock").to_owned());
    let (old, new) = &pairs[0];
    let out = tokio::process::Command::new(bin)
        .args(["--url", &format!("migrate:{old}|{new}"), "inspect", "x"])
        .output()
        .await
        .expect("distlock runs");
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `distlock inspect` on the `migrate:` URL of `new_var`'s migration, as
/// JSON.
async fn inspect_migration(new_var: &str, name: &str) -> serde_json::Value {
    let bin = std::env::var("LOCKTEST_DISTLOCK_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_distlock").to_owned());
    let out = tokio::process::Command::new(bin)
        .args(["--url", &migrating(new_var), "inspect", "--json", name])
        .output()
        .await
        .expect("distlock runs");
    assert!(
        out.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The README's phase-3 check: `distlock inspect --url 'migrate:OLD|NEW'
/// NAME` says whether the name is held by one migrating owner on both
/// backends (the same owner token on each), on the old backend only (an
/// old-only client still runs: not safe to start phase 3), or free.
async fn phase_three_check(new_var: &'static str, name: String) {
    let verdict = |v: &serde_json::Value| v["migration"]["verdict"].as_str().map(str::to_owned);
    let free = inspect_migration(new_var, &name).await;
    assert_eq!(verdict(&free).as_deref(), Some("free"), "{free}");

    let migrating_client = distlock::connect(&migrating(new_var))
        .await
        .expect("migrating");
    let g = migrating_client.lock(&name).await.expect("lock");
    let both = inspect_migration(new_var, &name).await;
    assert_eq!(verdict(&both).as_deref(), Some("migrating"), "{both}");
    let (old, new) = (
        &both["migration"]["old_owner"],
        &both["migration"]["new_owner"],
    );
    assert!(
        old.is_string() && old == new,
        "one owner token on both: {both}"
    );
    g.release().await.expect("release");

    let old_only = distlock::connect(&var("LOCKTEST_REDIS_URL"))
        .await
        .expect("old");
    let g = old_only.lock(&name).await.expect("lock");
    let old_side = inspect_migration(new_var, &name).await;
    assert_eq!(
        verdict(&old_side).as_deref(),
        Some("old_only"),
        "{old_side}"
    );
    g.release().await.expect("release");
}

/// `distlock bench` on a migration with no read-write lock and no
/// semaphore measures the rest and says so, instead of failing.
async fn bench_runs_without_a_read_write_lock(url: String) {
    let bin = std::env::var("LOCKTEST_DISTLOCK_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_distlock").to_owned());
    let out = tokio::process::Command::new(bin)
        .args(["--url", &url, "bench", "--duration", "200ms", "--held", "2"])
        .args(["--contenders", "2", "--json"])
        .output()
        .await
        .expect("distlock runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"rw_handoffs\":null"), "{stdout}");
    assert!(
        stdout.contains("\"semaphore_1_task_permits_per_s\":null"),
        "{stdout}"
    );
}

fn main() -> std::process::ExitCode {
    run(vec![
        // The conformance suite on the migrating backend.
        target("migrate-redis-zk", REDIS_ZK, || {
            migrating("LOCKTEST_ZK_URL")
        })
        .case("old_only_with_new_only_overlaps", |ctx| {
            Box::pin(forbidden_overlap(
                var("LOCKTEST_REDIS_URL"),
                var("LOCKTEST_ZK_URL"),
                ctx.name("forbidden"),
            ))
        })
        .case("offset_keeps_tokens_rising", |ctx| {
            Box::pin(offset_keeps_tokens_rising(
                var("LOCKTEST_REDIS_URL"),
                migrating("LOCKTEST_ZK_URL"),
                var("LOCKTEST_ZK_URL"),
                ctx.name("offset"),
            ))
        })
        .case("rwlock_migrates_with_the_built_layout", |ctx| {
            Box::pin(rwlock_migrates_with_the_built_layout(ctx.name("rw")))
        })
        .case("semaphore_migrates_with_the_built_layout", |ctx| {
            Box::pin(semaphore_migrates_with_the_built_layout(ctx.name("sem")))
        })
        .case("phase_three_check", |ctx| {
            Box::pin(phase_three_check("LOCKTEST_ZK_URL", ctx.name("phase3")))
        })
        .case("one_store_twice_is_refused", |_| {
            Box::pin(one_store_twice_is_refused())
        })
        .case("bench_runs_without_a_read_write_lock", |_| {
            Box::pin(bench_runs_without_a_read_write_lock(migrating(
                "LOCKTEST_ZK_URL",
            )))
        }),
        target("migrate-redis-etcd", REDIS_ETCD, || {
            migrating("LOCKTEST_ETCD_URL")
        })
        .case("old_only_with_new_only_overlaps", |ctx| {
            Box::pin(forbidden_overlap(
                var("LOCKTEST_REDIS_URL"),
                var("LOCKTEST_ETCD_URL"),
                ctx.name("forbidden"),
            ))
        })
        .case("phase_three_check", |ctx| {
            Box::pin(phase_three_check("LOCKTEST_ETCD_URL", ctx.name("phase3")))
        })
        .case("offset_keeps_tokens_rising", |ctx| {
            Box::pin(offset_keeps_tokens_rising(
                var("LOCKTEST_REDIS_URL"),
                migrating("LOCKTEST_ETCD_URL"),
                var("LOCKTEST_ETCD_URL"),
                ctx.name("offset"),
            ))
        }),
        target("migrate-redis-postgres", REDIS_POSTGRES, || {
            migrating("LOCKTEST_POSTGRES_URL")
        })
        .case("old_only_with_new_only_overlaps", |ctx| {
            Box::pin(forbidden_overlap(
                var("LOCKTEST_REDIS_URL"),
                var("LOCKTEST_POSTGRES_URL"),
                ctx.name("forbidden"),
            ))
        })
        .case("phase_three_check", |ctx| {
            Box::pin(phase_three_check(
                "LOCKTEST_POSTGRES_URL",
                ctx.name("phase3"),
            ))
        })
        .case("offset_keeps_tokens_rising", |ctx| {
            Box::pin(offset_keeps_tokens_rising(
                var("LOCKTEST_REDIS_URL"),
                migrating("LOCKTEST_POSTGRES_URL"),
                var("LOCKTEST_POSTGRES_URL"),
                ctx.name("offset"),
            ))
        }),
    ])
}
