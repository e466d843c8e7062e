//! Connection settings, parsed from a URL.
//!
//! `mysql://[user[:password]@]host[:port][/database][?options]`, or the same
//! with `mariadb://` (an alias: both speak the MySQL protocol).
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `table` | `lockcore_locks` | the lock table; the fencing counters live in `<table>_fence`, leaders' values in `<table>_value`, lock-delay records in `<table>_delay` |
//! | `pool_size` | 32 | idle connections kept for waiting and holding locks (each waiting or held lock uses one; beyond these, one is opened for it and closed after), and as many for the fencing counter |
//! | `aux_pool_size` | 8 | connections for the other short statements (cancelling a wait, `KILL`, reading the lock waits) |
//! | `rwlock` | `share` | the layout of a read-write lock: `share` (readers `SELECT ... LOCK IN SHARE MODE` the row that writers `SELECT ... FOR UPDATE`, [`Layout::Native`](lockcore::Layout::Native)) or `built` (from locks, as on Redis and etcd, [`Layout::Built`](lockcore::Layout::Built)), for a `migrate:` from one of those. The two do not see each other: every client of a name must use the same, and a fleet changes layout only with the read-write lock's users stopped |
//! | `semaphore` | `rows` | the layout of a semaphore: `rows` (permit `i` locks row `NAME\x01sem\x01<i>` `FOR UPDATE`, a free one found by `SKIP LOCKED`, MariaDB 10.6 or MySQL 8.0 and later, [`Layout::Native`](lockcore::Layout::Native)) or `built` (from locks, as on Redis and etcd, [`Layout::Built`](lockcore::Layout::Built)), for a `migrate:` from one of those or an older server. As for `rwlock`, every client of a name must use the same |
//! | `fencing` | `strict` | `none` skips the fencing counter: tokens are `None` ([`Fencing::None`](lockcore::Fencing::None)), and an acquisition of a lock makes one round trip fewer (a reader's or a permit's two, and a durable commit) and writes no row; there is then no inspection and no leader election |
//! | `connect_timeout_ms` | 5000 | how long to wait for a new connection |
//! | `request_timeout_ms` | 5000 | how long to wait for a statement that does not wait for a lock |
//! | `ensure_schema` | `true` | create the four tables if missing when connecting (see [`crate::schema_sql`]) |
//!
//! TLS is not built in: `ssl-mode`/`sslmode` other than `disabled` is refused
//! (reach a remote server through a TLS tunnel).

use std::fmt;
use std::time::Duration;

use lockcore::raw::address::{redact, HostPort, Secret, ServerUrl};
use lockcore::{Error, Result};

/// The backend's short name in errors and logs.
pub const NAME: &str = "mysql";

/// The URL schemes this backend takes.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];

/// Settings of a MySQL/MariaDB backend. `Debug` hides the password.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MysqlConfig {
    /// Host name or address.
    pub host: String,
    /// Port (default 3306).
    pub port: u16,
    /// User name.
    pub user: Option<String>,
    /// Password.
    pub password: Option<Secret>,
    /// Database (schema) holding the tables.
    pub database: Option<String>,
    /// The lock table (letters, digits, `_` and `$`, up to 58 characters);
    /// the fencing counters live in `<table>_fence`, leaders' values in
    /// `<table>_value`, lock-delay records in `<table>_delay`.
    pub table: String,
    /// How many connections are kept for waiting and holding locks (each
    /// waiting or held lock uses one; beyond these, one is opened for it).
    pub pool_size: u32,
    /// How many connections run the other short statements (cancelling a
    /// wait, `KILL`, reading the lock waits).
    pub aux_pool_size: u32,
    /// How long to wait for a new connection.
    pub connect_timeout: Duration,
    /// How long to wait for a statement that does not wait for a lock.
    pub request_timeout: Duration,
    /// Whether [`connect`](crate::connect) creates missing tables.
    pub ensure_schema: bool,
    /// Whether each acquisition advances the name's fencing counter (`true`,
    /// the default: strict tokens) or skips it (`fencing=none`: no tokens,
    /// exclusion only, one or two round trips fewer).
    pub fencing: bool,
    /// The layout of a read-write lock: shared and exclusive row locks
    /// ([`Layout::Native`](lockcore::Layout::Native), the default) or built
    /// from locks ([`Layout::Built`](lockcore::Layout::Built)).
    pub rwlock: lockcore::Layout,
    /// The layout of a semaphore: slot rows found with `SKIP LOCKED`
    /// ([`Layout::Native`](lockcore::Layout::Native), the default) or built
    /// from locks ([`Layout::Built`](lockcore::Layout::Built)).
    pub semaphore: lockcore::Layout,
}

impl fmt::Display for MysqlConfig {
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

impl MysqlConfig {
    /// Settings with defaults for `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        MysqlConfig {
            host: host.into(),
            port,
            user: None,
            password: None,
            database: None,
            table: "lockcore_locks".to_owned(),
            pool_size: 32,
            aux_pool_size: 8,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            ensure_schema: true,
            fencing: true,
            rwlock: lockcore::Layout::Native,
            semaphore: lockcore::Layout::Native,
        }
    }

    /// The fencing counter table.
    pub fn fence_table(&self) -> String {
        format!("{}_fence", self.table)
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
            Error::invalid_config(NAME, format!("in MySQL URL {}: {what}", redact(url)))
        };
        let u = ServerUrl::parse(url, 3306).map_err(&bad)?;
        if !matches!(u.scheme.as_str(), "mysql" | "mariadb") {
            return Err(bad(format!(
                "unknown scheme {:?} (expected mysql:// or mariadb://)",
                u.scheme
            )));
        }
        let [host] = &u.hosts[..] else {
            return Err(bad(
                "one host only (a lock lives on one primary server)".into()
            ));
        };
        let mut cfg = MysqlConfig::new(host.host.clone(), host.port);
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
        if let Some(v) = o.string("fencing") {
            cfg.fencing = match v.as_str() {
                "strict" => true,
                "none" => false,
                _ => {
                    return Err(bad(format!(
                        "option fencing={v:?}: expected strict or none"
                    )))
                }
            };
        }
        if let Some(v) = o.string("rwlock") {
            cfg.rwlock = match v.as_str() {
                "share" => lockcore::Layout::Native,
                "built" => lockcore::Layout::Built,
                _ => return Err(bad(format!("option rwlock={v:?}: expected share or built"))),
            };
        }
        if let Some(v) = o.string("semaphore") {
            cfg.semaphore = match v.as_str() {
                "rows" => lockcore::Layout::Native,
                "built" => lockcore::Layout::Built,
                _ => {
                    return Err(bad(format!(
                        "option semaphore={v:?}: expected rows or built"
                    )))
                }
            };
        }
        for key in ["ssl-mode", "sslmode", "ssl_mode"] {
            if let Some(v) = o.string(key) {
                if !v.eq_ignore_ascii_case("disabled") {
                    return Err(bad(format!(
                        "option {key}={v:?}: TLS is not supported by this build; use ssl-mode=disabled through a TLS tunnel"
                    )));
                }
            }
        }
        o.finish().map_err(&bad)?;
        if u.user.is_none() {
            return Err(bad(
                "no user: write mysql://USER:PASSWORD@host/db (a URL without one would log in as whoever the server takes by default)".into(),
            ));
        }
        Ok(cfg)
    }
}

/// Why `table` is not an acceptable table name, if it is not.
pub(crate) fn check_table(table: &str) -> std::result::Result<(), &'static str> {
    if table.is_empty() || table.len() > 58 {
        return Err("a table name has 1 to 58 characters");
    }
    if !table
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
    {
        return Err("a table name has only ASCII letters, digits, '_' and '$'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_the_forms() {
        let c = MysqlConfig::parse(
            "mariadb://u:p%40ss@127.0.0.1:13306/lockcore?table=my_locks&pool_size=8&request_timeout_ms=200&ensure_schema=false",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 13306));
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(c.database.as_deref(), Some("lockcore"));
        assert_eq!(c.table, "my_locks");
        assert_eq!(c.fence_table(), "my_locks_fence");
        assert_eq!(c.pool_size, 8);
        assert_eq!(c.request_timeout, Duration::from_millis(200));
        assert!(!c.ensure_schema);
        assert!(c.fencing);
        assert!(
            !MysqlConfig::parse("mysql://u@h?fencing=none")
                .unwrap()
                .fencing
        );
        assert!(
            MysqlConfig::parse("mysql://u@h?fencing=strict")
                .unwrap()
                .fencing
        );
        assert_eq!(c.rwlock, lockcore::Layout::Native);
        assert_eq!(
            MysqlConfig::parse("mysql://u@h?rwlock=built")
                .unwrap()
                .rwlock,
            lockcore::Layout::Built
        );
        assert_eq!(c.semaphore, lockcore::Layout::Native);
        assert_eq!(
            MysqlConfig::parse("mysql://u@h?semaphore=built")
                .unwrap()
                .semaphore,
            lockcore::Layout::Built
        );
        assert!(!format!("{c:?}").contains("p@ss"));
        assert!(!c.to_string().contains("p@ss"));
        let c = MysqlConfig::parse("mysql://u@db.example").unwrap();
        assert_eq!((c.port, c.database.as_deref()), (3306, None));
        let c = MysqlConfig::parse("mysql://u@[::1]:3307/x").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("::1", 3307));
    }

    #[test]
    fn names_the_wrong_part() {
        for (url, needle) in [
            ("mysql://u@h:notaport", "port \"notaport\""),
            ("mysql://h/db", "no user"),
            ("mysql://u@h/a/b", "one path segment"),
            ("mysql://u@h?bogus=1", "unknown option \"bogus\""),
            ("mysql://u@h?fencing=weak", "option fencing=\"weak\""),
            ("mysql://u@h?rwlock=curator", "option rwlock=\"curator\""),
            (
                "mysql://u@h?semaphore=curator",
                "option semaphore=\"curator\"",
            ),
            ("mysql://u@h?table=x;drop", "option table"),
            ("mysql://u@h?pool_size=0", "pool_size"),
            ("mysql://:secret@h:1?connect_timeout_ms=x", "milliseconds"),
            ("postgres://h", "unknown scheme"),
            ("mysql://u@a,b", "one host"),
            ("mysql://u@h?ssl-mode=required", "TLS"),
            ("h:3306", "missing scheme"),
        ] {
            let e = MysqlConfig::parse(url).unwrap_err();
            assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig);
            assert!(e.to_string().contains(needle), "{url}: {e}");
            assert!(!e.to_string().contains("secret"));
        }
    }
}
