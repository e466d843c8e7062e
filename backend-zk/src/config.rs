//! Connection settings, parsed from a URL.
//!
//! ```text
//! zk://[user:password@]h1:2181,h2:2181[/chroot][?options]
//! zookeeper://...                                  (the same)
//! ```
//!
//! - **hosts**: one or more `host[:port]` (port 2181 by default).
//! - **chroot**: every path of this backend lives under it (default: none).
//!   Missing components are created (as container nodes).
//! - **user:password**: digest authentication (`addauth digest user:password`)
//!   on every session. Percent-encode `:`, `@` and `/` in them.
//!
//! Options:
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `prefix` | `/lockcore` | the path, under the chroot, whose children are the lock parents |
//! | `acl` | `open` | ACL of lock nodes: `open` (world:anyone all), `creator` (all for the authenticated creator only; needs `user:password`), `creator-read` (the creator all, everyone read) |
//! | `connect_timeout_ms` | `5000` | how long to wait for a session to be established |
//! | `connection_timeout_ms` | `4000` | idle time after which a connection counts as broken (capped at 2/5 of the session timeout) |
//! | `request_timeout_ms` | `5000` | how long one request may take, retries across a reconnect included, before it fails with `Unavailable` (or `Indeterminate` for a node creation) |
//! | `semaphore` | `curator` | the layout of a semaphore: `curator` (Curator's `InterProcessSemaphoreV2`, [`Layout::Native`]) or `built` (from locks, as on the other backends, [`Layout::Built`]), for a `migrate:` from a backend that builds it. As with `rwlock`, every client of a name must use the same |
//! | `rwlock` | `curator` | the layout of a read-write lock: `curator` (Curator's `InterProcessReadWriteLock`, [`Layout::Native`]) or `built` (from locks, as on the other backends, [`Layout::Built`]), for a `migrate:` from a backend that builds it. The two do not see each other: every client of a name must use the same, and a fleet changes layout only with the read-write lock's users stopped |
//!
//! The session timeout is not an option: it comes from each lock's ttl (see
//! the crate docs).

use std::time::Duration;

use lockcore::raw::address::{redact, Secret, ServerUrl};
use lockcore::{Error, Layout, Result};

/// The backend's short name in errors and logs.
pub const NAME: &str = "zookeeper";

/// The URL schemes this backend takes.
pub const SCHEMES: &[&str] = &["zk", "zookeeper"];

/// The ACL of lock nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AclMode {
    /// `world:anyone` with all permissions (ZooKeeper's `OPEN_ACL_UNSAFE`).
    Open,
    /// All permissions for the authenticated creator only
    /// (`CREATOR_ALL_ACL`); needs digest credentials.
    Creator,
    /// All permissions for the creator, read for everyone.
    CreatorRead,
}

/// Settings of a ZooKeeper backend. `Debug` hides the password.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// `host:port` of each server.
    pub hosts: Vec<String>,
    /// The chroot (`""` for none, else `/a/b`).
    pub chroot: String,
    /// The path under the chroot whose children are the lock parents.
    pub prefix: String,
    /// Digest credentials (`user`, `password`).
    pub digest: Option<(String, Secret)>,
    /// ACL of lock nodes.
    pub acl: AclMode,
    /// How long to wait for a session to be established.
    pub connect_timeout: Duration,
    /// Idle time after which a connection counts as broken.
    pub connection_timeout: Duration,
    /// How long one request may take, retries across a reconnect included.
    pub request_timeout: Duration,
    /// The layout of a read-write lock: Curator's ([`Layout::Native`],
    /// the default) or built from locks ([`Layout::Built`]).
    pub rwlock: Layout,
    /// The layout of a semaphore: Curator's ([`Layout::Native`], the
    /// default) or built from locks ([`Layout::Built`]).
    pub semaphore: Layout,
}

impl ZkConfig {
    /// Settings with defaults for `hosts` (each `host:port`).
    pub fn new(hosts: Vec<String>) -> Self {
        ZkConfig {
            hosts,
            chroot: String::new(),
            prefix: "/lockcore".to_owned(),
            digest: None,
            acl: AclMode::Open,
            connect_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(4),
            request_timeout: Duration::from_secs(5),
            rwlock: Layout::Native,
            semaphore: Layout::Native,
        }
    }

    /// The connect string for the client library (no chroot: paths are
    /// prefixed by this crate so it can create the chroot).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The base path: chroot + prefix.
    pub(crate) fn base(&self) -> String {
        format!("{}{}", self.chroot, self.prefix)
    }

    /// Parses a URL (see the module docs). Errors are
    /// [`InvalidConfig`](lockcore::ErrorKind::InvalidConfig) and name the part
    /// that is wrong.
    ///
    /// # Errors
    ///
    /// [`lockcore::ErrorKind::InvalidConfig`], naming the part of the URL that is
    /// wrong.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |what: String| {
            Error::invalid_config(NAME, format!("in ZooKeeper URL {}: {what}", redact(url)))
        };
        let u = ServerUrl::parse(url, 2181).map_err(&bad)?;
        if u.scheme != "zk" && u.scheme != "zookeeper" {
            return Err(bad(format!(
                "unknown scheme {:?} (expected zk:// or zookeeper://)",
                u.scheme
            )));
        }
        let digest = match (&u.user, &u.password) {
            (None, None) => None,
            (Some(user), Some(pass)) => Some((user.clone(), pass.clone())),
            (None, Some(_)) => return Err(bad("the digest user name is empty".into())),
            (Some(_), None) => {
                return Err(bad(
                    "credentials must be user:password (digest authentication)".into(),
                ))
            }
        };
        let list = u.hosts.iter().map(|h| h.to_string()).collect();
        let mut cfg = ZkConfig::new(list);
        cfg.digest = digest;
        let chroot = if u.path.is_empty() {
            String::new()
        } else {
            format!("/{}", u.path)
        };
        cfg.chroot = normalize_path(&chroot).map_err(|e| bad(format!("chroot: {e}")))?;
        let mut o = u.options();
        if let Some(v) = o.string("prefix") {
            let p = normalize_path(&v).map_err(|e| bad(format!("prefix: {e}")))?;
            if p.is_empty() {
                return Err(bad("prefix must not be the root".into()));
            }
            cfg.prefix = p;
        }
        if let Some(v) = o.string("acl") {
            cfg.acl = match v.as_str() {
                "open" => AclMode::Open,
                "creator" => AclMode::Creator,
                "creator-read" => AclMode::CreatorRead,
                other => {
                    return Err(bad(format!(
                        "acl={other:?} is unknown (expected open, creator or creator-read)"
                    )))
                }
            }
        }
        for (key, field) in [
            ("rwlock", &mut cfg.rwlock),
            ("semaphore", &mut cfg.semaphore),
        ] {
            if let Some(v) = o.string(key) {
                *field = match v.as_str() {
                    "curator" => Layout::Native,
                    "built" => Layout::Built,
                    other => {
                        return Err(bad(format!(
                            "{key}={other:?} is unknown (expected curator or built)"
                        )))
                    }
                }
            }
        }
        for (key, field) in [
            ("connect_timeout_ms", &mut cfg.connect_timeout),
            ("connection_timeout_ms", &mut cfg.connection_timeout),
            ("request_timeout_ms", &mut cfg.request_timeout),
        ] {
            if let Some(t) = o.millis(key).map_err(&bad)? {
                *field = t;
            }
        }
        o.finish().map_err(&bad)?;
        if cfg.acl != AclMode::Open && cfg.digest.is_none() {
            return Err(bad(
                "acl=creator and acl=creator-read need digest credentials (zk://user:password@host/...)"
                    .into(),
            ));
        }
        Ok(cfg)
    }
}

/// `""` or `/a/b` (no trailing slash, no empty, `.` or `..` components).
fn normalize_path(p: &str) -> std::result::Result<String, String> {
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    if !trimmed.starts_with('/') {
        return Err(format!("{p:?} must start with '/'"));
    }
    for part in trimmed[1..].split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("{p:?} has an empty, '.' or '..' component"));
        }
        if part.chars().any(|c| c.is_control()) {
            return Err(format!("{p:?} has a control character"));
        }
    }
    if trimmed == "/zookeeper" || trimmed.starts_with("/zookeeper/") {
        return Err(format!("{p:?} is under ZooKeeper's reserved /zookeeper"));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_the_forms() {
        let c =
            ZkConfig::parse("zk://a:1,b,c:3/app/x?prefix=/locks&connect_timeout_ms=200").unwrap();
        assert_eq!(c.hosts, ["a:1", "b:2181", "c:3"]);
        assert_eq!(c.chroot, "/app/x");
        assert_eq!(c.prefix, "/locks");
        assert_eq!(c.base(), "/app/x/locks");
        assert_eq!(c.connect_timeout, Duration::from_millis(200));
        let c = ZkConfig::parse("zookeeper://u:p%40ss@h:2181/?acl=creator").unwrap();
        assert_eq!(c.chroot, "");
        assert_eq!(c.digest, Some(("u".into(), Secret::new("p@ss"))));
        assert_eq!(c.acl, AclMode::Creator);
        assert!(!format!("{c:?}").contains("p@ss"));
        let c = ZkConfig::parse("zk://127.0.0.1:12181").unwrap();
        assert_eq!(c.base(), "/lockcore");
        assert_eq!(c.rwlock, Layout::Native);
        let c = ZkConfig::parse("zk://h?rwlock=built").unwrap();
        assert_eq!((c.rwlock, c.semaphore), (Layout::Built, Layout::Native));
        let c = ZkConfig::parse("zk://h?semaphore=built").unwrap();
        assert_eq!((c.rwlock, c.semaphore), (Layout::Native, Layout::Built));
    }

    #[test]
    fn names_the_wrong_part() {
        for (url, needle) in [
            ("zk://h:notaport", "port \"notaport\""),
            ("zk://h/a//b", "chroot"),
            ("zk://h/a/../b", "chroot"),
            ("zk://h?bogus=1", "unknown option \"bogus\""),
            ("zk://h?acl=creator", "need digest credentials"),
            ("zk://h?acl=everyone", "acl=\"everyone\""),
            ("zk://h?rwlock=shared", "rwlock=\"shared\""),
            ("zk://h?semaphore=3", "semaphore=\"3\""),
            ("zk://h?prefix=rel", "must start with"),
            ("redis://h", "unknown scheme"),
            ("zk://u:secret@h:1?connect_timeout_ms=x", "milliseconds"),
            ("zk://secret@h:1", "user:password"),
            ("zk://h,,b", "empty"),
        ] {
            let e = ZkConfig::parse(url).unwrap_err();
            assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(needle), "{url}: {e}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
    }
}
