//! Connection settings and the URL forms that give them.
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]...][/][?option=value&...]
//! etcds://...                                   (the same, with TLS)
//! http://host:port[,http://host:port...]         (an endpoints list, as etcdctl takes it)
//! https://host:port[,https://host:port...]       (the same, with TLS)
//! ```
//!
//! The port defaults to 2379. Options (query parameters, percent-encoded):
//!
//! | option | meaning | default |
//! |---|---|---|
//! | `prefix` | key prefix of every lock (see the crate docs); empty for bare `etcdctl lock` names | `lockcore` |
//! | `user`, `password` | etcd authentication (also from the URL's user info) | none |
//! | `tls` | `true` to speak TLS (needs the `tls` feature) | `false` (`true` for `etcds://`, `https://`) |
//! | `ca_file` | PEM file of a CA to trust besides the system's roots | none |
//! | `domain` | the name to check in the members' certificates | the host |
//! | `connect_timeout_ms` | connecting to a member | 3000 |
//! | `request_timeout_ms` | one request; also capped at half the lease ttl (at least 1 s) | 5000 |
//!
//! ```
//! use lockcore_etcd::EtcdConfig;
//!
//! let cfg = EtcdConfig::parse("etcd://app:s3cret@10.0.0.1,10.0.0.2:2380?prefix=locks").unwrap();
//! assert_eq!(cfg.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2380"]);
//! assert_eq!(cfg.prefix, "locks");
//! assert!(!format!("{cfg:?}").contains("s3cret"));
//! ```

use std::time::Duration;

use lockcore::raw::address::{redact, Secret, ServerUrl};
use lockcore::{Error, Result};

/// The backend's short name in errors and logs.
pub const NAME: &str = "etcd";

/// The URL schemes this backend takes: its own, and `http://` or
/// `https://` for a list of endpoints as the etcd client and `etcdctl`
/// write them.
pub const SCHEMES: &[&str] = &["etcd", "etcds", "http", "https"];

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lockcore";

/// Settings of an etcd backend. `Debug` hides the password.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The members, as `http://host:port` (or `https://`).
    pub endpoints: Vec<String>,
    /// The key prefix, without a trailing `/` (may be empty).
    pub prefix: String,
    /// User name for etcd authentication.
    pub user: Option<String>,
    /// Password for etcd authentication (never printed).
    pub password: Option<Secret>,
    /// Whether to speak TLS.
    pub tls: bool,
    /// A PEM file with the CA certificate(s) to trust, for TLS.
    pub ca_file: Option<String>,
    /// The name to verify in the members' certificates, for TLS.
    pub domain: Option<String>,
    /// Timeout of connecting to a member.
    pub connect_timeout: Duration,
    /// Timeout of one request (capped at half the lease ttl, at least 1 s).
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// Settings for `endpoints` (`host:port` or `http(s)://host:port`) with
    /// the defaults.
    pub fn new<S: AsRef<str>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| {
                    let e = e.as_ref();
                    if e.contains("://") {
                        e.to_owned()
                    } else {
                        format!("http://{e}")
                    }
                })
                .collect(),
            prefix: DEFAULT_PREFIX.to_owned(),
            user: None,
            password: None,
            tls: false,
            ca_file: None,
            domain: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
        }
    }

    /// Parses one of the URL forms in the [module docs](self).
    ///
    /// # Errors
    ///
    /// [`lockcore::ErrorKind::InvalidConfig`], naming the part of the URL that is
    /// wrong.
    pub fn parse(url: &str) -> Result<Self> {
        let url = url.trim();
        let bad =
            |what: String| Error::invalid_config(NAME, format!("{what} (in {})", redact(url)));
        if let Some((_, rest)) = url.split_once("://").filter(|(s, _)| s.starts_with("etcd")) {
            if rest.starts_with("http://") || rest.starts_with("https://") {
                return Err(bad(
                    "write endpoints either as etcd://host:2379[,host:2379] or as http://host:2379[,http://host:2379] (https:// for TLS), not both".to_owned(),
                ));
            }
        }
        // An endpoints list (`http://a:2379,http://b:2379?...`) reads as
        // `etcd://a:2379,b:2379?...` (`etcds://` for https).
        let listed;
        let url_form = if url.starts_with("http://") || url.starts_with("https://") {
            let (main, query) = url
                .split_once('?')
                .map_or((url, None), |(m, q)| (m, Some(q)));
            let mut tls = None;
            let mut hosts = Vec::new();
            for e in main.split(',') {
                let e = e.trim();
                let (scheme, hp) = if let Some(hp) = e.strip_prefix("http://") {
                    (false, hp)
                } else if let Some(hp) = e.strip_prefix("https://") {
                    (true, hp)
                } else {
                    return Err(bad(format!(
                        "endpoint {e:?} must start with http:// or https:// like the others"
                    )));
                };
                if *tls.get_or_insert(scheme) != scheme {
                    return Err(bad("endpoints mix http:// and https://".to_owned()));
                }
                if hp.contains('@') {
                    return Err(bad(
                        "put user and password in the user= and password= options of an endpoints list"
                            .to_owned(),
                    ));
                }
                hosts.push(hp.trim_end_matches('/'));
            }
            let scheme = if tls == Some(true) { "etcds" } else { "etcd" };
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            listed = format!("{scheme}://{}{query}", hosts.join(","));
            listed.as_str()
        } else {
            url
        };
        let u = ServerUrl::parse(url_form, 2379).map_err(&bad)?;
        let tls = match u.scheme.as_str() {
            "etcd" => false,
            "etcds" => true,
            _ => {
                return Err(bad(
                    "the URL must start with etcd://, etcds://, http:// or https://".to_owned(),
                ))
            }
        };
        if !u.path.is_empty() {
            return Err(bad(format!(
                "an etcd URL has no path ({:?}): set the key prefix with ?prefix=",
                u.path
            )));
        }
        let scheme = if tls { "https" } else { "http" };
        let endpoints: Vec<String> = u.hosts.iter().map(|h| format!("{scheme}://{h}")).collect();
        let mut cfg = EtcdConfig::new(endpoints);
        cfg.tls = tls;
        if u.password.is_some() && u.user.is_none() {
            return Err(bad("the user name before '@' is empty".to_owned()));
        }
        cfg.user = u.user.clone();
        cfg.password = u.password.clone();
        let mut o = u.options();
        if let Some(p) = o.string("prefix") {
            cfg.prefix = p.trim_end_matches('/').to_owned();
        }
        if let Some(user) = o.string("user") {
            cfg.user = Some(user);
        }
        if let Some(p) = o.string("password") {
            cfg.password = Some(Secret::new(p));
        }
        cfg.tls = o.boolean("tls").map_err(&bad)?.unwrap_or(cfg.tls);
        cfg.ca_file = o.string("ca_file");
        cfg.domain = o.string("domain");
        if let Some(t) = o.millis("connect_timeout_ms").map_err(&bad)? {
            cfg.connect_timeout = t;
        }
        if let Some(t) = o.millis("request_timeout_ms").map_err(&bad)? {
            cfg.request_timeout = t;
        }
        o.finish().map_err(&bad)?;
        if cfg.password.is_some() && cfg.user.is_none() {
            return Err(bad("a password was given without a user".to_owned()));
        }
        if cfg.tls {
            // The endpoints follow the tls option.
            for e in &mut cfg.endpoints {
                if let Some(hp) = e.strip_prefix("http://") {
                    *e = format!("https://{hp}");
                }
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the settings that do not need a server.
    ///
    /// # Errors
    ///
    /// [`lockcore::ErrorKind::InvalidConfig`] for settings that cannot work.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid_config(NAME, "no etcd endpoint given"));
        }
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::invalid_config(
                NAME,
                "TLS was asked for, but lockcore-etcd was built without its `tls` feature",
            ));
        }
        if self.prefix.bytes().any(|b| b.is_ascii_control()) {
            return Err(Error::invalid_config(
                NAME,
                "the key prefix must not contain control characters",
            ));
        }
        Ok(())
    }

    /// The endpoints, for messages.
    pub(crate) fn servers(&self) -> String {
        self.endpoints.join(",")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use lockcore::ErrorKind;

    #[test]
    fn parses_the_forms() {
        let c = EtcdConfig::parse("etcd://h1:2379,h2").unwrap();
        assert_eq!(c.endpoints, ["http://h1:2379", "http://h2:2379"]);
        assert_eq!(c.prefix, "lockcore");
        let c = EtcdConfig::parse("http://127.0.0.1:12381,http://127.0.0.1:12382").unwrap();
        assert_eq!(
            c.endpoints,
            ["http://127.0.0.1:12381", "http://127.0.0.1:12382"]
        );
        let c = EtcdConfig::parse("etcd://u%40x:p%3Aw@[::1]:1/?prefix=&request_timeout_ms=900")
            .unwrap();
        assert_eq!(c.user.as_deref(), Some("u@x"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p:w"));
        assert_eq!(c.endpoints, ["http://[::1]:1"]);
        assert_eq!(c.prefix, "");
        assert_eq!(c.request_timeout, Duration::from_millis(900));
        let c = EtcdConfig::parse("etcd://h?prefix=locks/&user=a&password=b").unwrap();
        assert_eq!(c.prefix, "locks");
        assert_eq!(c.user.as_deref(), Some("a"));
    }

    #[test]
    fn names_the_wrong_part() {
        for (url, part) in [
            ("redis://h", "must start with"),
            ("etcd://h:0", "port"),
            ("etcd://h:x", "port"),
            ("etcd://h1,,h2", "a host is empty"),
            ("etcd://h?colour=red", "unknown option \"colour\""),
            ("etcd://h?request_timeout_ms=0", "request_timeout_ms"),
            ("etcd://h?tls=maybe", "tls"),
            ("http://h:1,h2:2", "http://"),
            ("http://h:1,https://h2:2", "mix"),
            ("etcd://h?password=x", "without a user"),
            ("etcd://http://h:2379", "not both"),
        ] {
            let e = EtcdConfig::parse(url).expect_err(url);
            assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url}");
            assert!(e.to_string().contains(part), "{url}: {e}");
        }
    }

    #[test]
    fn tls_needs_the_feature() {
        for url in ["etcds://h", "etcd://h?tls=true", "https://h:1"] {
            let r = EtcdConfig::parse(url);
            assert_eq!(r.is_ok(), cfg!(feature = "tls"), "{url}: {r:?}");
            if let Ok(c) = r {
                assert!(c.endpoints.iter().all(|e| e.starts_with("https://")));
            }
        }
    }

    #[test]
    fn secrets_stay_hidden() {
        let e = EtcdConfig::parse("etcd://u:topsecret@h?colour=1").expect_err("bad option");
        assert!(!e.to_string().contains("topsecret"), "{e}");
        let e = EtcdConfig::parse("etcd://h?user=u&password=topsecret&colour=1").expect_err("bad");
        assert!(!e.to_string().contains("topsecret"), "{e}");
        let c = EtcdConfig::parse("etcd://u:topsecret@h").unwrap();
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
