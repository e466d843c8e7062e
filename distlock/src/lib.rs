//! Distributed locks: pick a backend with a cargo feature and a URL, and
//! nothing else in your code changes.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> distlock::Result<()> {
//! // "memory://" needs no server; with the `redis` feature,
//! // "redis://127.0.0.1:6379" would work the same way.
//! let locker = distlock::connect("memory://").await?;
//! let guard = locker.lock("nightly-report").await?;
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! | scheme | backend | cargo feature |
//! |---|---|---|
//! | `memory://[name]` | in-process ([`lockcore::memory`]) | always on |
//! | `zk://h1:2181,h2:2181[/chroot]`, `zookeeper://...` | ZooKeeper (`lockcore-zk`) | `zk` |
//! | `etcd://h1:2379,h2:2379`, `etcds://...` | etcd (`lockcore-etcd`) | `etcd` |
//! | `mysql://user:pass@host/db`, `mariadb://...` | MySQL 8 / MariaDB (`lockcore-mysql`) | `mysql` |
//! | `redis://host:port`, `redis+cluster://h1:p1,h2:p2`, `redlock://h1:p1,...` | Redis (`lockcore-redis`) | `redis` |
//!
//! Everything of [`lockcore`] is re-exported here.

pub use lockcore::*;

use url::Url;

const FACADE: &str = "connect";

/// Schemes whose backends exist but were not compiled in, with their feature.
const OPTIONAL: &[(&[&str], &str)] = &[
    (
        &[
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redlock",
        ],
        "redis",
    ),
    (&["zk", "zookeeper"], "zk"),
    (&["mysql", "mariadb"], "mysql"),
    (&["etcd", "etcds"], "etcd"),
];

/// Connects to the backend that `url`'s scheme names.
///
/// - `memory://` is the process-wide in-memory server, `memory://NAME` a
///   named one: separate `connect` calls with one URL lock against each
///   other, as separate connections to one server would.
///
/// A scheme whose backend is not compiled in fails with
/// [`ErrorKind::InvalidConfig`] naming the cargo feature to enable.
///
/// # Cancel safety
///
/// Cancel safe: a dropped call leaves no lock state behind (at most a
/// connection that is closed when dropped).
pub async fn connect(url: &str) -> Result<Locker> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    #[cfg(feature = "redis")]
    if matches!(
        scheme,
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redlock"
    ) {
        return lockcore_redis::connect(url).await;
    }
    #[cfg(feature = "zk")]
    if matches!(scheme, "zk" | "zookeeper") {
        return lockcore_zk::connect(url).await;
    }
    #[cfg(feature = "etcd")]
    if matches!(scheme, "etcd" | "etcds") {
        return lockcore_etcd::connect(url).await;
    }
    #[cfg(feature = "mysql")]
    if matches!(scheme, "mysql" | "mariadb") {
        return lockcore_mysql::connect(url).await;
    }
    let _ = scheme;
    let parsed = Url::parse(url).map_err(|e| {
        Error::invalid_config(
            FACADE,
            format!("{url:?} is not a lock URL (e.g. memory://): {e}"),
        )
        .with_source(e)
    })?;
    match parsed.scheme() {
        "memory" => {
            let name = parsed.host_str().unwrap_or("");
            Ok(Locker::new(memory::MemoryBackend::shared(name)))
        }
        other => Err(unknown_scheme(other)),
    }
}

fn unknown_scheme(scheme: &str) -> Error {
    match OPTIONAL.iter().find(|(schemes, _)| schemes.contains(&scheme)) {
        Some((_, feature)) => Error::invalid_config(
            FACADE,
            format!(
                "the {scheme}:// backend is not compiled in: enable the cargo feature `{feature}` of distlock"
            ),
        ),
        None => Error::invalid_config(
            FACADE,
            format!("unknown lock URL scheme {scheme:?}: use memory://{}", known_list()),
        ),
    }
}

fn known_list() -> String {
    OPTIONAL
        .iter()
        .map(|(s, f)| format!(", {}:// (feature `{f}`)", s[0]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_urls_share_a_server() {
        let a = connect("memory://facade-test").await.unwrap();
        let b = connect("memory://facade-test").await.unwrap();
        let c = connect("memory://other").await.unwrap();
        let g = a.lock("x").await.unwrap();
        assert!(b.try_lock("x").await.unwrap().is_none());
        assert!(c.try_lock("x").await.unwrap().is_some());
        g.release().await.unwrap();
    }

    #[tokio::test]
    async fn bad_urls_are_invalid_config() {
        for (url, needle) in [
            ("not a url", "not a lock URL"),
            ("ftp://x", "unknown lock URL scheme"),
            #[cfg(not(feature = "redis"))]
            ("redis://127.0.0.1", "feature `redis`"),
            #[cfg(not(feature = "mysql"))]
            ("mariadb://h/db", "feature `mysql`"),
        ] {
            let e = connect(url).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(needle), "{url}: {e}");
        }
    }
}
