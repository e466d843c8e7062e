//! One instance or a Redis Cluster: `SET NX PX` + `INCR` fencing in one
//! script, waiters woken by pub/sub, inspection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;

use lockcore::raw::retry::Backoff;

use crate::client::{client, connect_cluster};
use crate::config::{RedisConfig, Topology, NAME};
use crate::conn::Conn;
use crate::error::{map_err, unconfirmed};
use crate::lease::{release, RedisLease};
use crate::managed::Managed;
use crate::multi::take_all;
use crate::renewals::Renewals;
use crate::scripts::{ttl_ms, Keys, ACQUIRE, FENCE_KEEP, INSPECT};
use crate::wake::{wait_turn, Subscription, Wakeups};

/// Locks on one Redis instance or a Redis Cluster.
///
/// See the [crate docs](crate) for the keys a name maps to.
#[derive(Debug)]
pub struct RedisBackend {
    conn: Conn,
    /// Batched renewals: on one instance or Sentinel's master, without the
    /// replica-sync guard.
    renewals: Option<Arc<Renewals>>,
    wake: Wakeups,
    cfg: RedisConfig,
    server: String,
}

impl RedisBackend {
    /// Connects to the instance or cluster of `cfg` (not RedLock: see
    /// [`RedLockBackend`](crate::RedLockBackend)).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when the server does not answer within the
    /// connect timeout, [`ErrorKind::InvalidConfig`] for a RedLock topology
    /// or TLS without the `tls` feature.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state.
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        let (conn, wake, server) = match &cfg.topology {
            Topology::Single(node) => {
                let client = client(node, &cfg)?;
                (
                    Conn::Single(Managed::connect(node, &cfg).await?),
                    Wakeups::new(move || client.clone(), cfg.response_timeout),
                    node.to_string(),
                )
            }
            Topology::Sentinel(set) => {
                // The pub/sub connection follows the master the commands
                // reach (a new one after each failover).
                let m = Managed::connect_sentinel(set, &cfg).await?;
                let follow = m.clone();
                (
                    Conn::Single(m),
                    Wakeups::new(move || follow.client(), cfg.response_timeout),
                    set.to_string(),
                )
            }
            Topology::Cluster(nodes) => {
                let first = nodes.first().ok_or_else(|| {
                    Error::invalid_config(NAME, "a cluster needs at least one seed node")
                })?;
                let shown = nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                // Classic PUBLISH reaches every node of a cluster, so one
                // node's pub/sub connection hears every release.
                let client = client(first, &cfg)?;
                (
                    Conn::Cluster(connect_cluster(nodes, &cfg).await?),
                    Wakeups::new(move || client.clone(), cfg.response_timeout),
                    shown,
                )
            }
            Topology::RedLock(_) => {
                return Err(Error::invalid_config(
                    NAME,
                    "RedLock topologies connect through RedLockBackend",
                ))
            }
        };
        let renewals = match &conn {
            Conn::Single(m) if cfg.sync_replicas.is_none() => {
                Some(Renewals::new(m.clone(), &server))
            }
            _ => None,
        };
        Ok(RedisBackend {
            wake,
            renewals,
            conn,
            cfg,
            server,
        })
    }

    /// The error of an acquire, renewal or release that its replicas did
    /// not confirm.
    fn unconfirmed(&self, what: &str, acked: u32, then: &str) -> Option<Error> {
        unconfirmed(self.cfg.sync_replicas, &self.server, what, acked, then)
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::StrictWhileDataKept, LeaseKind::Ttl)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
    }

    /// One script sets the key if free and advances the fencing counter;
    /// a waiter subscribes to the release channel, then tries again at each
    /// wake-up, the holder's expiry or the fallback poll.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each attempt is armed with a compare-and-delete by this
    /// owner's token before it is sent, run in the background if the future
    /// is dropped (or the attempt was cut off) while it may have applied.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let keys = Keys::new(&self.cfg.prefix, req.name);
        let token = req.owner.to_string();
        let ttl = ttl_ms(req.ttl);
        let keep = ttl_ms(FENCE_KEEP);
        let mut subs: Vec<Subscription> = Vec::new();
        // Sentinel: an acquire that waits rides out a failover.
        let mut outage: Option<(Instant, Backoff)> = None;
        loop {
            let sent = Instant::now();
            // Armed before sending: a dropped or cut-off attempt is undone
            // by compare-and-delete with this owner's token.
            let cleanup = CleanupOnDrop::new(
                "compare-and-delete a cut-off acquire",
                release(self.conn.clone(), keys.clone(), token.clone()),
            );
            // A value, where the lease carries one, goes to the value key.
            let all_keys = [keys.lock.as_str(), &keys.fence, &keys.value];
            let all_args = [token.as_str(), &ttl, &keep, req.value.unwrap_or_default()];
            let n = if req.value.is_some() { 3 } else { 2 };
            let r: redis::RedisResult<((i64, i64), u32)> = self
                .conn
                .script_synced(
                    &ACQUIRE,
                    &all_keys[..n],
                    &all_args[..=n],
                    self.cfg.sync_replicas,
                )
                .await;
            let ((won, value), acked) = match r {
                Ok(v) => v,
                Err(e) => {
                    let err = map_err(e, "acquire (SET NX PX)", &self.server, true);
                    // A script that failed midway (a foreign value where the
                    // counter lives, say) keeps the writes made before the
                    // failure: undo unless the request never left (or was
                    // refused by a server that is not the master).
                    if err.kind() == ErrorKind::Unavailable {
                        cleanup.disarm();
                    } else {
                        cleanup.run_now().await;
                    }
                    let no_master = matches!(
                        err.kind(),
                        ErrorKind::Unavailable | ErrorKind::Indeterminate
                    );
                    let sentinel = matches!(self.cfg.topology, Topology::Sentinel(_));
                    if no_master && sentinel && self.rides_out(&mut outage, req.deadline).await {
                        continue;
                    }
                    return Err(err);
                }
            };
            if won != 1 {
                outage = None;
            }
            if won == 1 {
                if let Some(e) = self.unconfirmed("lock", acked, "the acquire was undone") {
                    cleanup.run_now().await;
                    // A replica may catch up (after a failover, one that
                    // resyncs): a waiting acquire tries again.
                    if self.rides_out(&mut outage, req.deadline).await {
                        continue;
                    }
                    return Err(e);
                }
                let Ok(fence) = u64::try_from(value) else {
                    cleanup.run_now().await;
                    return Err(Error::backend_error(
                        NAME,
                        format!("fencing counter {} is negative", keys.fence),
                    ));
                };
                cleanup.disarm();
                return Ok(Some(Grant {
                    lease: Box::new(RedisLease::new(
                        self.conn.clone(),
                        self.renewals.clone(),
                        keys,
                        token,
                        self.server.clone(),
                        req.value.map(|_| fence),
                        self.cfg.sync_replicas,
                    )),
                    fence: Some(fence),
                    valid_until: validity_deadline(sent, req.ttl),
                }));
            }
            cleanup.disarm();
            if req.deadline.passed(Instant::now()) {
                return Ok(None);
            }
            waiting();
            if subs.is_empty() {
                // Subscribe, then retry at once: no release can slip between.
                subs.push(self.wake.subscribe(&keys.channel).await);
                continue;
            }
            wait_turn(&mut subs, value, req.deadline).await;
        }
    }

    /// Every name in one script where they are all on one server (one
    /// instance, Sentinel's master): see `multi.rs`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call compare-and-deletes every key it may
    /// have set, in the background.
    async fn try_acquire_all(&self, reqs: &[AcquireRequest<'_>]) -> Result<AllOrNone> {
        take_all(
            &self.conn,
            self.renewals.as_ref(),
            &self.cfg,
            &self.server,
            reqs,
        )
        .await
    }

    /// The holder's token, its remaining ttl and the last fencing token
    /// issued, in one script.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let keys = Keys::new(&self.cfg.prefix, name);
        let (owner, pttl, counter, value): (Option<String>, i64, Option<u64>, Option<Vec<u8>>) =
            self.conn
                .script(&INSPECT, &[&keys.lock, &keys.fence, &keys.value], &[])
                .await
                .map_err(|e| map_err(e, "inspect", &self.server, false))?;
        let holder = owner.map(|o| {
            let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
            // The value key names the lease it belongs to: a stale one (of
            // an earlier leader) is not this holder's. Its token is the
            // holder's even when the counter has expired.
            let carried = value.as_deref().and_then(|v| parse_value(v, &o));
            let fence = carried.as_ref().map_or(counter, |c| Some(c.0));
            HolderInfo::new(Some(o.clone()), fence, ttl)
                .with_value(carried.map(|c| c.1))
                .with_since(fence.and_then(crate::scripts::time_of_fence))
        });
        Ok(Some(LockInfo::new(holder, None)))
    }

    /// The lock keys under the prefix (`SCAN`, on every master of a
    /// cluster), as names.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let pattern = crate::scripts::scan_pattern(&self.cfg.prefix, prefix);
        let key_prefix = self.cfg.prefix.clone();
        let keys = self
            .conn
            .scan(&pattern, limit.saturating_add(1), |k| {
                crate::scripts::name_of_key(&key_prefix, k).is_some()
            })
            .await
            .map_err(|e| map_err(e, "list", &self.server, false))?;
        Ok(Some(Listing::bounded(
            keys.iter()
                .filter_map(|k| crate::scripts::name_of_key(&self.cfg.prefix, k))
                .filter(|n| n.starts_with(prefix))
                .collect(),
            limit,
        )))
    }
}

impl RedisBackend {
    /// Whether an acquire that found no master (on Sentinel) or whose grant
    /// no replica confirmed should try again: while it may wait, and for
    /// at most `failover_wait` of such outage, after a bounded backoff
    /// (meanwhile the connection asks the sentinels for the new master, or
    /// the replicas catch up).
    async fn rides_out(&self, outage: &mut Option<(Instant, Backoff)>, deadline: Deadline) -> bool {
        if matches!(deadline, Deadline::Now) {
            return false;
        }
        let (since, backoff) = outage.get_or_insert_with(|| {
            (
                Instant::now(),
                Backoff::new(Duration::from_millis(50), Duration::from_millis(500)),
            )
        });
        let mut until = Instant::now() + backoff.next_delay();
        if let Some(d) = deadline.instant() {
            until = until.min(d);
        }
        if until >= *since + self.cfg.failover_wait || deadline.passed(until) {
            return false;
        }
        tracing::debug!(server = %self.server, "no master answers, or no replica confirms; the acquire waits");
        tokio::time::sleep_until(until.into()).await;
        true
    }
}

/// The fencing token and value of a value key (`"<token> <fence> <value>"`)
/// when it belongs to `holder`; `None` for another lease's, or for a value
/// this backend did not write.
fn parse_value(raw: &[u8], holder: &str) -> Option<(u64, String)> {
    let raw = String::from_utf8_lossy(raw);
    let mut parts = raw.splitn(3, ' ');
    let (token, fence, value) = (parts.next()?, parts.next()?, parts.next()?);
    if token != holder {
        return None;
    }
    Some((fence.parse().ok()?, value.to_owned()))
}
