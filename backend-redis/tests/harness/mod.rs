//! The redis harness of the conformance suite, shared by this crate's
//! test binaries (`conformance`, `faults`).

// Shared between test binaries: each uses a part.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{Harness, Proxies, Target, COMPOSE_HINT};

/// A Redis topology under test: `url` for the backend, `raw` for the
/// harness's own admin connections (one per instance).
#[derive(Debug)]
pub(crate) struct Redis {
    url: String,
    raw: Vec<String>,
    cluster: bool,
    /// Reached through Sentinel: the master's address comes from the
    /// sentinels, so a proxy in front of them would not carry the traffic.
    sentinel: bool,
    unreachable: &'static str,
}

impl Redis {
    /// Revocation needs plain admin connections (not over TLS).
    fn admin_plain(&self) -> bool {
        self.raw.iter().all(|u| u.starts_with("redis://"))
    }
}

fn admin_err(e: redis::RedisError) -> Error {
    Error::backend_error("redis", format!("harness admin command: {e}"))
}

#[async_trait]
impl Harness for Redis {
    async fn connect(&self) -> lockcore::Result<Locker> {
        lockcore_redis::connect(&self.url).await
    }

    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        Some(lockcore_redis::connect(self.unreachable).await)
    }

    fn can_revoke(&self) -> bool {
        self.admin_plain()
    }

    /// A cluster's redirects and Sentinel's answers name the servers' own
    /// addresses: no proxy.
    fn can_proxy(&self) -> bool {
        !self.cluster && !self.sentinel
    }

    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        if !self.can_proxy() {
            return None;
        }
        let url = match proxies.route_url(&self.url, 6379).await {
            Ok(u) => u,
            Err(e) => return Some(Err(Error::backend_error("redis", format!("proxy: {e}")))),
        };
        Some(lockcore_redis::connect(&url).await)
    }

    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        let key = lockcore_redis::lock_key("lock:", name);
        let mut deleted = 0i64;
        if self.cluster {
            let client = redis::cluster::ClusterClient::new(self.raw.clone()).map_err(admin_err)?;
            let mut c = client.get_async_connection().await.map_err(admin_err)?;
            deleted += redis::cmd("DEL")
                .arg(&key)
                .query_async::<i64>(&mut c)
                .await
                .map_err(admin_err)?;
        } else {
            for url in &self.raw {
                let client = redis::Client::open(url.as_str()).map_err(admin_err)?;
                let mut c = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(admin_err)?;
                deleted += redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<i64>(&mut c)
                    .await
                    .map_err(admin_err)?;
            }
        }
        Ok(deleted > 0)
    }

    async fn leftovers(&self, names: &[String]) -> Option<Vec<String>> {
        if self.cluster || !self.admin_plain() {
            return None;
        }
        Some(
            self.left_for(names)
                .await
                .unwrap_or_else(|e| vec![format!("could not look: {e}")]),
        )
    }
}

/// The admin URL of each server a lock URL names: `redlock://a:1,b:2` →
/// [`redis://a:1`, `redis://b:2`] (`rediss://` for TLS).
pub(crate) fn servers(url: &str) -> Vec<String> {
    lockcore::raw::address::ServerUrl::parse(url, 6379)
        .map(|u| {
            let scheme = if u.scheme.starts_with("rediss") {
                "rediss"
            } else {
                "redis"
            };
            u.hosts.iter().map(|h| format!("{scheme}://{h}")).collect()
        })
        .unwrap_or_default()
}

impl Redis {
    /// What the soak leaves behind for `names`: lock keys, counters kept for
    /// ever, subscriptions on the release channels.
    async fn left_for(&self, names: &[String]) -> Result<Vec<String>, redis::RedisError> {
        let mut left = Vec::new();
        for url in &self.raw {
            let client = redis::Client::open(url.as_str())?;
            let mut c = client.get_multiplexed_async_connection().await?;
            for name in names {
                let key = lockcore_redis::lock_key("lock:", name);
                if redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async::<i64>(&mut c)
                    .await?
                    > 0
                {
                    left.push(format!("lock key {key} on {url}"));
                }
                let fence = format!("{key}:fence");
                if redis::cmd("PTTL")
                    .arg(&fence)
                    .query_async::<i64>(&mut c)
                    .await?
                    == -1
                {
                    left.push(format!("fencing counter {fence} kept for ever on {url}"));
                }
                let channel = format!("{key}:released");
                let (_, subs): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(&mut c)
                    .await?;
                if subs > 0 {
                    left.push(format!("{subs} subscriptions on {channel} on {url}"));
                }
            }
        }
        Ok(left)
    }
}

/// A target called `name` over the URL in `var`: a cluster when `cluster`,
/// and `unreachable` for the server-absent case.
pub(crate) fn target(name: &str, var: &str, cluster: bool, unreachable: &'static str) -> Target {
    Target::new(name, Some(var), move |url| async move {
        Ok(Arc::new(Redis {
            raw: servers(&url),
            url,
            cluster,
            sentinel: false,
            unreachable,
        }) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}

/// The `redis://host:port` of the master that a majority of the sentinels
/// of a `redis+sentinel://` URL names and deems up now (as the library
/// counts it: during a failover there may be none for a moment).
pub(crate) async fn sentinel_master(url: &str) -> lockcore::Result<String> {
    let u = lockcore::raw::address::ServerUrl::parse(url, 26379)
        .map_err(|e| Error::backend_error("redis", e))?;
    let mut votes: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut said = Vec::new();
    for s in &u.hosts {
        let asked = async {
            let client = redis::Client::open(format!("redis://{s}"))?;
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&u.path)
                .query_async::<std::collections::HashMap<String, String>>(&mut c)
                .await
        };
        match asked.await {
            Ok(info) => {
                let flags = info.get("flags").cloned().unwrap_or_default();
                let up = flags.split(',').any(|f| f == "master")
                    && !flags.split(',').any(|f| f == "s_down" || f == "o_down");
                match (info.get("ip"), info.get("port"), up) {
                    (Some(ip), Some(port), true) => {
                        *votes.entry(format!("redis://{ip}:{port}")).or_default() += 1;
                    }
                    _ => said.push(format!("sentinel {s}: flags {flags}")),
                }
            }
            Err(e) => said.push(format!("sentinel {s}: {e}")),
        }
    }
    let majority = u.hosts.len() / 2 + 1;
    votes
        .into_iter()
        .find(|(_, n)| *n >= majority)
        .map(|(addr, _)| addr)
        .ok_or_else(|| {
            Error::unavailable(
                "redis",
                format!("no majority names a master: {}", said.join("; ")),
            )
        })
}

/// A target called `name` over the `redis+sentinel://` URL in `var`; the
/// harness's admin connection goes to the master the sentinels name when
/// the target starts.
pub(crate) fn sentinel_target(name: &str, var: &str, unreachable: &'static str) -> Target {
    Target::new(name, Some(var), move |url| async move {
        Ok(Arc::new(Redis {
            raw: vec![sentinel_master(&url).await?],
            url,
            cluster: false,
            sentinel: true,
            unreachable,
        }) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}

/// A connection of the test's own to the server at `url`.
pub(crate) async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

/// The value of `key` on the server at `host` (`host:port`).
pub(crate) async fn raw_get(host: &str, key: &str) -> Option<String> {
    let mut c = admin(&format!("redis://{host}")).await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut c)
        .await
        .expect("GET")
}

/// How many clients the server at `url` counts as subscribed to `channel`.
pub(crate) async fn numsub(url: &str, channel: &str) -> i64 {
    let mut c = admin(url).await;
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut c)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// Waits until `f` holds, or fails after `within`.
pub(crate) async fn until<F, Fut>(what: &str, within: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !f().await {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The calls of scripts the server has run so far.
pub(crate) async fn script_calls(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|v| v.split(',').next()?.parse::<u64>().ok())
        .sum()
}
