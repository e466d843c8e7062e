//! The conformance suite against one etcd member and the three-member
//! cluster (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::GetOptions;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Target};
use lockcore_etcd::{lock_range, EtcdBackend, EtcdConfig, DEFAULT_PREFIX};

/// An etcd topology under test: `url` as `LOCKTEST_ETCD*` gives it.
#[derive(Debug)]
struct Etcd {
    url: String,
}

fn admin_err(e: etcd_client::Error) -> Error {
    Error::backend_error("etcd", format!("harness admin command: {e}"))
}

#[async_trait]
impl Harness for Etcd {
    async fn connect(&self) -> lockcore::Result<Locker> {
        lockcore_etcd::connect(&self.url).await
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
            Ok(Arc::new(Etcd { url }) as Arc<dyn Harness>)
        })
    };
    run(vec![
        target("etcd", "LOCKTEST_ETCD"),
        target("etcd-cluster", "LOCKTEST_ETCD_CLUSTER"),
    ])
}
