//! The conformance suite against one Redis instance, the three-master
//! cluster and RedLock over five masters (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Proxies, Target, COMPOSE_HINT};

/// A Redis topology under test: `url` for the backend, `raw` for the
/// harness's own admin connections (one per instance).
#[derive(Debug)]
struct Redis {
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
}

/// The admin URL of each server a lock URL names: `redlock://a:1,b:2` →
/// [`redis://a:1`, `redis://b:2`] (`rediss://` for TLS).
fn servers(url: &str) -> Vec<String> {
    lockcore::address::ServerUrl::parse(url, 6379)
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

fn main() -> std::process::ExitCode {
    let target = |name: &str, cluster: bool, unreachable: &'static str| {
        Target::new(
            name,
            Some(&format!(
                "LOCKTEST_{}_URL",
                name.to_uppercase().replace('-', "_")
            )),
            move |url| async move {
                Ok(Arc::new(Redis {
                    raw: servers(&url),
                    url,
                    cluster,
                    unreachable,
                }) as Arc<dyn Harness>)
            },
        )
        .hint(COMPOSE_HINT)
    };
    #[allow(unused_mut)]
    let mut targets = vec![
        target("redis", false, "redis://127.0.0.1:1"),
        target("redis-cluster", true, "redis+cluster://127.0.0.1:1"),
        target(
            "redlock",
            false,
            "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        ),
    ];
    #[cfg(feature = "tls")]
    targets.push(target("redis-tls", false, "rediss://127.0.0.1:1"));
    run(targets)
}
