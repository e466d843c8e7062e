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
//! | `etcd://h1:2379,h2:2379`, `etcds://...`, `http://h1:2379,http://h2:2379`, `https://...` | etcd (`lockcore-etcd`) | `etcd` |
//! | `mysql://user:pass@host/db`, `mariadb://...` | MySQL 8 / MariaDB (`lockcore-mysql`) | `mysql` |
//! | `postgres://user:pass@host/db`, `postgresql://...` | PostgreSQL (`lockcore-postgres`) | `postgres` |
//! | `redis://host:port`, `redis+cluster://h1:p1,h2:p2`, `redis+sentinel://s1:p1,s2:p2/MASTER`, `redlock://h1:p1,...` | Redis (`lockcore-redis`) | `redis` |
//! | `migrate:OLD\|NEW[#fence_offset=N]` | both at once, while a fleet moves from OLD to NEW ([`lockcore::migrate`]) | those of OLD and NEW |
//!
//! ## Migration
//!
//! A service moves between backends by changing one setting: its lock URL
//! goes from `redis://...` to `migrate:redis://...|zk://...` (rolled out to
//! every instance), then to `zk://...`. The migrating client takes each
//! name on the old backend, then on the new one, so it excludes both
//! old-only and new-only clients; old-only and new-only clients must never
//! run at the same time. See [`lockcore::migrate`] for the procedure, how
//! to check that a phase is complete, and the fencing offset.
//!
//! Everything of [`lockcore`] is re-exported here.

pub use lockcore::*;

#[cfg(feature = "blocking")]
pub mod blocking;

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

/// `OLD|NEW[#fence_offset=N]`, connected to both.
async fn connect_migrating(pair: &str, offset: u64) -> Result<migrate::Migrating> {
    // Only redacted parts of the URLs go into errors.
    let bad = |why: &str| {
        let shown: Vec<String> = pair
            .split('|')
            .map(lockcore::raw::address::redact)
            .collect();
        Error::invalid_config(FACADE, format!("migrate:{}: {why}", shown.join("|")))
    };
    let (old, new) = pair
        .split_once('|')
        .ok_or_else(|| bad("expected two lock URLs: migrate:OLD|NEW"))?;
    if strip_migrate(old).is_some() || strip_migrate(new).is_some() || new.contains('|') {
        return Err(bad(
            "expected exactly two lock URLs, neither a migrate: one",
        ));
    }
    if old == new {
        return Err(bad("the old and the new backend are the same"));
    }
    let old = connect_one(old).await?;
    let new = connect_one(new).await?;
    let pair =
        migrate::Migrating::new(old.backend().clone(), new.backend().clone()).fence_offset(offset);
    // Two spellings of one store pass the comparison above: tell them by
    // behaviour, with a probe name held on the old one.
    pair.verify_distinct().await.map_err(|_| {
        bad("the old and the new backend are the same store (a lock taken on the old one shows on the new one)")
    })?;
    Ok(pair)
}

/// Splits `#fence_offset=N` off the end of a lock URL.
///
/// Only a last `#` followed by `fence_offset=` starts the options, so a `#`
/// elsewhere (in a password, say) is left to the backend's URL parser.
fn split_options(url: &str) -> Result<(&str, u64)> {
    let Some((rest, options)) = url
        .rsplit_once('#')
        .filter(|(_, options)| options.starts_with("fence_offset="))
    else {
        return Ok((url, 0));
    };
    let bad = |why: String| Error::invalid_config(FACADE, why);
    let mut offset = 0u64;
    for kv in options.split('&') {
        match kv.split_once('=') {
            Some(("fence_offset", v)) => {
                offset = v
                    .parse()
                    .map_err(|e| bad(format!("fence_offset={v:?} is not a token offset: {e}")))?;
            }
            Some((key, _)) => {
                return Err(bad(format!(
                    "unknown option {key:?} after '#' (only fence_offset=N)"
                )))
            }
            None => return Err(bad("expected fence_offset=N after '#'".to_owned())),
        }
    }
    Ok((rest, offset))
}

/// Every backend but the in-memory one, in one table.
fn backends() -> [Entry; 5] {
    [
        entry!(
            "redis",
            lockcore_redis,
            [
                "redis",
                "rediss",
                "redis+cluster",
                "rediss+cluster",
                "redis+sentinel",
                "rediss+sentinel",
                "redlock"
            ]
        ),
        entry!("zk", lockcore_zk, ["zk", "zookeeper"]),
        entry!("etcd", lockcore_etcd, ["etcd", "etcds", "http", "https"]),
        entry!("mysql", lockcore_mysql, ["mysql", "mariadb"]),
        entry!("postgres", lockcore_postgres, ["postgres", "postgresql"]),
    ]
}

/// Connects to the backend that `url`'s scheme names.
///
/// - `memory://` is the process-wide in-memory server, `memory://NAME` a
///   named one: separate `connect` calls with one URL lock against each
///   other, as separate connections to one server would.
/// - `migrate:OLD|NEW` holds every name on both backends while a fleet
///   moves from `OLD` to `NEW` (see [Migration](crate#migration)). A `|`
///   or `#` inside either URL must be percent-encoded.
/// - `#fence_offset=N` at the end of any of these adds `N` to every fencing
///   token (to the new backend's, for `migrate:`), so that tokens keep
///   rising when their source changes: the migrating clients of phase 2
///   and the new-only clients of phase 3 use the same offset.
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
/// connection that is closed when dropped), but for a `migrate:` URL's
/// probe lock (see [`Migrating::one_store`](migrate::Migrating::one_store)),
/// released in the background, or by its ttl if the process exits first.
pub async fn connect(url: &str) -> Result<Locker> {
    let (url, offset) = split_options(url)?;
    if let Some(pair) = strip_migrate(url) {
        return Ok(Locker::new(connect_migrating(pair, offset).await?));
    }
    let locker = connect_one(url).await?;
    Ok(if offset == 0 {
        locker
    } else {
        Locker::new(migrate::OffsetFences::new(locker.backend().clone(), offset))
    })
}

/// Connects to the two backends of a `migrate:OLD|NEW[#fence_offset=N]`
/// URL, as [`connect`] does, and returns the pair itself: for
/// [`Migrating::sides`](migrate::Migrating::sides), the check before phase
/// 3, beside [`Locker::new`] for its locks.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> distlock::Result<()> {
/// let pair = distlock::connect_migration("migrate:memory://doc-old|memory://doc-new").await?;
/// assert_eq!(pair.sides("jobs").await?.verdict(), "free");
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`ErrorKind::InvalidConfig`] for a URL that is not `migrate:`, and as
/// [`connect`].
///
/// # Cancel safety
///
/// As [`connect`].
pub async fn connect_migration(url: &str) -> Result<migrate::Migrating> {
    let (url, offset) = split_options(url)?;
    match strip_migrate(url) {
        Some(pair) => connect_migrating(pair, offset).await,
        None => Err(Error::invalid_config(
            FACADE,
            format!(
                "{}: not a migration URL (migrate:OLD|NEW)",
                lockcore::raw::address::redact(url)
            ),
        )),
    }
}

/// The pair of a `migrate:` URL (the prefix in any case).
fn strip_migrate(url: &str) -> Option<&str> {
    let head = url.get(..8)?;
    head.eq_ignore_ascii_case("migrate:").then(|| &url[8..])
}

/// Connects to one backend by its URL's scheme.
async fn connect_one(url: &str) -> Result<Locker> {
    // Schemes are case-insensitive (RFC 3986): `REDIS://` is `redis://`.
    let lowered;
    let url = match url.split_once("://") {
        Some((scheme, rest)) if scheme.bytes().any(|b| b.is_ascii_uppercase()) => {
            lowered = format!("{}://{rest}", scheme.to_ascii_lowercase());
            lowered.as_str()
        }
        _ => url,
    };
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
            format!(
                "{:?} is not a lock URL (e.g. memory://): {e}",
                lockcore::raw::address::redact(url)
            ),
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
                "unknown lock URL scheme {other:?}: use memory://{}, or migrate:OLD|NEW",
                backends()
                    .iter()
                    .map(|b| format!(
                        ", {} (feature `{}`)",
                        b.schemes
                            .iter()
                            .map(|s| format!("{s}://"))
                            .collect::<Vec<_>>()
                            .join(" "),
                        b.feature
                    ))
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

    #[tokio::test]
    async fn fence_offsets_and_migrating_pairs_by_url() {
        let plain = connect("memory://offset-test").await.unwrap();
        let shifted = connect("memory://offset-test#fence_offset=1000")
            .await
            .unwrap();
        let g = shifted.lock("x").await.unwrap();
        assert!(g.fence().unwrap() > 1000);
        assert!(plain.try_lock("x").await.unwrap().is_none(), "one server");
        g.release().await.unwrap();

        let old = connect("memory://mig-old").await.unwrap();
        let new = connect("memory://mig-new").await.unwrap();
        let m = connect("migrate:memory://mig-old|memory://mig-new#fence_offset=7")
            .await
            .unwrap();
        let g = m.lock("x").await.unwrap();
        for (side, on) in [(&old, "the old"), (&new, "the new")] {
            assert!(side.try_lock("x").await.unwrap().is_none(), "held on {on}");
        }
        assert!(g.fence().unwrap() > 7);
        g.release().await.unwrap();

        for (url, needle) in [
            ("memory://#fence_offset=x", "fence_offset=\"x\""),
            ("memory://#fence_offset=1&color=red", "unknown option"),
            ("migrate:memory://a", "two lock URLs"),
            ("migrate:memory://a|memory://b|memory://c", "exactly two"),
            ("migrate:memory://a|memory://a", "the same"),
        ] {
            let e = connect(url).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(needle), "{url}: {e}");
        }
        // Passwords stay out of the errors.
        for url in [
            "migrate:mysql://u:sekrit@h/db",
            "migrate:mysql://u:sekrit@h/db|mysql://u:sekrit@h/db",
            "mysql://u:sek#rit=x@h/db|zz",
            "x!://u:sekrit@h/db",
        ] {
            if let Err(e) = connect(url).await {
                assert!(!e.to_string().contains("sekrit"), "{url}: {e}");
                assert!(!e.to_string().contains("rit=x"), "{url}: {e}");
            }
        }
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
            #[cfg(feature = "postgres")]
            "postgres://u:p@127.0.0.1:5432/db?pool_size=zero",
            #[cfg(feature = "postgres")]
            "postgresql://127.0.0.1:5432/db",
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
