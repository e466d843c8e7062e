//! The zk harness of the conformance suite, shared by this crate's
//! test binaries (`conformance`, `faults`).

// Shared between test binaries: each uses a part.
#![allow(dead_code)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{Harness, Proxies, Target, COMPOSE_HINT};
use lockcore_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

/// Where the suite's lock paths live (a chroot, exercised on purpose).
const CHROOT: &str = "/lockcore-conformance";

#[derive(Debug)]
struct Zk {
    hosts: String,
}

impl Zk {
    fn harness(hosts: String) -> Arc<dyn Harness> {
        Arc::new(Zk { hosts })
    }

    fn url(&self) -> String {
        format!("zk://{}{CHROOT}", self.hosts)
    }

    async fn connect_url(&self, url: &str) -> lockcore::Result<Locker> {
        Ok(Locker::new(
            ZkBackend::connect(ZkConfig::parse(url)?).await?,
        ))
    }
}

/// The `host:port` list of a `zk://` URL.
fn hosts_of(url: &str) -> String {
    lockcore::raw::address::ServerUrl::parse(url, 2181)
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

    fn wakeups(&self, clients: &[&Locker]) -> Option<u64> {
        Some(
            clients
                .iter()
                .filter_map(|l| l.backend_as::<ZkBackend>())
                .map(|b| b.counters().snapshot().predecessor_events)
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
        // Ours are `_c_<uuid>-<kind><10-digit sequence>`.
        children.retain(|c| c.starts_with("_c_"));
        children.sort_by_key(|c| c.get(c.len().saturating_sub(10)..).map(str::to_owned));
        let Some(first) = children.first() else {
            return Ok(false);
        };
        client
            .delete(&format!("{parent}/{first}"), None)
            .await
            .map_err(admin_err)?;
        Ok(true)
    }

    /// Lock nodes, and the names' parent nodes (containers, which the
    /// server removes once empty: compose/ checks every second).
    async fn leftovers(&self, names: &[String]) -> Option<Vec<String>> {
        let cfg = ZkConfig::parse(&self.url()).ok()?;
        let client = match zk::Client::connect(&self.hosts).await {
            Ok(c) => c,
            Err(e) => return Some(vec![format!("could not look: {e}")]),
        };
        let mut left = Vec::new();
        for name in names {
            let parent = lockcore_zk::lock_parent(&cfg, name);
            match client.list_children(&parent).await {
                Ok(children) if children.is_empty() => {
                    left.push(format!("the empty parent node {parent}"));
                }
                Ok(children) => left.push(format!("{parent}: {children:?}")),
                Err(zk::Error::NoNode) => {}
                Err(e) => left.push(format!("could not list {parent}: {e}")),
            }
        }
        Some(left)
    }
}

/// A target called `name` over the ZooKeeper URL in `var`.
pub(crate) fn target(name: &str, var: &str) -> Target {
    Target::new(name, Some(var), |url| async move {
        Ok(Zk::harness(hosts_of(&url)))
    })
    .hint(COMPOSE_HINT)
}
