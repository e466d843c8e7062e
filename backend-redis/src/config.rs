//! Connection settings, parsed from a URL.
//!
//! | form | topology |
//! |---|---|
//! | `redis://[user[:password]@]host[:port][/db][?options]` | one instance |
//! | `redis+cluster://[user[:password]@]h1:p1,h2:p2[?options]` | Redis Cluster (seed nodes) |
//! | `redlock://[user[:password]@]h1:p1,h2:p2,h3:p3[?options]` | RedLock over independent masters |
//! | `redis+sentinel://[user[:password]@]s1:26379,s2,s3/MASTER[?options]` | the master that the sentinels name `MASTER` |
//! | `rediss://...`, `rediss+cluster://...`, `rediss+sentinel://...` | the same over TLS (feature `tls`) |
//!
//! Options: `prefix` (key prefix, default `lock:`), `response_timeout_ms`
//! (default 500), `connect_timeout_ms` (default 1000), and for one instance,
//! Sentinel and a cluster `sync_replicas=N` with `sync_timeout_ms` (default
//! 100): the replica-sync guard (see [`SyncReplicas`]).
//!
//! Sentinel: the user and password of the URL are the master's (and its
//! replicas'); `sentinel_user` and `sentinel_password` are the sentinels'
//! own, when they ask for any; `db=N` selects the database.
//! `failover_wait_ms` (default 30000; Sentinel, or with `sync_replicas`):
//! how long an acquire that waits rides out a failover (no master
//! answering) or replicas that do not confirm, before it fails.
//!
//! TLS (with the crate's `tls` feature): `rediss://`, `rediss+cluster://`
//! and `rediss+sentinel://` (sentinels and servers alike), or `?tls=true`
//! (RedLock); `?ca_file=/path/ca.pem` trusts that root certificate besides
//! the system's.

use std::fmt;
use std::time::Duration;

use lockcore::raw::address::{redact, HostPort, Secret, ServerUrl};
use lockcore::{Error, Result};

/// The backend's short name in errors and logs.
pub const NAME: &str = "redis";

/// The URL schemes this backend takes.
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "redlock",
];

/// One server's address and credentials. `Debug` hides the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// ACL user name.
    pub user: Option<String>,
    /// Password.
    pub password: Option<Secret>,
    /// Database number (one instance only).
    pub db: i64,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr().fmt(f)
    }
}

impl Node {
    fn addr(&self) -> HostPort {
        HostPort {
            host: self.host.clone(),
            port: self.port,
        }
    }

    /// The node as a `redis://` (or with TLS `rediss://`) URL for the client library.
    pub(crate) fn client_url(&self, tls: bool) -> String {
        // Percent-encoded as RFC 3986 user info, which the client library
        // decodes once: a space is `%20` (never `+`), a `+` is `%2B`.
        let enc = |s: &str| {
            s.bytes().fold(String::new(), |mut out, b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    out.push(char::from(b));
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
                out
            })
        };
        let auth = match (&self.user, &self.password) {
            (Some(u), Some(p)) => format!("{}:{}@", enc(u), enc(p.expose())),
            (Some(u), None) => format!("{}@", enc(u)),
            (None, Some(p)) => format!(":{}@", enc(p.expose())),
            (None, None) => String::new(),
        };
        let scheme = if tls { "rediss" } else { "redis" };
        format!("{scheme}://{auth}{}/{}", self.addr(), self.db)
    }
}

/// How the backend reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One instance (or a master with replicas, reached through the master).
    Single(Node),
    /// A Redis Cluster, by its seed nodes.
    Cluster(Vec<Node>),
    /// RedLock over independent masters.
    RedLock(Vec<Node>),
    /// The master that Redis Sentinel names, followed across failovers.
    Sentinel(SentinelSet),
}

/// The sentinels that name a master, and how to reach them.
///
/// `Debug` hides the passwords.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelSet {
    /// The sentinels' addresses.
    pub sentinels: Vec<HostPort>,
    /// The master's name, as the sentinels know it (`sentinel monitor NAME ...`).
    pub master_name: String,
    /// The master's credentials and database, as a node without an address
    /// (its host and port are the sentinels' answer).
    pub master: Node,
    /// The sentinels' own ACL user, if they ask for one.
    pub sentinel_user: Option<String>,
    /// The sentinels' own password, if they ask for one.
    pub sentinel_password: Option<Secret>,
}

impl fmt::Display for SentinelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "master {:?} of sentinels ", self.master_name)?;
        for (i, s) in self.sentinels.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            s.fmt(f)?;
        }
        Ok(())
    }
}

/// The replica-sync guard: every acquire, renewal and release counts only
/// once `WAIT count timeout` confirms that `count` replicas have it.
///
/// The write and its `WAIT` go in one pipeline on one connection (`WAIT`
/// counts the writes of its own connection). An acquire that is not
/// confirmed is undone and fails with `Unavailable`; a renewal that is not
/// confirmed is not counted (the lease's validity is not extended, so its
/// lost signal fires at the validity it had unless a later renewal is
/// confirmed); a release that is not confirmed fails with `Unavailable`,
/// as the name may then stay taken on a promoted replica until its ttl.
/// On a cluster, `WAIT` runs on the master of the lock's slot, counting
/// that shard's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncReplicas {
    /// How many replicas must confirm the write.
    pub count: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

/// Settings of a Redis backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The servers.
    pub topology: Topology,
    /// Prefix of every key (default `lock:`).
    pub prefix: String,
    /// How long to wait for a reply (default 500 ms: well below the 1 s
    /// minimum ttl).
    pub response_timeout: Duration,
    /// How long to wait for a connection (default 1 s).
    pub connect_timeout: Duration,
    /// Replica-sync guard (not on RedLock).
    pub sync_replicas: Option<SyncReplicas>,
    /// How long an acquire that waits rides out a failover (no master
    /// answering, on Sentinel) or replicas that do not confirm (with the
    /// replica-sync guard) before it fails (default 30 s).
    pub failover_wait: Duration,
    /// TLS to every server (needs the `tls` feature).
    pub tls: bool,
    /// A root certificate (PEM file) to trust besides the system's, for TLS.
    pub ca_file: Option<String>,
}

impl RedisConfig {
    /// Settings with defaults for `topology`.
    pub fn new(topology: Topology) -> Self {
        RedisConfig {
            topology,
            prefix: "lock:".to_owned(),
            response_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(1),
            sync_replicas: None,
            failover_wait: Duration::from_secs(30),
            tls: false,
            ca_file: None,
        }
    }

    /// How long a request may take: the response timeout, plus the
    /// replica-sync guard's `WAIT` where there is one.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.response_timeout + self.sync_replicas.map_or(Duration::ZERO, |s| s.timeout)
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
            Error::invalid_config(NAME, format!("in Redis URL {}: {what}", redact(url)))
        };
        let sentinel = url
            .trim_start()
            .to_ascii_lowercase()
            .contains("+sentinel://");
        let u = ServerUrl::parse(url, if sentinel { 26379 } else { 6379 }).map_err(&bad)?;
        let mut o = u.options();
        let db = match (sentinel, u.path.as_str()) {
            (true, "") => {
                return Err(bad(
                    "Sentinel URLs name the master after the hosts: redis+sentinel://s1:26379,s2:26379/MASTER"
                        .into(),
                ))
            }
            (true, _) => o.number::<i64>("db").map_err(&bad)?.unwrap_or(0),
            (false, "") => 0,
            (false, d) => d
                .parse::<i64>()
                .map_err(|_| bad(format!("database {d:?} is not a number")))?,
        };
        let mut nodes: Vec<Node> = u
            .hosts
            .iter()
            .map(|h| Node {
                host: h.host.clone(),
                port: h.port,
                user: u.user.clone(),
                password: u.password.clone(),
                db,
            })
            .collect();
        let topology = match u.scheme.as_str() {
            "redis" if nodes.len() == 1 => Topology::Single(nodes.remove(0)),
            "redis" => {
                return Err(bad(
                    "redis:// takes one host; use redis+cluster:// or redlock:// for several"
                        .into(),
                ))
            }
            "rediss" if nodes.len() == 1 => Topology::Single(nodes.remove(0)),
            "rediss" => {
                return Err(bad(
                    "rediss:// takes one host; use rediss+cluster:// or redlock://...?tls=true for several"
                        .into(),
                ))
            }
            "redis+cluster" | "rediss+cluster" => Topology::Cluster(nodes),
            "redis+sentinel" | "rediss+sentinel" => Topology::Sentinel(SentinelSet {
                sentinels: u.hosts.clone(),
                master_name: u.path.clone(),
                master: Node {
                    host: String::new(),
                    port: 0,
                    user: u.user.clone(),
                    password: u.password.clone(),
                    db,
                },
                sentinel_user: o.string("sentinel_user"),
                sentinel_password: o.string("sentinel_password").map(Secret::new),
            }),
            "redlock" if nodes.len() >= 3 && nodes.len() % 2 == 1 => Topology::RedLock(nodes),
            "redlock" => {
                return Err(bad(format!(
                    "RedLock needs an odd number of at least 3 independent masters, got {}",
                    nodes.len()
                )))
            }
            other => {
                return Err(bad(format!(
                    "unknown scheme {other:?} (expected redis://, rediss://, redis+cluster://, redis+sentinel:// or redlock://)"
                )))
            }
        };
        let mut cfg = RedisConfig::new(topology);
        cfg.tls = u.scheme.starts_with("rediss");
        if let Some(p) = o.string("prefix") {
            cfg.prefix = p;
        }
        cfg.ca_file = o.string("ca_file");
        cfg.tls = o.boolean("tls").map_err(&bad)?.unwrap_or(cfg.tls);
        if let Some(t) = o.millis("response_timeout_ms").map_err(&bad)? {
            cfg.response_timeout = t;
        }
        if let Some(t) = o.millis("connect_timeout_ms").map_err(&bad)? {
            cfg.connect_timeout = t;
        }
        let sync_timeout = o
            .millis("sync_timeout_ms")
            .map_err(&bad)?
            .unwrap_or(Duration::from_millis(100));
        let sync_count = o.number::<u32>("sync_replicas").map_err(&bad)?;
        if let Some(t) = o.millis("failover_wait_ms").map_err(&bad)? {
            if !sentinel {
                return Err(bad(
                    "failover_wait_ms applies to Sentinel (redis+sentinel://) only".into(),
                ));
            }
            cfg.failover_wait = t;
        }
        o.finish().map_err(&bad)?;
        if let Some(count) = sync_count {
            if matches!(cfg.topology, Topology::RedLock(_)) {
                return Err(bad(
                    "sync_replicas does not apply to RedLock (its masters are independent)".into(),
                ));
            }
            cfg.sync_replicas = Some(SyncReplicas {
                count,
                timeout: sync_timeout,
            });
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms() {
        let c = RedisConfig::parse(
            "redis://u:p%40ss@127.0.0.1:7000/2?prefix=x:&response_timeout_ms=200",
        )
        .unwrap();
        let Topology::Single(n) = &c.topology else {
            panic!()
        };
        assert_eq!((n.host.as_str(), n.port, n.db), ("127.0.0.1", 7000, 2));
        assert_eq!(n.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(c.prefix, "x:");
        assert_eq!(c.response_timeout, Duration::from_millis(200));
        assert!(!format!("{c:?}").contains("p@ss"));
        let c = RedisConfig::parse("redis+cluster://a:1,b:2,c").unwrap();
        assert!(matches!(&c.topology, Topology::Cluster(v) if v.len() == 3 && v[2].port == 6379));
        let c = RedisConfig::parse("redlock://a:1,b:2,c:3,d:4,e:5").unwrap();
        assert!(matches!(&c.topology, Topology::RedLock(v) if v.len() == 5));
        let c = RedisConfig::parse(
            "redis+sentinel://u:s3cret@a,b:26380/mymaster?db=2&sentinel_password=p%40w&sync_replicas=1",
        )
        .unwrap();
        let Topology::Sentinel(s) = &c.topology else {
            panic!()
        };
        assert_eq!(s.master_name, "mymaster");
        assert_eq!((s.sentinels[0].port, s.sentinels[1].port), (26379, 26380));
        assert_eq!(s.master.db, 2);
        assert_eq!(
            s.master.password.as_ref().map(Secret::expose),
            Some("s3cret")
        );
        assert_eq!(
            s.sentinel_password.as_ref().map(Secret::expose),
            Some("p@w")
        );
        assert_eq!(c.sync_replicas.map(|s| s.count), Some(1));
        assert!(!format!("{c:?}").contains("s3cret"));
        let c = RedisConfig::parse("redis+cluster://a:1?sync_replicas=1").unwrap();
        assert!(c.sync_replicas.is_some());
    }

    #[test]
    fn names_the_wrong_part() {
        for (url, needle) in [
            ("redis://h:notaport", "port \"notaport\""),
            ("redis://h,", "a host is empty"),
            ("redis://h/x", "database \"x\""),
            ("redis://h?bogus=1", "unknown option \"bogus\""),
            ("redlock://a,b", "odd number"),
            ("redis://a,b", "one host"),
            ("memcached://h", "unknown scheme"),
            ("redis://:secret@h:1?response_timeout_ms=x", "milliseconds"),
            ("rediss://a,b", "one host"),
            ("redis://h?tls=maybe", "true or false"),
            ("redis+sentinel://a,b", "name the master"),
            ("redis+sentinel://a/m?db=x", "db"),
            ("redis://h?failover_wait_ms=10", "Sentinel"),
            ("redlock://a,b,c?sync_replicas=1", "RedLock"),
        ] {
            let e = RedisConfig::parse(url).unwrap_err();
            assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(needle), "{url}: {e}");
            assert!(!e.to_string().contains("secret"));
        }
    }
}
