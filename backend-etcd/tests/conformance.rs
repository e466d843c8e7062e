//! The conformance suite against one etcd member and the three-member
//! cluster (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etcd_client::GetOptions;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Proxies, Target, COMPOSE_HINT};
use lockcore_etcd::{lock_range, EtcdBackend, EtcdConfig, EtcdCounters, DEFAULT_PREFIX};

/// An etcd topology under test: `url` as `LOCKTEST_ETCD*_URL` gives it.
#[derive(Debug)]
struct Etcd {
    url: String,
    /// The counters of every client made, for the wake-up count.
    counters: Mutex<Vec<Arc<EtcdCounters>>>,
}

impl Etcd {
    async fn connect_url(&self, url: &str) -> lockcore::Result<Locker> {
        let backend = EtcdBackend::connect(EtcdConfig::parse(url)?).await?;
        self.counters.lock().unwrap().push(backend.counters());
        Ok(Locker::new(backend))
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

    fn wakeups(&self) -> Option<u64> {
        let counters = self.counters.lock().unwrap();
        Some(
            counters
                .iter()
                .map(|c| c.snapshot().predecessor_events)
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
}

fn main() -> std::process::ExitCode {
    let target = |name: &'static str, var: &'static str| {
        Target::new(name, Some(var), |url| async move {
            Ok(Arc::new(Etcd {
                url,
                counters: Mutex::default(),
            }) as Arc<dyn Harness>)
        })
        .hint(COMPOSE_HINT)
    };
    run(vec![
        target("etcd", "LOCKTEST_ETCD_URL"),
        target("etcd-cluster", "LOCKTEST_ETCD_CLUSTER_URL"),
    ])
}
