//! One server's connection, replaced when it stops answering: one instance
//! at a fixed address, or the master that Redis Sentinel names, followed
//! across failovers.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lockcore::raw::retry::Backoff;
use lockcore::raw::sync::lock;
use lockcore::{Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, RedisResult};

use crate::client::client;
use crate::config::{Node, RedisConfig, SentinelSet, NAME};
use crate::error::{failing_over, map_connect_err, map_err};
use crate::link::{is_master, ping, Link};
use crate::sentinel::{Sentinels, RECHECK_EVERY};

/// Whether `e` says the connection it came from may be dead (a timeout, an
/// I/O error, a dropped connection), or reached a server that is no longer
/// the master (`READONLY`), so that it should be checked and replaced.
fn connection_suspect(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || failing_over(e)
}

/// Where connections go.
// One per connection, made once and never moved: the size is of no matter.
#[allow(clippy::large_enum_variant)]
enum Source {
    /// One address, through the client library's connection manager, which
    /// reconnects to it by itself.
    Fixed(redis::Client),
    /// The master a majority of the sentinels names. A replaced
    /// connection asks them again; nothing reconnects to an old address
    /// behind this back (a restarted old master may briefly call itself
    /// master).
    Sentinel(Sentinels),
}

/// The connection in use: its generation, the connection, the client of
/// the server it reaches (for the pub/sub connection) and its address.
struct Current {
    generation: u64,
    link: Link,
    client: redis::Client,
    addr: String,
}

/// A connection to one server that replaces itself once it stops
/// answering.
///
/// The client library's `ConnectionManager` reconnects on a dropped
/// connection, but keeps one that went silent (a half-open TCP connection,
/// after a network drop or a failover) and times out every request on it
/// forever. Here a request that times out (or a caller that gave up on one,
/// or a `READONLY` reply) gets the connection checked, with a `PING` (with
/// `ROLE` for Sentinel's master), and replaced if that fails: at the same
/// address, or at the master the sentinels name then (asked again with a
/// bounded backoff until one answers as master).
pub(crate) struct Managed {
    source: Source,
    config: ConnectionManagerConfig,
    response_timeout: Duration,
    /// The response timeout of a request (with the replica-sync guard's
    /// `WAIT` in it).
    request_timeout: Duration,
    current: Mutex<Current>,
    checking: AtomicBool,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("generation", &lock(&self.current).generation)
            .finish_non_exhaustive()
    }
}

impl Managed {
    fn config(cfg: &RedisConfig) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            .set_response_timeout(Some(cfg.request_timeout()))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500))
    }

    fn new(
        source: Source,
        cfg: &RedisConfig,
        link: Link,
        client: redis::Client,
        addr: String,
    ) -> Arc<Managed> {
        Arc::new(Managed {
            source,
            config: Managed::config(cfg),
            response_timeout: cfg.response_timeout,
            request_timeout: cfg.request_timeout(),
            current: Mutex::new(Current {
                generation: 0,
                link,
                client,
                addr,
            }),
            checking: AtomicBool::new(false),
        })
    }

    /// Connects now, failing with `Unavailable` when the instance does not
    /// answer within the connect timeout.
    pub(crate) async fn connect(node: &Node, cfg: &RedisConfig) -> Result<Arc<Managed>> {
        let client = client(node, cfg)?;
        let fut = ConnectionManager::new_with_config(client.clone(), Managed::config(cfg));
        let within = cfg.connect_timeout * 3;
        let manager = match tokio::time::timeout(within, fut).await {
            Ok(r) => r.map_err(|e| map_connect_err(e, &node.to_string()))?,
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!("connect to {node}: no answer within {within:?}"),
                ))
            }
        };
        // The handshake sends AUTH only when the URL has a password: a
        // server that wants one is found out here, not at the first lock.
        let mut probe = manager.clone();
        match tokio::time::timeout(within, redis::cmd("PING").query_async::<String>(&mut probe))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(map_connect_err(e, &node.to_string())),
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!("connect to {node}: no answer to PING within {within:?}"),
                ))
            }
        }
        Ok(Managed::new(
            Source::Fixed(client.clone()),
            cfg,
            Link::Manager(manager),
            client,
            node.to_string(),
        ))
    }

    /// Asks the sentinels of `set` for their master and connects to it,
    /// failing with `Unavailable` when no sentinel names a master that
    /// answers as one within the connect timeout.
    pub(crate) async fn connect_sentinel(
        set: &SentinelSet,
        cfg: &RedisConfig,
    ) -> Result<Arc<Managed>> {
        let sentinels = Sentinels::new(set, cfg)?;
        let (client, link, addr) = sentinels.connect_master().await?;
        let m = Managed::new(Source::Sentinel(sentinels), cfg, link, client, addr);
        spawn_detached(recheck(Arc::downgrade(&m)));
        Ok(m)
    }

    /// Connects in the background: requests wait for the connection (and
    /// fail by their own timeouts while the instance is down).
    pub(crate) fn lazy(node: &Node, cfg: &RedisConfig) -> Result<Arc<Managed>> {
        let client = client(node, cfg)?;
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), Managed::config(cfg))
            .map_err(|e| map_err(e, "connect", &node.to_string(), false))?;
        let m = Managed::new(
            Source::Fixed(client.clone()),
            cfg,
            Link::Manager(manager),
            client,
            node.to_string(),
        );
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
        let gen = lock(&self.current).generation;
        self.suspect(gen);
    }

    /// The current connection and its generation.
    pub(crate) fn get(&self) -> (u64, Link) {
        let cur = lock(&self.current);
        (cur.generation, cur.link.clone())
    }

    /// The client of the server the current connection reaches.
    pub(crate) fn client(&self) -> redis::Client {
        lock(&self.current).client.clone()
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
    /// connection in the background (a `PING`; for Sentinel's master also
    /// `ROLE`), and replace it if that fails too.
    pub(crate) fn suspect(self: &Arc<Self>, gen: u64) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        let done = Checking(me.clone());
        spawn_detached(async move {
            let _done = done;
            let healthy = match me.upgrade() {
                Some(m) => m.healthy(gen).await,
                None => return,
            };
            if !healthy {
                replace(&me, gen).await;
            }
        });
    }

    /// Whether generation `gen` is gone already or still answers (as the
    /// master, for Sentinel), on the connection itself: a half-open one is
    /// found out so. It may be queued behind the replica-sync guard's
    /// `WAIT`s, so it has the request timeout (with the `WAIT`'s).
    async fn healthy(&self, gen: u64) -> bool {
        let (now, mut c) = self.get();
        if now != gen {
            return true;
        }
        match self.source {
            Source::Fixed(_) => ping(&mut c, self.request_timeout).await,
            Source::Sentinel(_) => is_master(&mut c, self.request_timeout).await,
        }
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

/// Replaces generation `gen` (unless it is gone already): with a new
/// connection to the same address, or to the master the sentinels name,
/// asked again with a bounded backoff until one answers as master.
async fn replace(me: &Weak<Managed>, gen: u64) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        let Some(m) = me.upgrade() else { return };
        if lock(&m.current).generation != gen {
            return;
        }
        let next = match &m.source {
            Source::Fixed(client) => {
                ConnectionManager::new_lazy_with_config(client.clone(), m.config.clone())
                    .map(|c| {
                        (
                            client.clone(),
                            Link::Manager(c),
                            lock(&m.current).addr.clone(),
                        )
                    })
                    .map_err(|e| map_err(e, "connect", &lock(&m.current).addr, false))
            }
            Source::Sentinel(sentinels) => sentinels.connect_master().await,
        };
        match next {
            Ok((client, link, addr)) => {
                {
                    let mut cur = lock(&m.current);
                    if cur.generation != gen {
                        return;
                    }
                    *cur = Current {
                        generation: gen + 1,
                        link,
                        client,
                        addr,
                    };
                }
                tracing::debug!(
                    generation = gen + 1,
                    "replaced a Redis connection that stopped answering"
                );
                if matches!(m.source, Source::Fixed(_)) {
                    m.warm_up();
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not set up a new Redis connection; trying again");
                if matches!(m.source, Source::Fixed(_)) {
                    return;
                }
            }
        }
        drop(m);
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Every [`RECHECK_EVERY`], while the connection lives: when a majority of
/// the sentinels names another master than the server the connection
/// reaches (a failover this client did not see fail: the old master cut
/// off from the sentinels but not from this client, or demoted without
/// closing connections), the connection is replaced.
async fn recheck(me: Weak<Managed>) {
    let mut every = tokio::time::interval(RECHECK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(m) = me.upgrade() else { return };
        let Source::Sentinel(sentinels) = &m.source else {
            return;
        };
        let Ok(named) = sentinels.master().await else {
            continue;
        };
        let (gen, addr) = {
            let cur = lock(&m.current);
            (cur.generation, cur.addr.clone())
        };
        if named.to_string() != addr && !m.checking.swap(true, Ordering::AcqRel) {
            drop(m);
            tracing::debug!(from = %addr, to = %named, "the sentinels name another master; moving");
            let _done = Checking(me.clone());
            replace(&me, gen).await;
        }
    }
}

/// Clears a [`Managed`]'s `checking` flag when dropped, however the check
/// ends (done, or its task dropped).
struct Checking(Weak<Managed>);

impl Drop for Checking {
    fn drop(&mut self) {
        if let Some(m) = self.0.upgrade() {
            m.checking.store(false, Ordering::Release);
        }
    }
}

/// Runs `fut` in the background on the current runtime, if there is one.
fn spawn_detached(fut: impl Future<Output = ()> + Send + 'static) {
    if let Ok(h) = tokio::runtime::Handle::try_current() {
        h.spawn(fut);
    }
}
