//! The etcd harness of the conformance suite, shared by this crate's
//! test binaries (`conformance`, `faults`).

// Shared between test binaries: each uses a part.
#![allow(dead_code)]

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::GetOptions;
use lockcore::{Error, Locker};
use lockcore_conformance::{Harness, Proxies, Target, COMPOSE_HINT};
use lockcore_etcd::{lock_range, EtcdBackend, EtcdConfig, DEFAULT_PREFIX};

/// An etcd topology under test: `url` as `LOCKTEST_ETCD*_URL` gives it.
#[derive(Debug)]
struct Etcd {
    url: String,
}

impl Etcd {
    async fn connect_url(&self, url: &str) -> lockcore::Result<Locker> {
        Ok(Locker::new(
            EtcdBackend::connect(EtcdConfig::parse(url)?).await?,
        ))
    }
}

fn admin_err(e: etcd_client::Error) -> Error {
    Error::backend_error("etcd", format!("harness admin command: {e}"))
}

#[async_trait]
impl Harness for Etcd {
    async fn connect(&self) -> lockcore::Result<Locker> {
        self.connect_url(&self.url).await
    }

    fn wakeups(&self, clients: &[&Locker]) -> Option<u64> {
        Some(
            clients
                .iter()
                .filter_map(|l| l.backend_as::<EtcdBackend>())
                .map(|b| b.counters().snapshot().predecessor_events)
                .sum(),
        )
    }

    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        Some(
            lockcore_etcd::connect(
                "etcd://127.0.0.1:1?connect_timeout_ms=1000&request_timeout_ms=2000",
            )
            .await,
        )
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn can_proxy(&self) -> bool {
        true
    }

    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        let url = match proxies.route_url(&self.url, 2379).await {
            Ok(u) => u,
            Err(e) => return Some(Err(Error::backend_error("etcd", format!("proxy: {e}")))),
        };
        Some(self.connect_url(&url).await)
    }

    /// Revokes the lease of every key of the lock, as `etcdctl lease revoke`.
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        let b = EtcdBackend::connect(EtcdConfig::parse(&self.url)?).await?;
        let mut c = b.client().clone();
        let range = lock_range(DEFAULT_PREFIX, name);
        let resp = c
            .get(range, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(admin_err)?;
        let mut any = false;
        for kv in resp.kvs() {
            c.lease_revoke(kv.lease()).await.map_err(admin_err)?;
            any = true;
        }
        Ok(any)
    }

    /// Keys of the names' locks (holders and waiters).
    async fn leftovers(&self, names: &[String]) -> Option<Vec<String>> {
        let b = match EtcdBackend::connect(EtcdConfig::parse(&self.url).ok()?).await {
            Ok(b) => b,
            Err(e) => return Some(vec![format!("could not look: {e}")]),
        };
        let mut c = b.client().clone();
        let mut left = Vec::new();
        for name in names {
            let range = lock_range(DEFAULT_PREFIX, name);
            match c.get(range, Some(GetOptions::new().with_prefix())).await {
                Ok(resp) => left.extend(resp.kvs().iter().map(|kv| {
                    format!(
                        "key {} (lease {:x})",
                        String::from_utf8_lossy(kv.key()),
                        kv.lease()
                    )
                })),
                Err(e) => left.push(format!("could not list {name}: {e}")),
            }
        }
        Some(left)
    }
}

/// A target called `name` over the etcd URL in `var`.
pub(crate) fn target(name: &str, var: &str) -> Target {
    Target::new(name, Some(var), |url| async move {
        Ok(Arc::new(Etcd { url }) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}
