//! RedLock over N independent masters.
//!
//! Acquire sends `SET NX PX` to every instance in parallel, each bounded by a
//! per-instance timeout much smaller than the ttl, and succeeds only when a
//! majority (N/2+1) granted it, with validity = ttl − elapsed − drift
//! (drift = ttl·1% + 2 ms). A failed attempt is undone on every instance,
//! also those that errored or timed out, then retried after a random delay
//! or a release wake-up. A renewal counts only when a majority renewed;
//! then an instance that lost the key (restarted without persistence) gets
//! it back by `SET NX`, so restarts one after another never leave the
//! holder on a minority.
//!
//! **No fencing.** The instances are independent: no counter rises
//! monotonically across them, and a token from one instance's counter can go
//! backwards when another majority grants the next lease. The capability is
//! [`Fencing::None`] and guards carry no token. Where fencing matters, use one
//! instance or a cluster (fencing while data is kept), ZooKeeper or etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lockcore::backend::prelude::*;
use lockcore::retry::jitter_between;

use crate::backend::wait_turn;
use crate::config::{RedisConfig, Topology, NAME};
use crate::conn::{Conn, Managed};
use crate::scripts::{ttl_ms, Keys, ACQUIRE_PLAIN, RELEASE, RENEW_OR_MISSING};
use crate::wake::{Subscription, Wakeups};

/// One master: its connection (made in the background, replaced when it
/// stops answering) and its wake-ups.
#[derive(Debug)]
struct Instance {
    conn: Arc<Managed>,
    wake: Wakeups,
}

/// Locks by RedLock over independent Redis masters.
#[derive(Debug)]
pub struct RedLockBackend {
    instances: std::sync::Arc<Vec<Instance>>,
    cfg: RedisConfig,
}

impl RedLockBackend {
    /// Sets up the instances of a `redlock://` configuration and connects to
    /// them in parallel, waiting up to the connect timeout; an instance that
    /// is down now keeps being connected in the background and joins later.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a topology that is not RedLock, or TLS
    /// without the `tls` feature. Instances that are down are no error here.
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
            let client = crate::conn::client(node, &cfg)?;
            instances.push(Instance {
                conn: Managed::lazy(node, &cfg)?,
                wake: Wakeups::new(client, cfg.response_timeout),
            });
        }
        join_all(instances.iter().map(|i| i.conn.ready(cfg.connect_timeout))).await;
        Ok(RedLockBackend {
            instances: Arc::new(instances),
            cfg,
        })
    }

    fn quorum(&self) -> usize {
        self.instances.len() / 2 + 1
    }

    /// The per-instance timeout: a tenth of the ttl, at most the response timeout.
    fn instance_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10)
            .min(self.cfg.response_timeout)
            .max(Duration::from_millis(5))
    }
}

/// Runs `script` on every instance in parallel, each within `limit`.
/// `Some(reply)` per instance that answered.
async fn on_all(
    instances: &[Instance],
    limit: Duration,
    script: &redis::Script,
    key: &str,
    args: &[&str],
) -> Vec<Option<(i64, i64)>> {
    let all: Vec<&Instance> = instances.iter().collect();
    on_each(&all, limit, script, key, args).await
}

/// [`on_all`] over some of the instances.
async fn on_each(
    instances: &[&Instance],
    limit: Duration,
    script: &redis::Script,
    key: &str,
    args: &[&str],
) -> Vec<Option<(i64, i64)>> {
    join_all(instances.iter().map(|i| async move {
        let call = async {
            let r: redis::RedisResult<redis::Value> = Conn::Single(i.conn.clone())
                .script(script, &[key], args)
                .await;
            match r.ok()? {
                redis::Value::Int(n) => Some((n, 0)),
                v => redis::from_redis_value::<(i64, i64)>(v).ok(),
            }
        };
        match tokio::time::timeout(limit, call).await {
            Ok(reply) => reply,
            Err(_) => {
                // Slow or silent: have the connection checked.
                i.conn.suspect_current();
                None
            }
        }
    }))
    .await
}

/// How a release went on the instances.
#[derive(Debug, Clone, Copy)]
struct ReleaseCount {
    released: usize,
    refused: usize,
}

async fn release_all(
    instances: Arc<Vec<Instance>>,
    limit: Duration,
    keys: Keys,
    token: String,
) -> ReleaseCount {
    let replies = on_all(
        &instances,
        limit,
        &RELEASE,
        &keys.lock,
        &[&token, &keys.channel],
    )
    .await;
    ReleaseCount {
        released: replies.iter().filter(|r| matches!(r, Some((1, _)))).count(),
        refused: replies.iter().filter(|r| matches!(r, Some((0, _)))).count(),
    }
}

#[async_trait]
impl Backend for RedLockBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::None, LeaseKind::Ttl).push_wakeup(true)
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let keys = Keys::new(&self.cfg.prefix, req.name);
        let token = req.owner.to_string();
        let ttl = ttl_ms(req.ttl);
        let limit = self.instance_timeout(req.ttl);
        let mut subs: Vec<Subscription> = Vec::new();
        loop {
            let started = Instant::now();
            let undo = (
                self.instances.clone(),
                self.cfg.response_timeout,
                keys.clone(),
                token.clone(),
            );
            let cleanup = CleanupOnDrop::new(
                "release a cut-off RedLock attempt on every instance",
                async move {
                    release_all(undo.0, undo.1, undo.2, undo.3).await;
                },
            );
            let replies = on_all(
                &self.instances,
                limit,
                &ACQUIRE_PLAIN,
                &keys.lock,
                &[&token, &ttl],
            )
            .await;
            let granted = replies.iter().filter(|r| matches!(r, Some((1, _)))).count();
            let answered = replies.iter().filter(|r| r.is_some()).count();
            let valid_until = validity_deadline(started, req.ttl);
            if granted >= self.quorum() && Instant::now() < valid_until {
                cleanup.disarm();
                return Ok(Some(Grant {
                    lease: Box::new(RedLockLease {
                        instances: self.instances.clone(),
                        response_timeout: self.cfg.response_timeout,
                        keys,
                        token,
                        quorum: self.quorum(),
                        limit,
                    }),
                    fence: None,
                    valid_until,
                }));
            }
            // Undo the partial grant everywhere before deciding anything.
            cleanup.run_now().await;
            if answered < self.quorum() {
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "RedLock: only {answered} of {} instances answered within {limit:?} (a majority of {} is needed)",
                        self.instances.len(),
                        self.quorum()
                    ),
                ));
            }
            if req.deadline.passed(Instant::now()) {
                return Ok(None);
            }
            if subs.is_empty() {
                for i in self.instances.iter() {
                    subs.push(i.wake.subscribe(&keys.channel).await);
                }
                continue;
            }
            // The holder's remaining ttl, as the instances that answered see it.
            let pttl = replies
                .iter()
                .flatten()
                .map(|(_, p)| *p)
                .max()
                .unwrap_or(-1);
            // A random delay keeps contending clients from colliding again.
            let jitter = jitter_between(Duration::ZERO, Duration::from_millis(20));
            tokio::time::sleep(jitter).await;
            wait_turn(&mut subs, pttl, req.deadline).await;
        }
    }
}

#[derive(Debug)]
struct RedLockLease {
    instances: Arc<Vec<Instance>>,
    response_timeout: Duration,
    keys: Keys,
    token: String,
    quorum: usize,
    limit: Duration,
}

#[async_trait]
impl BackendLease for RedLockLease {
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let sent = Instant::now();
        let ttl_arg = ttl_ms(ttl);
        let replies = on_all(
            &self.instances,
            self.limit,
            &RENEW_OR_MISSING,
            &self.keys.lock,
            &[&self.token, &ttl_arg],
        )
        .await;
        let mut renewed = replies.iter().filter(|r| matches!(r, Some((1, _)))).count();
        let refused = replies.iter().filter(|r| matches!(r, Some((0, _)))).count();
        // Renewed on a majority: take the key back where an instance lost it
        // (restarted without persistence), with NX, so that restarts one
        // after another never leave the holder on a minority (redsync #149).
        // Without a majority nothing is taken back: a lease an operator
        // deleted everywhere stays deleted.
        if renewed >= self.quorum {
            let missing: Vec<&Instance> = self
                .instances
                .iter()
                .zip(&replies)
                .filter(|(_, r)| matches!(r, Some((-1, _))))
                .map(|(i, _)| i)
                .collect();
            if !missing.is_empty() {
                let retaken = on_each(
                    &missing,
                    self.limit,
                    &ACQUIRE_PLAIN,
                    &self.keys.lock,
                    &[&self.token, &ttl_arg],
                )
                .await;
                renewed += retaken.iter().filter(|r| matches!(r, Some((1, _)))).count();
            }
        }
        let valid_until = validity_deadline(sent, ttl);
        if renewed >= self.quorum && Instant::now() < valid_until {
            return Ok(Renewal::Renewed { valid_until });
        }
        if refused > self.instances.len() - self.quorum {
            return Ok(Renewal::Lost);
        }
        Err(Error::unavailable(
            NAME,
            format!(
                "RedLock renewal: {renewed} of {} instances renewed, {} needed",
                self.instances.len(),
                self.quorum
            ),
        ))
    }

    /// Compare-and-delete on every instance: `Released` once any instance
    /// released it, `NotHeld` when a majority answered that it was not
    /// this owner's; otherwise (too few answers) `Indeterminate`, and the
    /// keys that remain end by their ttl.
    async fn release(&self) -> Result<Released> {
        let n = release_all(
            self.instances.clone(),
            self.response_timeout,
            self.keys.clone(),
            self.token.clone(),
        )
        .await;
        if n.released >= 1 {
            return Ok(Released::Released);
        }
        if n.refused >= self.quorum {
            return Ok(Released::NotHeld);
        }
        Err(Error::new(
            ErrorKind::Indeterminate,
            NAME,
            format!(
                "RedLock release: {} of {} instances answered, none released the lease ({} refused); the keys that remain end by their ttl",
                n.released + n.refused,
                self.instances.len(),
                n.refused
            ),
        ))
    }
}
