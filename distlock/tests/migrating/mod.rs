//! What the migration tests share: the servers' URLs, the migrating URL
//! from Redis, and targets whose clients connect by URL.

use std::sync::Arc;

use lockcore_conformance::{ConnectFuture, Harness, Target, UrlHarness, COMPOSE_HINT};

/// Above any Redis token (microseconds since 1970) until 2112.
pub(crate) const OFFSET: u64 = 1 << 52;

/// A migrating URL where neither server answers.
const UNREACHABLE: &str = "migrate:redis://127.0.0.1:1|zk://127.0.0.1:1";

/// The servers a Redis → ZooKeeper migration needs.
pub(crate) const REDIS_ZK: &[&str] = &["LOCKTEST_REDIS_URL", "LOCKTEST_ZK_URL"];
/// The servers a Redis → etcd migration needs.
pub(crate) const REDIS_ETCD: &[&str] = &["LOCKTEST_REDIS_URL", "LOCKTEST_ETCD_URL"];
/// The servers a Redis → PostgreSQL migration needs.
pub(crate) const REDIS_POSTGRES: &[&str] = &["LOCKTEST_REDIS_URL", "LOCKTEST_POSTGRES_URL"];

/// An environment variable, or "" when unset.
pub(crate) fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { distlock::connect(&url).await })
}

/// The migrating URL from Redis to `new_var`'s backend.
pub(crate) fn migrating(new_var: &str) -> String {
    format!(
        "migrate:{}|{}#fence_offset={OFFSET}",
        var("LOCKTEST_REDIS_URL"),
        var(new_var)
    )
}

/// A target whose clients connect to `url()` (read when the target starts),
/// needing every variable of `vars`.
pub(crate) fn target(name: &str, vars: &'static [&'static str], url: fn() -> String) -> Target {
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
