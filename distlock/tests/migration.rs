//! Migration with real servers: the conformance suite passes on the
//! migrating backend; the overlap that must not happen (an old-only client
//! beside a new-only one) does grant a name twice, so the warning is
//! proven; the fence offset puts the new tokens above the old ones. (The
//! phases that may overlap are in `migration_phases.rs`.)
//!
//! Redis → ZooKeeper and Redis → etcd.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use lockcore::{LockOptions, Wait};
use lockcore_conformance::{run, ConnectFuture, Harness, Target, UrlHarness, COMPOSE_HINT};

/// Above any Redis token (microseconds since 1970) until 2112.
const OFFSET: u64 = 1 << 52;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { distlock::connect(&url).await })
}

/// The migrating URL from Redis to `new_var`'s backend.
fn migrating(new_var: &str) -> String {
    format!(
        "migrate:{}|{}#fence_offset={OFFSET}",
        var("LOCKTEST_REDIS_URL"),
        var(new_var)
    )
}

/// A target whose clients connect to `url()` (read when the target starts),
/// needing every variable of `vars`.
fn target(name: &str, vars: &'static [&'static str], url: fn() -> String) -> Target {
    Target::new(name, Some(vars[0]), move |_| async move {
        for v in vars {
            if var(v).is_empty() {
                return Err(lockcore::Error::invalid_config(
                    "test",
                    format!("{v} is unset"),
                ));
            }
        }
        Ok(UrlHarness::with_unreachable(url(), UNREACHABLE, connect) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}

/// A migrating URL where neither server answers.
const UNREACHABLE: &str = "migrate:redis://127.0.0.1:1|zk://127.0.0.1:1";

const REDIS_ZK: &[&str] = &["LOCKTEST_REDIS_URL", "LOCKTEST_ZK_URL"];
const REDIS_ETCD: &[&str] = &["LOCKTEST_REDIS_URL", "LOCKTEST_ETCD_URL"];

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
        .case("offset_keeps_tokens_rising", |ctx| {
            Box::pin(offset_keeps_tokens_rising(
                var("LOCKTEST_REDIS_URL"),
                migrating("LOCKTEST_ETCD_URL"),
                var("LOCKTEST_ETCD_URL"),
                ctx.name("offset"),
            ))
        }),
    ])
}
