//! Waiting for the lock: keep the waiting lease alive, and watch only the
//! key just before ours until no older key is left.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{
    EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use lockcore::raw::prelude::*;
use lockcore::raw::retry::Backoff;
use lockcore::raw::sync::lock;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::{is_transient, map_err};
use crate::keys::first_kv;

/// How a wait ended.
pub(crate) enum Turn {
    /// Our key is the oldest: the lock is ours.
    Mine,
    /// The caller's deadline passed.
    Deadline,
    /// The waiting lease or key vanished; start over with a new lease.
    Gone(&'static str),
}

pub(crate) enum WatchEnd {
    Deleted,
    Recheck,
}

impl EtcdBackend {
    /// Waits for the key of `lease` (create revision `my_rev`) to be the
    /// oldest of the lock, keeping the lease alive meanwhile, until the
    /// request's deadline.
    pub(crate) async fn wait_turn(
        &self,
        req: &AcquireRequest<'_>,
        lease: i64,
        range: &str,
        key: &str,
        my_rev: i64,
        valid: &Mutex<Instant>,
    ) -> Result<Turn> {
        let waiting = self.wait_predecessors(req.name, range, key, my_rev, req.ttl, valid);
        let keep = self.keep_waiting_lease_alive(lease, req.ttl, valid, req.name);
        tokio::select! {
            t = waiting => t,
            t = keep => t,
            () = req.deadline.sleep() => Ok(Turn::Deadline),
        }
    }

    /// Keeps a waiting acquisition's lease alive at ttl/3; returns only when
    /// the lease is gone or could not be renewed before it ran out.
    pub(crate) async fn keep_waiting_lease_alive(
        &self,
        lease: i64,
        ttl: Duration,
        valid: &Mutex<Instant>,
        name: &str,
    ) -> Result<Turn> {
        let every = ttl / 3;
        let limit = self.op_timeout(ttl);
        let mut next = Instant::now() + every;
        let mut backoff = Backoff::new(
            Duration::from_millis(50),
            every.max(Duration::from_millis(100)),
        );
        loop {
            tokio::time::sleep_until(next.into()).await;
            let sent = Instant::now();
            match self.keep_alive_once(lease, limit).await {
                Ok(true) => {
                    *lock(valid) = validity_deadline(sent, ttl);
                    backoff.reset();
                    next = sent + every;
                }
                Ok(false) => return Ok(Turn::Gone("the waiting lease expired or was revoked")),
                Err(e) => {
                    let until = *lock(valid);
                    if Instant::now() >= until {
                        return Err(Error::unavailable(
                            NAME,
                            format!("the lease of a waiting acquisition could not be renewed before it ran out: {e}"),
                        )
                        .with_source(e));
                    }
                    tracing::debug!(backend = NAME, name, error = %e, "renewing a waiting lease failed; retrying");
                    next = Instant::now() + backoff.next_delay();
                }
            }
        }
    }

    /// Waits until no key older than ours is left under `range`, watching
    /// only the one just before ours.
    pub(crate) async fn wait_predecessors(
        &self,
        name: &str,
        range: &str,
        key: &str,
        my_rev: i64,
        ttl: Duration,
        valid: &Mutex<Instant>,
    ) -> Result<Turn> {
        let limit = self.op_timeout(ttl);
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
        let mut kv = self.inner.client.kv_client();
        loop {
            let pred = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1)
                .with_keys_only();
            let txn = Txn::new().and_then([
                TxnOp::get(range, Some(pred)),
                TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
            ]);
            let read = self
                .request(limit, "reading the waiters", false, kv.txn(txn))
                .await;
            let resp = match read {
                Ok(r) => r,
                Err(e) if is_transient(&e) && Instant::now() < *lock(valid) => {
                    tracing::debug!(backend = NAME, name, error = %e, "reading the waiters failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let ops = resp.op_responses();
            let mine = first_kv(ops.get(1)).map(|kv| kv.1);
            if mine != Some(my_rev) {
                return Ok(Turn::Gone("the waiting key was deleted"));
            }
            let Some((pred_key, pred_rev)) = first_kv(ops.first()) else {
                return Ok(Turn::Mine);
            };
            match self.watch_delete(pred_key, pred_rev, limit, name).await {
                Ok(WatchEnd::Deleted) => backoff.reset(),
                // Cancelled or ended by the server: read again, not in a
                // tight loop.
                Ok(WatchEnd::Recheck) => tokio::time::sleep(backoff.next_delay()).await,
                // Watching only reads: whatever broke it, read again while
                // the waiting lease lives (but not with bad credentials).
                Err(e) if e.kind() != ErrorKind::InvalidConfig && Instant::now() < *lock(valid) => {
                    tracing::debug!(backend = NAME, name, error = %e, "watching the predecessor failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether `key` exists now with create revision `rev`: the same key,
    /// not one deleted and put again under its name (a handle puts the same
    /// key again when it asks for a name again with a spare lease).
    async fn still_there(&self, key: &[u8], rev: i64, limit: Duration) -> Result<bool> {
        let mut kv = self.inner.client.kv_client();
        let resp = self
            .request(
                limit,
                "reading the predecessor",
                false,
                kv.get(key, Some(GetOptions::new().with_keys_only())),
            )
            .await?;
        Ok(resp.kvs().first().map(|kv| kv.create_revision()) == Some(rev))
    }

    /// Watches `key` (create revision `rev`) from now until it is deleted,
    /// or until the watch ends for another reason (compaction, cancel,
    /// stream end), after which the caller reads again.
    async fn watch_delete(
        &self,
        key: Vec<u8>,
        rev: i64,
        limit: Duration,
        name: &str,
    ) -> Result<WatchEnd> {
        let mut wc = self.inner.client.watch_client();
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut stream = self
            .request(
                limit,
                "watching the predecessor",
                false,
                wc.watch(key.clone(), Some(opts)),
            )
            .await?;
        loop {
            let msg = stream
                .message()
                .await
                .map_err(|e| map_err(e, "watching the predecessor", &self.inner.servers, false))?;
            let Some(resp) = msg else {
                return Ok(WatchEnd::Recheck);
            };
            if resp.created() {
                // The watch starts at the server's current revision: one
                // from the revision of our read would be caught up only by
                // the server's sync loop, every 100 ms, once any write came
                // in between (an ~85 ms tail on hand-offs). A delete that
                // landed between our read and now is seen by looking once,
                // with the watch in place; so is one followed by a put of
                // the same key, whose create revision is then another.
                if !self.still_there(&key, rev, limit).await? {
                    self.inner
                        .counters
                        .predecessor_events
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(WatchEnd::Deleted);
                }
            }
            if resp.compact_revision() > 0 {
                self.inner
                    .counters
                    .compacted_watches
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    backend = NAME,
                    name,
                    compacted = resp.compact_revision(),
                    "the predecessor watch started before the compacted revision; reading again"
                );
                return Ok(WatchEnd::Recheck);
            }
            if resp.canceled() {
                return Ok(WatchEnd::Recheck);
            }
            if resp
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                self.inner
                    .counters
                    .predecessor_events
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(WatchEnd::Deleted);
            }
        }
    }
}
