//! The sentinels of a Redis master: which master a majority of them names.
//!
//! The `redis` crate's Sentinel client takes the first sentinel (in the
//! URL's order) whose named master answers `ROLE` as a master. One stale
//! sentinel (restarted with an old configuration, or cut off from the
//! others) can then send every client to an old master that calls itself
//! master for a while, and two masters grant one name. Here every sentinel
//! is asked at once, and a master counts only when a majority of the
//! configured sentinels names it, up (neither subjectively nor objectively
//! down), as the quorum that elected it did.

use std::collections::HashMap;
use std::time::Duration;

use lockcore::{Error, Result};
use redis::aio::MultiplexedConnection;

use crate::client::client;
use crate::config::{Node, RedisConfig, SentinelSet, NAME};
use crate::error::{map_connect_err, map_err};
use crate::link::{is_master, Link};

/// One sentinel: its client and a connection kept between questions.
struct Sentinel {
    addr: String,
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

/// The sentinels of one master name.
pub(crate) struct Sentinels {
    set: SentinelSet,
    cfg: RedisConfig,
    each: Vec<Sentinel>,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sentinels")
            .field("set", &self.set.to_string())
            .finish_non_exhaustive()
    }
}

impl Sentinels {
    /// Clients for the sentinels of `set` (with their own credentials and
    /// the TLS settings of `cfg`); nothing is connected yet.
    pub(crate) fn new(set: &SentinelSet, cfg: &RedisConfig) -> Result<Sentinels> {
        let each = set
            .sentinels
            .iter()
            .map(|s| {
                let node = Node {
                    host: s.host.clone(),
                    port: s.port,
                    user: set.sentinel_user.clone(),
                    password: set.sentinel_password.clone(),
                    db: 0,
                };
                Ok(Sentinel {
                    addr: s.to_string(),
                    client: client(&node, cfg)?,
                    conn: tokio::sync::Mutex::new(None),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sentinels {
            set: set.clone(),
            cfg: cfg.clone(),
            each,
        })
    }

    /// The master as a node (with the URL's credentials and database), by
    /// the address that a majority of the sentinels names now.
    ///
    /// # Errors
    ///
    /// `Unavailable` when no majority names one master that is up (a
    /// failover under way, sentinels down, a wrong master name), naming
    /// what each sentinel said.
    pub(crate) async fn master(&self) -> Result<Node> {
        let within = self.cfg.response_timeout + self.cfg.connect_timeout;
        let asked = futures_util::future::join_all(
            self.each
                .iter()
                .map(|s| tokio::time::timeout(within, self.ask(s))),
        )
        .await;
        let mut votes: HashMap<(String, u16), usize> = HashMap::new();
        let mut said = Vec::new();
        for (s, answer) in self.each.iter().zip(asked) {
            match answer {
                Ok(Ok(Some(addr))) => {
                    said.push(format!("{} names {}:{}", s.addr, addr.0, addr.1));
                    *votes.entry(addr).or_default() += 1;
                }
                Ok(Ok(None)) => said.push(format!(
                    "{} knows no master {:?} that is up",
                    s.addr, self.set.master_name
                )),
                Ok(Err(e)) => said.push(format!("{}: {e}", s.addr)),
                Err(_) => said.push(format!("{}: no answer within {within:?}", s.addr)),
            }
        }
        let majority = self.each.len() / 2 + 1;
        match votes.into_iter().find(|(_, n)| *n >= majority) {
            Some(((host, port), _)) => Ok(Node {
                host,
                port,
                ..self.set.master.clone()
            }),
            None => Err(Error::unavailable(
                NAME,
                format!(
                    "no majority ({majority} of {}) of the sentinels names a master {:?} that is up: {}",
                    self.each.len(),
                    self.set.master_name,
                    said.join("; ")
                ),
            )),
        }
    }

    /// A client for `node` (the master), with the settings' TLS.
    fn client_of(&self, node: &Node) -> Result<redis::Client> {
        client(node, &self.cfg)
    }

    /// The master a majority of the sentinels names now, connected, and
    /// checked with `ROLE` to be a master; with its client and address.
    ///
    /// # Errors
    ///
    /// `Unavailable` when no majority names a master that is up, or the
    /// one named does not answer, or not as a master.
    pub(crate) async fn connect_master(&self) -> Result<(redis::Client, Link, String)> {
        let node = self.master().await?;
        let addr = node.to_string();
        let client = self.client_of(&node)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.cfg.connect_timeout))
            .set_response_timeout(Some(self.cfg.request_timeout()));
        let within = self.cfg.connect_timeout * 3;
        let conn = tokio::time::timeout(
            within,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| {
            Error::unavailable(
                NAME,
                format!(
                    "connect to {addr}, the master the sentinels name: no answer within {within:?}"
                ),
            )
        })?
        .map_err(|e| map_connect_err(e, &addr))?;
        let mut link = Link::Master(conn);
        if !is_master(&mut link, self.cfg.response_timeout).await {
            return Err(Error::unavailable(
                NAME,
                format!("{addr}, the master the sentinels name, does not answer as a master"),
            ));
        }
        tracing::debug!(master = %addr, "connected to the master the sentinels name");
        Ok((client, link, addr))
    }

    /// What one sentinel says of the master: its address when it deems it
    /// up, `None` when it knows no such master or deems it down.
    async fn ask(&self, s: &Sentinel) -> Result<Option<(String, u16)>> {
        let mut slot = s.conn.lock().await;
        let mut conn = match slot.take() {
            Some(c) => c,
            None => s
                .client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| map_connect_err(e, &s.addr))?,
        };
        let asked: redis::RedisResult<HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.set.master_name)
            .query_async(&mut conn)
            .await;
        let info = match asked {
            Ok(info) => info,
            // "ERR No such master with that name"
            Err(e) if e.code() == Some("ERR") && e.to_string().contains("No such master") => {
                *slot = Some(conn);
                return Ok(None);
            }
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {
                return Err(Error::unavailable(
                    NAME,
                    format!("{} does not answer as a sentinel ({e}); a sentinel's port is 26379 by default", s.addr),
                ))
            }
            Err(e) => return Err(map_err(e, "SENTINEL MASTER", &s.addr, false)),
        };
        *slot = Some(conn);
        let flags = info.get("flags").map(String::as_str).unwrap_or_default();
        let up = flags.split(',').any(|f| f == "master")
            && !flags.split(',').any(|f| f == "s_down" || f == "o_down");
        let addr = info
            .get("ip")
            .zip(info.get("port").and_then(|p| p.parse::<u16>().ok()));
        Ok(addr.filter(|_| up).map(|(ip, port)| (ip.clone(), port)))
    }
}

/// How often a connection to Sentinel's master checks that a majority of
/// the sentinels still names its server.
pub(crate) const RECHECK_EVERY: Duration = Duration::from_secs(1);
