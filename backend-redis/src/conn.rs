//! The one way a server call is made: on one instance or a cluster.

use std::sync::Arc;

use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, RedisResult, Script};

use crate::config::SyncReplicas;
use crate::link::Link;
use crate::managed::Managed;

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

/// `EVALSHA <script's hash> <keys>`, for its keys and arguments to be
/// added (keys first): one buffer for them all, not one per argument.
pub(crate) fn evalsha(script: &Script, keys: usize) -> redis::Cmd {
    evalsha_sized(script, keys, 0, 0)
}

/// [`evalsha`] with room made for `args` more arguments of `bytes` bytes
/// in all: a call over hundreds of keys is built without growing its
/// buffer again and again.
pub(crate) fn evalsha_sized(script: &Script, keys: usize, args: usize, bytes: usize) -> redis::Cmd {
    let mut call = redis::Cmd::with_capacity(3 + args, 64 + bytes);
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    call
}

impl Conn {
    /// Runs `script` (EVALSHA, loading it on NOSCRIPT).
    pub(crate) async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> RedisResult<T> {
        let mut call = evalsha(script, keys.len());
        call.arg(keys).arg(args);
        self.eval(script, &call).await
    }

    /// Runs `call`, an [`evalsha`] of `script` with its keys and arguments,
    /// loading the script on NOSCRIPT and running it once more.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        call: &redis::Cmd,
    ) -> RedisResult<T> {
        match self.cmd(call).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load(script).await?;
                self.cmd(call).await
            }
            r => r,
        }
    }

    /// Loads `script` (on a cluster: on every node).
    async fn load(&self, script: &Script) -> RedisResult<()> {
        let _: String = match self {
            Conn::Single(m) => {
                let (gen, mut c) = m.get();
                let r = script.load_async(&mut c).await;
                m.after(gen, &r);
                r?
            }
            Conn::Cluster(c) => script.load_async(&mut c.clone()).await?,
        };
        Ok(())
    }

    /// Runs `script` and, in the same pipeline on the same connection,
    /// `WAIT` for `sync`'s replicas to have its writes (`WAIT` counts the
    /// writes of its own connection, so the two cannot go apart). Returns
    /// the script's result and how many replicas confirmed it (`u32::MAX`
    /// without a guard).
    pub(crate) async fn script_synced<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        sync: Option<SyncReplicas>,
    ) -> RedisResult<(T, u32)> {
        let Some(sync) = sync else {
            return Ok((self.script(script, keys, args).await?, u32::MAX));
        };
        let timeout_ms = u64::try_from(sync.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut eval = evalsha(script, keys.len());
        eval.arg(keys).arg(args);
        let mut pipe = redis::pipe();
        pipe.add_command(eval)
            .cmd("WAIT")
            .arg(sync.count)
            .arg(timeout_ms);
        match self.pipeline::<(T, u32)>(&pipe).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load(script).await?;
                self.pipeline::<(T, u32)>(&pipe).await
            }
            r => r,
        }
    }

    /// Runs a pipeline on one connection (on a cluster: the node of its
    /// keys' slot).
    async fn pipeline<T: FromRedisValue>(&self, pipe: &redis::Pipeline) -> RedisResult<T> {
        match self {
            Conn::Single(m) => {
                let (gen, mut c) = m.get();
                let r = pipe.query_async(&mut c).await;
                m.after(gen, &r);
                r
            }
            Conn::Cluster(c) => pipe.query_async(&mut c.clone()).await,
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
    Single(&'a mut Link),
    Node(
        &'a mut ClusterConnection,
        redis::cluster_routing::RoutingInfo,
    ),
}
