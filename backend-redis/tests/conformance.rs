//! The conformance suite against one Redis instance, the three-master
//! cluster and RedLock over five masters (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Proxies, Target};

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

/// `redis://a:1,redis://b:2` → (`a:1,b:2`, [`redis://a:1`, `redis://b:2`]).
fn hosts(list: &str) -> (String, Vec<String>) {
    let urls: Vec<String> = list.split(',').map(|s| s.trim().to_owned()).collect();
    let hosts = urls
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join(",");
    (hosts, urls)
}

fn main() -> std::process::ExitCode {
    #[allow(unused_mut)]
    let mut targets = vec![
        Target::new("redis", Some("LOCKTEST_REDIS_URL"), |url| async move {
            Ok(Arc::new(Redis {
                raw: vec![url.clone()],
                url,
                cluster: false,
                unreachable: "redis://127.0.0.1:1",
            }) as Arc<dyn Harness>)
        }),
        Target::new(
            "redis-cluster",
            Some("LOCKTEST_REDIS_CLUSTER_URLS"),
            |list| async move {
                let (hosts, raw) = hosts(&list);
                Ok(Arc::new(Redis {
                    url: format!("redis+cluster://{hosts}"),
                    raw,
                    cluster: true,
                    unreachable: "redis+cluster://127.0.0.1:1",
                }) as Arc<dyn Harness>)
            },
        ),
        Target::new(
            "redlock",
            Some("LOCKTEST_REDLOCK_URLS"),
            |list| async move {
                let (hosts, raw) = hosts(&list);
                Ok(Arc::new(Redis {
                    url: format!("redlock://{hosts}"),
                    raw,
                    cluster: false,
                    unreachable: "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
                }) as Arc<dyn Harness>)
            },
        ),
    ];
    #[cfg(feature = "tls")]
    targets.push(Target::new(
        "redis-tls",
        Some("LOCKTEST_REDIS_TLS_URL"),
        |url| async move {
            Ok(Arc::new(Redis {
                raw: vec![url.clone()],
                url,
                cluster: false,
                unreachable: "rediss://127.0.0.1:1",
            }) as Arc<dyn Harness>)
        },
    ));
    run(targets)
}
