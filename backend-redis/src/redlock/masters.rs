//! The masters: each one's connection and wake-ups, and the backend's handle on them.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::future::FutureExt;
use lockcore::raw::prelude::*;

use crate::config::{Node, RedisConfig, Topology, NAME};
use crate::managed::Managed;
use crate::renewals::Renewals;
use crate::scripts::Keys;
use crate::wake::Wakeups;

use super::quorum::*;

/// Refuses credentials that a master that answers refuses (they are the
/// same for every master): `Unauthorized` at connect, rather than a
/// majority that never answers.
pub(super) async fn refuse_refused_credentials(
    nodes: &[Node],
    instances: &[Instance],
    within: Duration,
) -> Result<()> {
    let answers = join_all(instances.iter().map(|i| {
        let (_, mut c) = i.conn.get();
        async move {
            tokio::time::timeout(within, redis::cmd("PING").query_async::<String>(&mut c)).await
        }
    }))
    .await;
    for (node, answer) in nodes.iter().zip(answers) {
        if let Ok(Err(e)) = answer {
            if crate::error::refused_credentials(&e) {
                return Err(crate::error::map_err(
                    e,
                    "connect",
                    &node.to_string(),
                    false,
                ));
            }
        }
    }
    Ok(())
}

/// Refuses a master listed twice, by address (`by_address`: not over TLS,
/// where one endpoint may route to several servers by host name) and,
/// among those that answer within `within`, by `run_id`; warns once of
/// each that does not answer.
pub(super) async fn refuse_one_master_twice(
    nodes: &[crate::config::Node],
    instances: &[Instance],
    within: Duration,
    by_address: bool,
) -> Result<()> {
    let twice = |a: &crate::config::Node, b: &crate::config::Node, how: String| {
        Error::invalid_config(
            NAME,
            format!(
                "RedLock: the master {a} is listed twice (as {a} and {b}: {how}); each master must count once toward the majority"
            ),
        )
    };
    let resolving = nodes.iter().map(|n| async move {
        let at = tokio::net::lookup_host((n.host.as_str(), n.port));
        match tokio::time::timeout(within, at).await {
            Ok(Ok(addrs)) => addrs.collect::<Vec<_>>(),
            _ => Vec::new(),
        }
    });
    let addrs = if by_address {
        join_all(resolving).await
    } else {
        Vec::new()
    };
    for (i, a) in addrs.iter().enumerate() {
        for (j, b) in addrs.iter().enumerate().skip(i + 1) {
            if let Some(shared) = a.iter().find(|x| b.contains(x)) {
                return Err(twice(&nodes[i], &nodes[j], format!("both reach {shared}")));
            }
        }
    }
    let ready = join_all(instances.iter().map(|i| i.conn.ready(within))).await;
    let ids = join_all(instances.iter().zip(&ready).map(|(i, ok)| async move {
        if *ok {
            i.conn.run_id(within).await
        } else {
            None
        }
    }))
    .await;
    for (i, node) in nodes.iter().enumerate() {
        if !ready[i] {
            tracing::warn!(
                backend = NAME,
                master = %node,
                "a RedLock master did not answer at connect; locks work while a majority answers, and it joins when it does"
            );
            continue;
        }
        for j in i + 1..nodes.len() {
            if ids[i].is_some() && ids[i] == ids[j] {
                return Err(twice(node, &nodes[j], "one server answers on both".into()));
            }
        }
    }
    Ok(())
}

/// Attempts made in this process: each writes a token of its own.
pub(super) static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

/// Locks by RedLock over independent Redis masters. Each attempt writes
/// `<owner token>.<attempt number>` as the key's value (followed by a space
/// and the value an election's candidate campaigns with): a token of its
/// own, never reused in the process.
#[derive(Debug)]
pub struct RedLockBackend {
    pub(super) instances: std::sync::Arc<Vec<Instance>>,
    pub(super) cfg: RedisConfig,
}

impl RedLockBackend {
    /// Sets up the instances of a `redlock://` configuration and connects to
    /// them in parallel, waiting up to the connect timeout; an instance that
    /// is down now keeps being connected in the background and joins later.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a topology that is not RedLock, TLS
    /// without the `tls` feature, or one master listed twice (two names
    /// that resolve to one address, or two that answer with one `run_id`):
    /// it would count twice toward the majority. Instances that are down are
    /// no error here; each is reported once as a warning through `tracing`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state.
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        let Topology::RedLock(nodes) = &cfg.topology else {
            return Err(Error::invalid_config(
                NAME,
                "RedLockBackend needs a redlock:// topology",
            ));
        };
        let mut instances = Vec::new();
        for node in nodes {
            let client = crate::client::client(node, &cfg)?;
            let conn = Managed::lazy(node, &cfg)?;
            instances.push(Instance {
                renewals: Renewals::new(conn.clone(), &node.to_string()),
                conn,
                wake: Wakeups::new(move || client.clone(), cfg.response_timeout),
            });
        }
        let (credentials, twice) = tokio::join!(
            refuse_refused_credentials(nodes, &instances, cfg.connect_timeout),
            refuse_one_master_twice(nodes, &instances, cfg.connect_timeout, !cfg.tls)
        );
        credentials?;
        twice?;
        Ok(RedLockBackend {
            instances: Arc::new(instances),
            cfg,
        })
    }

    pub(super) fn quorum(&self) -> usize {
        self.instances.len() / 2 + 1
    }

    /// Fewer than a majority answered within `limit`: unavailable (`to`
    /// says for what, after the majority needed).
    pub(super) fn too_few(&self, answered: usize, limit: Duration, to: &str) -> Error {
        Error::unavailable(
            NAME,
            format!(
                "RedLock: only {answered} of {} instances answered within {limit:?} (a majority of {} is needed{to})",
                self.instances.len(),
                self.quorum()
            ),
        )
    }

    /// Releases an attempt's key (token `token`) on every instance, each
    /// after the attempt's call there if that is still out (`after`).
    pub(super) fn undo(
        &self,
        keys: &Keys,
        token: &str,
        after: Straggling,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        release_all(
            self.instances.clone(),
            self.cfg.response_timeout,
            keys.lock.clone(),
            keys.channel.clone(),
            token.to_owned(),
            after,
        )
        .map(|_| ())
    }

    /// The per-instance timeout: a tenth of the ttl, at most the response
    /// timeout, at least 5 ms.
    pub(super) fn instance_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10)
            .min(self.cfg.response_timeout)
            .max(Duration::from_millis(5))
    }
}
