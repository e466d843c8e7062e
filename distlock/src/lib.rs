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

use std::future::Future;
use std::pin::Pin;

use url::Url;

const FACADE: &str = "connect";

/// The future of a backend's `connect`.
type Connecting<'a> = Pin<Box<dyn Future<Output = Result<Locker>> + Send + 'a>>;

/// One backend: its cargo feature, the URL schemes it takes (from the
/// backend crate when compiled in), and how to connect.
struct Entry {
    feature: &'static str,
    schemes: &'static [&'static str],
    /// The schemes as listed in [`backends`], for when the crate is absent.
    #[cfg_attr(not(test), allow(dead_code))]
    listed: &'static [&'static str],
    connect: Option<for<'a> fn(&'a str) -> Connecting<'a>>,
}

/// An entry for a backend crate: its `SCHEMES` and `connect` when its
/// feature is on; the schemes as listed here otherwise (a test checks that
/// the two lists agree).
macro_rules! entry {
    ($feature:literal, $krate:ident, [$($scheme:literal),+ $(,)?]) => {{
        #[cfg(feature = $feature)]
        let e = Entry {
            feature: $feature,
            schemes: $krate::SCHEMES,
            listed: &[$($scheme),+],
            connect: Some(|url| Box::pin($krate::connect(url))),
        };
        #[cfg(not(feature = $feature))]
        let e = Entry {
            feature: $feature,
            schemes: &[$($scheme),+],
            listed: &[$($scheme),+],
            connect: None,
        };
        e
    }};
}

/// Every backend but the in-memory one, in one table.
fn backends() -> [Entry; 4] {
    [
        entry!(
            "redis",
            lockcore_redis,
            [
                "redis",
                "rediss",
                "redis+cluster",
                "rediss+cluster",
                "redlock"
            ]
        ),
        entry!("zk", lockcore_zk, ["zk", "zookeeper"]),
        entry!("etcd", lockcore_etcd, ["etcd", "etcds"]),
        entry!("mysql", lockcore_mysql, ["mysql", "mariadb"]),
    ]
}

/// Connects to the backend that `url`'s scheme names.
///
/// - `memory://` is the process-wide in-memory server, `memory://NAME` a
///   named one: separate `connect` calls with one URL lock against each
///   other, as separate connections to one server would.
///
/// # Errors
///
/// [`ErrorKind::InvalidConfig`] for a malformed URL, or a scheme whose
/// backend is not compiled in (naming the cargo feature to enable);
/// whatever the backend's `connect` returns otherwise (for example
/// [`ErrorKind::Unavailable`]).
///
/// # Cancel safety
///
/// Cancel safe: a dropped call leaves no lock state behind (at most a
/// connection that is closed when dropped).
pub async fn connect(url: &str) -> Result<Locker> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    for b in backends() {
        if b.schemes.contains(&scheme) {
            return match b.connect {
                Some(connect) => connect(url).await,
                None => Err(Error::invalid_config(
                    FACADE,
                    format!(
                        "the {scheme}:// backend is not compiled in: enable the cargo feature `{}` of distlock",
                        b.feature
                    ),
                )),
            };
        }
    }
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
        other => Err(Error::invalid_config(
            FACADE,
            format!(
                "unknown lock URL scheme {other:?}: use memory://{}",
                backends()
                    .iter()
                    .map(|b| format!(", {}:// (feature `{}`)", b.schemes[0], b.feature))
                    .collect::<String>()
            ),
        )),
    }
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

    /// The schemes listed for a backend that is not compiled in are the
    /// backend crate's own.
    #[test]
    fn the_table_lists_the_backends_schemes() {
        for b in backends() {
            assert_eq!(b.schemes, b.listed, "{}", b.feature);
        }
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

    /// Malformed URLs of every compiled-in backend: a clear
    /// `InvalidConfig`, at once, without asking any server.
    #[tokio::test]
    async fn malformed_backend_urls_are_invalid_config() {
        let bad: Vec<&str> = vec![
            #[cfg(feature = "redis")]
            "redis://127.0.0.1:99999",
            #[cfg(feature = "redis")]
            "redis://127.0.0.1:6379?response_timeout_ms=soon",
            #[cfg(feature = "redis")]
            "redis://127.0.0.1:6379?no_such_option=1",
            #[cfg(feature = "redis")]
            "redlock://",
            #[cfg(feature = "zk")]
            "zk://",
            #[cfg(feature = "zk")]
            "zk://127.0.0.1:notaport",
            #[cfg(feature = "zk")]
            "zk://127.0.0.1:2181?connect_timeout_ms=-1",
            #[cfg(feature = "etcd")]
            "etcd://127.0.0.1:2379?request_timeout_ms=x",
            #[cfg(feature = "etcd")]
            "etcd://:2379",
            #[cfg(feature = "mysql")]
            "mysql://u:p@127.0.0.1:3306/db?pool_size=zero",
            #[cfg(feature = "mysql")]
            "mysql://u:p@127.0.0.1:3306/db?table=a;b",
        ];
        for url in bad {
            let t = std::time::Instant::now();
            let e = connect(url).await.expect_err(url);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}: {e}");
            assert!(
                t.elapsed() < std::time::Duration::from_millis(500),
                "{url} took {:?}",
                t.elapsed()
            );
        }
    }
}
