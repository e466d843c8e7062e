//! One instance through the connection manager, replaced when it stops
//! answering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::raw::sync::lock;
use lockcore::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, RedisResult};

use crate::client::client;
use crate::config::{Node, RedisConfig, NAME};
use crate::error::{map_connect_err, map_err};

/// Whether `e` says the connection it came from may be dead (a timeout, an
/// I/O error, a dropped connection), so that it should be replaced.
fn connection_suspect(e: &RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// A connection to one instance that replaces itself once it stops
/// answering.
///
/// The client library's `ConnectionManager` reconnects on a dropped
/// connection, but keeps one that went silent (a half-open TCP connection,
/// after a network drop or a failover) and times out every request on it
/// forever. Here a request that times out (or a caller that gave up on one)
/// gets the connection checked with a `PING`, and replaced if that fails too.
pub(crate) struct Managed {
    client: redis::Client,
    config: ConnectionManagerConfig,
    response_timeout: Duration,
    current: Mutex<(u64, ConnectionManager)>,
    checking: AtomicBool,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("generation", &lock(&self.current).0)
            .finish_non_exhaustive()
    }
}

impl Managed {
    fn config(cfg: &RedisConfig) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            .set_response_timeout(Some(cfg.response_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500))
    }

    /// Connects now, failing with `Unavailable` when the instance does not
    /// answer within the connect timeout.
    pub(crate) async fn connect(node: &Node, cfg: &RedisConfig) -> Result<Arc<Managed>> {
        let client = client(node, cfg)?;
        let config = Managed::config(cfg);
        let fut = ConnectionManager::new_with_config(client.clone(), config.clone());
        let manager = match tokio::time::timeout(cfg.connect_timeout * 3, fut).await {
            Ok(r) => r.map_err(|e| map_connect_err(e, &node.to_string()))?,
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "connect to {node}: no answer within {:?}",
                        cfg.connect_timeout * 3
                    ),
                ))
            }
        };
        // The handshake sends AUTH only when the URL has a password: a
        // server that wants one is found out here, not at the first lock.
        let mut probe = manager.clone();
        match tokio::time::timeout(
            cfg.connect_timeout * 3,
            redis::cmd("PING").query_async::<String>(&mut probe),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(map_connect_err(e, &node.to_string())),
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "connect to {node}: no answer to PING within {:?}",
                        cfg.connect_timeout * 3
                    ),
                ))
            }
        }
        Ok(Arc::new(Managed {
            client,
            config,
            response_timeout: cfg.response_timeout,
            current: Mutex::new((0, manager)),
            checking: AtomicBool::new(false),
        }))
    }

    /// Connects in the background: requests wait for the connection (and
    /// fail by their own timeouts while the instance is down).
    pub(crate) fn lazy(node: &Node, cfg: &RedisConfig) -> Result<Arc<Managed>> {
        let client = client(node, cfg)?;
        let config = Managed::config(cfg);
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| map_err(e, "connect", &node.to_string(), false))?;
        let m = Arc::new(Managed {
            client,
            config,
            response_timeout: cfg.response_timeout,
            current: Mutex::new((0, manager)),
            checking: AtomicBool::new(false),
        });
        m.warm_up();
        Ok(m)
    }

    /// Waits until the connection answers a `PING`, up to `within`.
    pub(crate) async fn ready(&self, within: Duration) -> bool {
        let (_, mut c) = self.get();
        ping(&mut c, within).await
    }

    /// The server's `run_id` (from `INFO server`), which tells one server
    /// under two names; `None` when it does not answer within `within`.
    pub(crate) async fn run_id(&self, within: Duration) -> Option<String> {
        let (_, mut c) = self.get();
        let info: String =
            tokio::time::timeout(within, redis::cmd("INFO").arg("server").query_async(&mut c))
                .await
                .ok()?
                .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned())
    }

    /// [`suspect`](Managed::suspect) the current connection.
    pub(crate) fn suspect_current(self: &Arc<Self>) {
        let gen = lock(&self.current).0;
        self.suspect(gen);
    }

    /// The current connection and its generation.
    pub(crate) fn get(&self) -> (u64, ConnectionManager) {
        let cur = lock(&self.current);
        (cur.0, cur.1.clone())
    }

    /// Notes the outcome of a request made on generation `gen`.
    pub(crate) fn after<T>(self: &Arc<Self>, gen: u64, r: &RedisResult<T>) {
        if let Err(e) = r {
            if connection_suspect(e) {
                self.suspect(gen);
            }
        }
    }

    /// A request on generation `gen` failed or was given up on: check the
    /// connection with a `PING` in the background, and replace it if that
    /// does not answer either.
    pub(crate) fn suspect(self: &Arc<Self>, gen: u64) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        spawn_detached(async move {
            let (now, mut c) = me.get();
            if now == gen && !ping(&mut c, me.response_timeout).await {
                me.replace(gen);
            }
            me.checking.store(false, Ordering::Release);
        });
    }

    fn replace(self: &Arc<Self>, gen: u64) {
        {
            let mut cur = lock(&self.current);
            if cur.0 != gen {
                return;
            }
            match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
            {
                Ok(m) => *cur = (gen + 1, m),
                Err(e) => {
                    tracing::debug!(error = %e, "could not set up a new Redis connection");
                    return;
                }
            }
        }
        tracing::debug!(
            generation = gen + 1,
            "replaced a Redis connection that stopped answering"
        );
        self.warm_up();
    }

    /// Starts connecting now rather than on the next request.
    fn warm_up(self: &Arc<Self>) {
        let (_, mut c) = self.get();
        let limit = self.response_timeout * 4;
        spawn_detached(async move {
            let _ = ping(&mut c, limit).await;
        });
    }
}

/// Whether `c` answers a `PING` within `within`.
async fn ping(c: &mut ConnectionManager, within: Duration) -> bool {
    let cmd = redis::cmd("PING");
    matches!(
        tokio::time::timeout(within, cmd.query_async::<String>(c)).await,
        Ok(Ok(_))
    )
}

/// Runs `fut` in the background on the current runtime, if there is one.
fn spawn_detached(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        h.spawn(fut);
    }
}
