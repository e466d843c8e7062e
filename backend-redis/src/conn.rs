//! Connections: one instance through the connection manager (replaced when
//! it stops answering), or a cluster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockcore::raw::sync::lock;
use lockcore::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisError, RedisResult, Script};

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

/// A connection to one instance or to a cluster; cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<Managed>),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Conn {
    /// Runs `script` (EVALSHA, loading it on NOSCRIPT).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> RedisResult<T> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(*a);
        }
        match self {
            Conn::Single(m) => {
                let (gen, mut c) = m.get();
                let r = inv.invoke_async(&mut c).await;
                m.after(gen, &r);
                r
            }
            Conn::Cluster(c) => inv.invoke_async(&mut c.clone()).await,
        }
    }

    /// Runs a command.
    pub(crate) async fn cmd<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(m) => {
                let (gen, mut c) = m.get();
                let r = cmd.query_async(&mut c).await;
                m.after(gen, &r);
                r
            }
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
}

impl Conn {
    /// The keys matching `pattern` that `keep` accepts, at most `limit`:
    /// `SCAN` on one instance, on every master of a cluster.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        limit: usize,
        keep: impl Fn(&str) -> bool,
    ) -> RedisResult<Vec<String>> {
        let mut found = Vec::new();
        match self {
            Conn::Single(m) => {
                let (gen, mut c) = m.get();
                let r = scan_one(
                    &mut Scanned::Single(&mut c),
                    pattern,
                    limit,
                    &keep,
                    &mut found,
                )
                .await;
                m.after(gen, &r);
                r?;
            }
            Conn::Cluster(c) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let mut c = c.clone();
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut c)
                    .await?;
                for (host, port) in masters(&nodes) {
                    let route =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let mut node = Scanned::Node(&mut c, route);
                    scan_one(&mut node, pattern, limit, &keep, &mut found).await?;
                    if found.len() >= limit {
                        break;
                    }
                }
            }
        }
        Ok(found)
    }
}

/// The masters (host, port) of a cluster that `CLUSTER NODES` lists as
/// connected.
fn masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let flags = f.get(2)?;
            if !flags.split(',').any(|x| x == "master") || flags.contains("fail") {
                return None;
            }
            let addr = f.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
        })
        .collect()
}

/// `SCAN` of one server (through `route` on a cluster) until its end or
/// until `found` has `limit` keys.
async fn scan_one(
    c: &mut Scanned<'_>,
    pattern: &str,
    limit: usize,
    keep: &impl Fn(&str) -> bool,
    found: &mut Vec<String>,
) -> RedisResult<()> {
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        // Keys as bytes: another program's key need not be UTF-8 (and is
        // not a lock key of this library then).
        let (next, keys): (u64, Vec<Vec<u8>>) = match c {
            Scanned::Single(c) => cmd.query_async(*c).await?,
            Scanned::Node(c, route) => {
                redis::from_redis_value(c.route_command(cmd, route.clone()).await?)?
            }
        };
        found.extend(
            keys.into_iter()
                .filter_map(|k| String::from_utf8(k).ok())
                .filter(|k| keep(k)),
        );
        if next == 0 || found.len() >= limit {
            found.truncate(limit);
            return Ok(());
        }
        cursor = next;
    }
}

/// The server one `SCAN` runs on.
enum Scanned<'a> {
    Single(&'a mut ConnectionManager),
    Node(
        &'a mut ClusterConnection,
        redis::cluster_routing::RoutingInfo,
    ),
}

/// The root certificate of `cfg.ca_file`, read for TLS.
#[cfg(feature = "tls")]
fn tls_certs(cfg: &RedisConfig) -> Result<Option<redis::TlsCertificates>> {
    let Some(path) = &cfg.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| {
        Error::invalid_config(NAME, format!("ca_file {path:?} cannot be read: {e}")).with_source(e)
    })?;
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

/// A client for one node, over TLS when the settings ask for it.
pub(crate) fn client(node: &Node, cfg: &RedisConfig) -> Result<redis::Client> {
    let url = node.client_url(cfg.tls);
    let invalid = |e: redis::RedisError| {
        Error::invalid_config(NAME, format!("Redis address {node}: {e}")).with_source(e)
    };
    if !cfg.tls {
        return redis::Client::open(url).map_err(invalid);
    }
    #[cfg(feature = "tls")]
    {
        match tls_certs(cfg)? {
            Some(certs) => redis::Client::build_with_tls(url, certs).map_err(invalid),
            None => redis::Client::open(url).map_err(invalid),
        }
    }
    #[cfg(not(feature = "tls"))]
    {
        Err(Error::invalid_config(
            NAME,
            "TLS (rediss://) needs the `tls` feature of lockcore-redis (in distlock: the `full` feature)",
        ))
    }
}

/// Connects to a cluster by its seed nodes.
pub(crate) async fn connect_cluster(
    nodes: &[Node],
    cfg: &RedisConfig,
) -> Result<ClusterConnection> {
    let seeds: Vec<String> = nodes.iter().map(|n| n.client_url(cfg.tls)).collect();
    let shown = nodes
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let builder = redis::cluster::ClusterClient::builder(seeds)
        .connection_timeout(cfg.connect_timeout)
        .response_timeout(cfg.response_timeout)
        .retries(2);
    #[cfg(feature = "tls")]
    let builder = match tls_certs(cfg)? {
        Some(certs) if cfg.tls => builder.certs(certs),
        _ => builder,
    };
    #[cfg(not(feature = "tls"))]
    if cfg.tls {
        return Err(Error::invalid_config(
            NAME,
            "TLS (rediss+cluster://) needs the `tls` feature of lockcore-redis (in distlock: the `full` feature)",
        ));
    }
    let client = builder.build().map_err(|e| {
        Error::invalid_config(NAME, format!("Redis Cluster seeds {shown}: {e}")).with_source(e)
    })?;
    match tokio::time::timeout(cfg.connect_timeout * 3, client.get_async_connection()).await {
        Ok(r) => r.map_err(|e| map_connect_err(e, &shown)),
        Err(_) => Err(Error::unavailable(
            NAME,
            format!("connect to cluster {shown}: no answer"),
        )),
    }
}
