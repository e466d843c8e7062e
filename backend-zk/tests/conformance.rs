//! The conformance suite against one ZooKeeper server and the three-server
//! ensemble (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Target};
use lockcore_zk::ZkConfig;
use zookeeper_client as zk;

/// Where the suite's lock paths live (a chroot, exercised on purpose).
const CHROOT: &str = "/lockcore-conformance";

#[derive(Debug)]
struct Zk {
    hosts: String,
}

impl Zk {
    fn url(&self) -> String {
        format!("zk://{}{CHROOT}", self.hosts)
    }
}

fn admin_err(e: zk::Error) -> Error {
    Error::backend_error("zookeeper", format!("harness admin request: {e}"))
}

#[async_trait]
impl Harness for Zk {
    async fn connect(&self) -> lockcore::Result<Locker> {
        lockcore_zk::connect(&self.url()).await
    }

    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        Some(lockcore_zk::connect("zk://127.0.0.1:1/x?connect_timeout_ms=3000").await)
    }

    fn can_revoke(&self) -> bool {
        true
    }

    /// Deletes the holder's node, as an operator would with `delete`.
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        let cfg = ZkConfig::parse(&self.url())?;
        let parent = lockcore_zk::lock_parent(&cfg, name);
        let client = zk::Client::connect(&self.hosts).await.map_err(admin_err)?;
        let mut children = match client.list_children(&parent).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(admin_err(e)),
        };
        children.retain(|c| c.contains("-lock-"));
        children.sort_by_key(|c| c.rsplit('-').next().unwrap_or_default().to_owned());
        let Some(first) = children.first() else {
            return Ok(false);
        };
        client
            .delete(&format!("{parent}/{first}"), None)
            .await
            .map_err(admin_err)?;
        Ok(true)
    }
}

fn main() -> std::process::ExitCode {
    run(vec![
        Target::new("zk", Some("LOCKTEST_ZK"), |hosts| async move {
            Ok(Arc::new(Zk { hosts }) as Arc<dyn Harness>)
        }),
        Target::new(
            "zk-ensemble",
            Some("LOCKTEST_ZK_ENSEMBLE"),
            |hosts| async move { Ok(Arc::new(Zk { hosts }) as Arc<dyn Harness>) },
        ),
    ])
}
