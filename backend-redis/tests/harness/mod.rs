//! The redis harness of the conformance suite, shared by this crate's
//! test binaries (`conformance`, `faults`).

// Shared between test binaries: each uses a part.
#![allow(dead_code)]

use std::sync::Arc;

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

    /// A cluster's redirects name the servers' own addresses: no proxy.
    fn can_proxy(&self) -> bool {
        !self.cluster
    }

    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        if self.cluster {
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
fn servers(url: &str) -> Vec<String> {
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
            unreachable,
        }) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}
