//! Connection settings, parsed from a URL.
//!
//! `postgres://[user[:password]@]host[:port][/database][?options]`, or the
//! same with `postgresql://`.
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `table` | `lockcore_locks` | the table of fencing counters, holders and leaders' values (one row per name) |
//! | `pool_size` | 32 | idle connections kept for waiting and holding locks (each waiting or held lock uses one; beyond these, one is opened for it and closed after) |
//! | `aux_pool_size` | 4 | connections for inspection and for ending the server session of a dropped wait |
//! | `connect_timeout_ms` | 5000 | how long to wait for a new connection |
//! | `request_timeout_ms` | 5000 | how long to wait for a statement that does not wait for a lock |
//! | `ensure_schema` | `true` | create the table if missing when connecting (see [`crate::schema_sql`]); a user without the right to create tables connects to one made in advance |
//! | `rwlock` | `shared` | the layout of a read-write lock: `shared` (readers take the shared advisory lock on `hashtextextended(name, 1)`, a writer the exclusive one, [`Layout::Native`](lockcore::Layout::Native)) or `built` (from locks, as on Redis and etcd, [`Layout::Built`](lockcore::Layout::Built)), for a `migrate:` from one of those. Every client of a name must use the same |
//! | `sslmode` | `disable` | `disable`, `prefer`, `require`, `verify-ca` or `verify-full`; anything but `disable` needs the crate's `tls` feature |
//! | `sslrootcert` | | a PEM file of root certificates for `verify-ca` and `verify-full` |

use std::fmt;
use std::time::Duration;

use lockcore::raw::address::{redact, HostPort, Secret, ServerUrl};
use lockcore::{Error, Result};

/// The backend's short name in errors and logs.
pub const NAME: &str = "postgres";

/// The URL schemes this backend takes.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// How the connection is encrypted (`sslmode`, as libpq's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it.
    Prefer,
    /// TLS, without checking the certificate.
    Require,
    /// TLS, the certificate signed by a known root.
    VerifyCa,
    /// TLS, the certificate signed by a known root and naming the host.
    VerifyFull,
}

/// Settings of a PostgreSQL backend. `Debug` hides the password.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// Host name or address.
    pub host: String,
    /// Port (default 5432).
    pub port: u16,
    /// User name.
    pub user: Option<String>,
    /// Password.
    pub password: Option<Secret>,
    /// Database.
    pub database: Option<String>,
    /// The table of fencing counters, holders and values (letters, digits
    /// and `_`, up to 63 characters).
    pub table: String,
    /// How many connections are kept for waiting and holding locks.
    pub pool_size: u32,
    /// How many connections inspect and end dropped waits.
    pub aux_pool_size: u32,
    /// How long to wait for a new connection.
    pub connect_timeout: Duration,
    /// How long to wait for a statement that does not wait for a lock.
    pub request_timeout: Duration,
    /// Whether [`connect`](crate::connect) creates the table if missing.
    pub ensure_schema: bool,
    /// The layout of a read-write lock: shared and exclusive advisory locks
    /// ([`Layout::Native`](lockcore::Layout::Native), the default) or built
    /// from locks ([`Layout::Built`](lockcore::Layout::Built)).
    pub rwlock: lockcore::Layout,
    /// How the connection is encrypted.
    pub ssl_mode: SslMode,
    /// Root certificates (PEM) for [`SslMode::VerifyCa`] and
    /// [`SslMode::VerifyFull`].
    pub ssl_root_cert: Option<String>,
}

impl fmt::Display for PostgresConfig {
    /// `host:port/database`, without credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = HostPort {
            host: self.host.clone(),
            port: self.port,
        };
        write!(f, "{addr}")?;
        if let Some(db) = &self.database {
            write!(f, "/{db}")?;
        }
        Ok(())
    }
}

impl PostgresConfig {
    /// Settings with defaults for `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        PostgresConfig {
            host: host.into(),
            port,
            user: None,
            password: None,
            database: None,
            table: "lockcore_locks".to_owned(),
            pool_size: 32,
            aux_pool_size: 4,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            ensure_schema: true,
            rwlock: lockcore::Layout::Native,
            ssl_mode: SslMode::Disable,
            ssl_root_cert: None,
        }
    }

    /// Parses a URL (see the module docs).
    ///
    /// # Errors
    ///
    /// [`lockcore::ErrorKind::InvalidConfig`], naming the part of the URL
    /// that is wrong.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |what: String| {
            Error::invalid_config(NAME, format!("in PostgreSQL URL {}: {what}", redact(url)))
        };
        let u = ServerUrl::parse(url, 5432).map_err(&bad)?;
        if !SCHEMES.contains(&u.scheme.as_str()) {
            return Err(bad(format!(
                "unknown scheme {:?} (expected postgres:// or postgresql://)",
                u.scheme
            )));
        }
        let [host] = &u.hosts[..] else {
            return Err(bad(
                "one host only (a lock lives on one primary server)".into()
            ));
        };
        let mut cfg = PostgresConfig::new(host.host.clone(), host.port);
        cfg.user = u.user.clone();
        cfg.password = u.password.clone();
        if u.path.contains('/') {
            return Err(bad(format!(
                "database {:?} must be one path segment",
                u.path
            )));
        }
        if !u.path.is_empty() {
            cfg.database = Some(u.path.clone());
        }
        let mut o = u.options();
        if let Some(v) = o.string("table") {
            check_table(&v).map_err(|why| bad(format!("option table={v:?}: {why}")))?;
            cfg.table = v;
        }
        for (key, field) in [
            ("pool_size", &mut cfg.pool_size),
            ("aux_pool_size", &mut cfg.aux_pool_size),
        ] {
            if let Some(n) = o.number::<u32>(key).map_err(&bad)? {
                if !(1..=10_000).contains(&n) {
                    return Err(bad(format!(
                        "option {key}={n} is not a count from 1 to 10000"
                    )));
                }
                *field = n;
            }
        }
        if let Some(t) = o.millis("connect_timeout_ms").map_err(&bad)? {
            cfg.connect_timeout = t;
        }
        if let Some(t) = o.millis("request_timeout_ms").map_err(&bad)? {
            cfg.request_timeout = t;
        }
        if let Some(b) = o.boolean("ensure_schema").map_err(&bad)? {
            cfg.ensure_schema = b;
        }
        if let Some(v) = o.string("rwlock") {
            cfg.rwlock = match v.as_str() {
                "shared" => lockcore::Layout::Native,
                "built" => lockcore::Layout::Built,
                _ => {
                    return Err(bad(format!(
                        "option rwlock={v:?}: expected shared or built"
                    )))
                }
            };
        }
        if let Some(v) = o.string("sslmode") {
            cfg.ssl_mode = match v.as_str() {
                "disable" => SslMode::Disable,
                "prefer" => SslMode::Prefer,
                "require" => SslMode::Require,
                "verify-ca" => SslMode::VerifyCa,
                "verify-full" => SslMode::VerifyFull,
                _ => {
                    return Err(bad(format!(
                        "option sslmode={v:?}: expected disable, prefer, require, verify-ca or verify-full"
                    )))
                }
            };
            if cfg.ssl_mode != SslMode::Disable && !cfg!(feature = "tls") {
                return Err(bad(format!(
                    "option sslmode={v}: this build has no TLS (the `tls` feature of lockcore-postgres, or distlock's `full`)"
                )));
            }
        }
        cfg.ssl_root_cert = o.string("sslrootcert");
        o.finish().map_err(&bad)?;
        if u.user.is_none() {
            return Err(bad(
                "no user: write postgres://USER:PASSWORD@host/db (a URL without one would log in as whoever the server takes by default)".into(),
            ));
        }
        Ok(cfg)
    }
}

/// Why `table` is not an acceptable table name, if it is not.
pub(crate) fn check_table(table: &str) -> std::result::Result<(), &'static str> {
    if table.is_empty() || table.len() > 63 {
        return Err("a table name has 1 to 63 characters");
    }
    if table.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("a table name does not start with a digit");
    }
    if !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("a table name has letters, digits and `_` only");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn parses_a_url_and_names_what_is_wrong() {
        let c = PostgresConfig::parse(
            "postgresql://app:s%40cret@db:6543/locks?pool_size=8&table=my_locks",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("db", 6543));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("s@cret"));
        assert_eq!((c.pool_size, c.table.as_str()), (8, "my_locks"));
        assert_eq!(c.database.as_deref(), Some("locks"));
        assert_eq!(c.to_string(), "db:6543/locks");
        for (url, says) in [
            ("postgres://db/x", "no user"),
            ("postgres://u@a,b/x", "one host"),
            ("postgres://u@db/x?table=a-b", "table"),
            ("postgres://u@db/x?pool_size=0", "pool_size"),
            ("postgres://u@db/x?colour=red", "colour"),
            ("postgres://u@db/x?sslmode=maybe", "sslmode"),
        ] {
            let e = PostgresConfig::parse(url).unwrap_err();
            assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        let e = PostgresConfig::parse("postgres://u:hunter2@db:99999/x").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
