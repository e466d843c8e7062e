//! Server lists as lock URLs write them, parsed once for every backend.
//!
//! `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?key=value&...]`
//!
//! Several hosts separated by commas (a cluster's seeds, an ensemble, a
//! RedLock set) do not fit a standard URL parser, so backends parse their
//! URLs here and turn the parts into their own settings. User, password,
//! path and options are percent-decoded; [`UrlOptions`] reads the options
//! by type, with one wording for every backend's errors. [`redact`] hides
//! credentials for messages, and [`Secret`] keeps a password out of `Debug`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A secret (a password): `Debug` shows `***`, never the value, and there
/// is no `Display`, so that formatting it by mistake does not compile.
///
/// ```
/// use lockcore::raw::address::Secret;
///
/// let s = Secret::new("hunter2");
/// assert_eq!(format!("{s:?}"), "***");
/// assert_eq!(s.expose(), "hunter2");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it to the server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A parsed lock URL. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// The scheme, e.g. `redis+cluster`.
    pub scheme: String,
    /// The user, if any.
    pub user: Option<String>,
    /// The password, if any.
    pub password: Option<Secret>,
    /// The hosts, in order, at least one.
    pub hosts: Vec<HostPort>,
    /// The path without its leading `/` (a database, a chroot), decoded.
    pub path: String,
    /// The options, in order.
    pub options: Vec<(String, String)>,
}

impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerUrl")
            .field("scheme", &self.scheme)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("options", &self.options)
            .finish()
    }
}

impl ServerUrl {
    /// Parses `url`; hosts without a port get `default_port`. The error says
    /// which part is wrong (and never contains the password).
    ///
    /// ```
    /// use lockcore::raw::address::ServerUrl;
    ///
    /// let u = ServerUrl::parse("zk://app:s%40cret@h1:2181,h2/locks?acl=creator", 2181).unwrap();
    /// assert_eq!(u.hosts.len(), 2);
    /// assert_eq!(u.hosts[1].port, 2181);
    /// assert_eq!(u.password.as_ref().map(|p| p.expose()), Some("s@cret"));
    /// assert_eq!(u.path, "locks");
    /// assert_eq!(u.option("acl"), Some("creator"));
    /// assert!(ServerUrl::parse("zk://h:99999", 2181).unwrap_err().contains("port \"99999\""));
    /// ```
    ///
    /// # Errors
    ///
    /// A message naming the part of the URL that is wrong (never the password).
    pub fn parse(url: &str, default_port: u16) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| "missing scheme (scheme://host:port)".to_owned())?;
        let (authority, tail) = match rest.find(['/', '?']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        // User info and path: `%XX` only, a `+` is a `+` (RFC 3986). Option
        // values are form-encoded, where a `+` is also a space.
        let decode_with = |part: &str, what: &str, plus_is_space: bool| {
            percent_decode(part, plus_is_space)
                .ok_or_else(|| format!("{what} is not percent-encoded correctly"))
        };
        let decode = |part: &str, what: &str| decode_with(part, what, false);
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = match u.split_once(':') {
                    Some((a, b)) => (a, Some(b)),
                    None => (u, None),
                };
                let user = (!user.is_empty())
                    .then(|| decode(user, "the user"))
                    .transpose()?;
                let pass = pass.map(|p| decode(p, "the password")).transpose()?;
                (user, pass.map(Secret))
            }
        };
        let hosts = hosts
            .split(',')
            .map(|h| parse_host(h, default_port))
            .collect::<Result<Vec<_>, _>>()?;
        let path = decode(path.trim_start_matches('/'), "the path")?;
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            options.push((
                decode_with(k, "an option name", true)?,
                decode_with(v, "an option value", true)?,
            ));
        }
        Ok(ServerUrl {
            scheme: scheme.to_owned(),
            user,
            password,
            hosts,
            path,
            options,
        })
    }

    /// The last value of option `key`.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The options, to read by type (see [`UrlOptions`]).
    pub fn options(&self) -> UrlOptions<'_> {
        UrlOptions {
            pairs: &self.options,
            read: vec![false; self.options.len()],
        }
    }
}

/// The options of a lock URL, read by name and type. Every backend reads
/// its options this way, so their errors read alike; [`finish`] refuses the
/// options nobody read. The last value of an option wins.
///
/// ```
/// use std::time::Duration;
/// use lockcore::raw::address::ServerUrl;
///
/// let u = ServerUrl::parse("x://h?timeout_ms=250&tls=true&n=3", 1).unwrap();
/// let mut o = u.options();
/// assert_eq!(o.millis("timeout_ms").unwrap(), Some(Duration::from_millis(250)));
/// assert_eq!(o.boolean("tls").unwrap(), Some(true));
/// assert_eq!(o.number::<u32>("n").unwrap(), Some(3));
/// assert_eq!(o.string("prefix"), None);
/// o.finish().unwrap();
///
/// let u = ServerUrl::parse("x://h?timeout_ms=soon&bogus=1", 1).unwrap();
/// let mut o = u.options();
/// assert!(o.millis("timeout_ms").unwrap_err().contains("milliseconds"));
/// assert!(o.finish().unwrap_err().contains("unknown option \"bogus\""));
/// ```
///
/// [`finish`]: UrlOptions::finish
#[derive(Debug)]
pub struct UrlOptions<'a> {
    pairs: &'a [(String, String)],
    read: Vec<bool>,
}

impl UrlOptions<'_> {
    /// The value of `key`, marked read.
    pub fn string(&mut self, key: &str) -> Option<String> {
        let mut found = None;
        for (i, (k, v)) in self.pairs.iter().enumerate() {
            if k == key {
                self.read[i] = true;
                found = Some(v.clone());
            }
        }
        found
    }

    /// `key` as a whole number of milliseconds above zero.
    ///
    /// # Errors
    ///
    /// A message when the value is not a whole number of milliseconds above zero.
    pub fn millis(&mut self, key: &str) -> Result<Option<Duration>, String> {
        self.string(key)
            .map(|v| match v.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
                _ => Err(format!(
                    "option {key}={v:?} is not a number of milliseconds above zero"
                )),
            })
            .transpose()
    }

    /// `key` as `true`/`1` or `false`/`0`.
    ///
    /// # Errors
    ///
    /// A message when the value is not `true`, `false`, `1` or `0`.
    pub fn boolean(&mut self, key: &str) -> Result<Option<bool>, String> {
        self.string(key)
            .map(|v| match v.as_str() {
                "true" | "1" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(format!("option {key}={v:?} is not true or false")),
            })
            .transpose()
    }

    /// `key` as a whole number.
    ///
    /// # Errors
    ///
    /// A message when the value is not a whole number that fits `T`.
    pub fn number<T: FromStr>(&mut self, key: &str) -> Result<Option<T>, String> {
        self.string(key)
            .map(|v| {
                v.parse::<T>()
                    .map_err(|_| format!("option {key}={v:?} is not a whole number in range"))
            })
            .transpose()
    }

    /// Refuses the options that were not read: each is unknown.
    ///
    /// # Errors
    ///
    /// A message naming the first option that was not read.
    pub fn finish(self) -> Result<(), String> {
        match self.pairs.iter().zip(&self.read).find(|(_, read)| !**read) {
            Some(((k, _), _)) => Err(format!("unknown option {k:?}")),
            None => Ok(()),
        }
    }
}

fn parse_host(h: &str, default_port: u16) -> Result<HostPort, String> {
    if h.is_empty() {
        return Err("a host is empty".into());
    }
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or(format!("host {h:?} has an unclosed '['"))?;
        (host, after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    if host.is_empty() {
        return Err(format!("host {h:?} has no name"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("port {p:?} of host {host:?} is not a port number"))?,
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

/// Decodes `%XX` escapes (and `+` as a space, as in query strings).
fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `url` with its secrets replaced by `***`, for messages and logs: the
/// credentials of every `scheme://user:password@` in it (comma-separated
/// lists of URLs are redacted one by one), and the values of options whose
/// name says password or secret.
///
/// ```
/// use lockcore::raw::address::redact;
///
/// assert_eq!(redact("mysql://u:p@h/db"), "mysql://***@h/db");
/// assert_eq!(redact("etcd://h?user=u&password=p"), "etcd://h?user=u&password=***");
/// assert_eq!(redact("redis://h:1"), "redis://h:1");
/// ```
pub fn redact(url: &str) -> String {
    let (main, query) = match url.split_once('?') {
        Some((m, q)) => (m, Some(q)),
        None => (url, None),
    };
    let mut out = main
        .split(',')
        .map(|part| match (part.find("://"), part.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}://***@{}", &part[..s], &part[at + 1..]),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",");
    if let Some(q) = query {
        let opts: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _))
                    if ["pass", "pwd", "secret"]
                        .iter()
                        .any(|w| k.to_ascii_lowercase().contains(w)) =>
                {
                    format!("{k}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&opts.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_part() {
        let u = ServerUrl::parse(
            "redis+cluster://us%20er:p%3Aw@[::1]:7000,b:7001,c/3?prefix=x%3A&t=5",
            6379,
        )
        .unwrap();
        assert_eq!(u.scheme, "redis+cluster");
        assert_eq!(u.user.as_deref(), Some("us er"));
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("p:w"));
        assert_eq!(
            u.hosts[0],
            HostPort {
                host: "::1".into(),
                port: 7000
            }
        );
        assert_eq!(u.hosts[0].to_string(), "[::1]:7000");
        assert_eq!(u.hosts[2].port, 6379);
        assert_eq!(u.path, "3");
        assert_eq!(u.option("prefix"), Some("x:"));
        assert!(!format!("{u:?}").contains("p:w"));
    }

    #[test]
    fn user_info_is_decoded_once_and_plus_stays() {
        let u = ServerUrl::parse("redis://a+b:p+q%2Br%20s%40t%25u@h/x+y?o=1+2", 1).unwrap();
        assert_eq!(u.user.as_deref(), Some("a+b"));
        assert_eq!(u.password.as_ref().map(Secret::expose), Some("p+q+r s@t%u"));
        assert_eq!(u.path, "x+y");
        assert_eq!(u.option("o"), Some("1 2"), "options are form-encoded");
    }

    #[test]
    fn names_the_wrong_part() {
        for (url, needle) in [
            ("h:1", "missing scheme"),
            ("x://a,,b", "a host is empty"),
            ("x://:1", "has no name"),
            ("x://h:port", "port \"port\""),
            ("x://[::1:5", "unclosed"),
            ("x://u:%zz@h", "password"),
        ] {
            let e = ServerUrl::parse(url, 1).unwrap_err();
            assert!(e.contains(needle), "{url}: {e}");
        }
    }
}
