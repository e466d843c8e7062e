//! The conformance suite against one ZooKeeper server and the three-server
//! ensemble (servers from compose/).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Proxies, Target, COMPOSE_HINT};
use lockcore_zk::{ZkBackend, ZkConfig, ZkCounters};
use zookeeper_client as zk;

/// Where the suite's lock paths live (a chroot, exercised on purpose).
const CHROOT: &str = "/lockcore-conformance";

#[derive(Debug)]
struct Zk {
    hosts: String,
    /// The counters of every client made, for the wake-up count.
    counters: Mutex<Vec<Arc<ZkCounters>>>,
}

impl Zk {
    fn harness(hosts: String) -> Arc<dyn Harness> {
        Arc::new(Zk {
            hosts,
            counters: Mutex::default(),
        })
    }

    fn url(&self) -> String {
        format!("zk://{}{CHROOT}", self.hosts)
    }

    async fn connect_url(&self, url: &str) -> lockcore::Result<Locker> {
        let backend = ZkBackend::connect(ZkConfig::parse(url)?).await?;
        self.counters.lock().unwrap().push(backend.counters());
        Ok(Locker::new(backend))
    }
}

/// The `host:port` list of a `zk://` URL.
fn hosts_of(url: &str) -> String {
    lockcore::address::ServerUrl::parse(url, 2181)
        .map(|u| {
            u.hosts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn admin_err(e: zk::Error) -> Error {
    Error::backend_error("zookeeper", format!("harness admin request: {e}"))
}

#[async_trait]
impl Harness for Zk {
    async fn connect(&self) -> lockcore::Result<Locker> {
        self.connect_url(&self.url()).await
    }

    fn can_proxy(&self) -> bool {
        true
    }

    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        let url = match proxies.route_url(&self.url(), 2181).await {
            Ok(u) => u,
            Err(e) => {
                return Some(Err(Error::backend_error(
                    "zookeeper",
                    format!("proxy: {e}"),
                )))
            }
        };
        Some(self.connect_url(&url).await)
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
        Target::new("zk", Some("LOCKTEST_ZK_URL"), |url| async move {
            Ok(Zk::harness(hosts_of(&url)))
        })
        .hint(COMPOSE_HINT),
        Target::new(
            "zk-ensemble",
            Some("LOCKTEST_ZK_ENSEMBLE_URL"),
            |url| async move { Ok(Zk::harness(hosts_of(&url))) },
        )
        .hint(COMPOSE_HINT),
    ])
}
