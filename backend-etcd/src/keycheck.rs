//! Renewals' reads of their keys, many to a request.
//!
//! A renewal reads its key to see that nobody deleted it. With thousands of
//! held locks, one read each is thousands of requests a second; so the
//! reads asked within a short window go to the server together, as the
//! read operations of one transaction (at most [`PER_TXN`], under etcd's
//! default `--max-txn-ops` of 128; fewer, found by halving, when the server
//! refuses that many), and each renewal gets its own key's answer. A few batches may be in flight at once, so a slow server does
//! not hold renewals in a line.
//!
//! The keys on a shared lease (`shared.rs`) are checked by one read of
//! that lease's attached keys (`LeaseTimeToLive` with keys), which serves
//! every lock on it that asks within its window: a read sent after the
//! lock moved there, and recently enough. The read keeps the keys it found
//! as a set of their hashes, keyed with a seed of this handle: ten thousand
//! renewals a second each look for one number (one or two reads of
//! memory) rather than hash and compare a name.
//! A deleted key passes for a kept one if its hash equals another
//! key's on the lease, and then on every read while that key stays (the
//! seed does not change): with 2,048 keys on a lease, odds of about one in
//! 10^16 a deletion.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, LeaseTimeToLiveOptions, Txn, TxnOp, TxnOpResponse};
use foldhash::fast::FixedState;
use lockcore::raw::batch::{Batches, Waiting};
use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use tokio::sync::oneshot;

use crate::config::NAME;
use crate::error::map_err;

/// Reads per transaction.
pub(crate) const PER_TXN: usize = 64;
/// How long the first read of a batch waits for others to join it.
const WINDOW: Duration = Duration::from_millis(25);
/// Batches in flight at once.
const IN_FLIGHT: usize = 32;

/// One renewal's read: its key, the create revision it must still have,
/// and where the answer goes.
struct Check {
    key: String,
    rev: i64,
    reply: oneshot::Sender<Result<bool>>,
}

impl Waiting for Check {
    fn gave_up(&self) -> bool {
        self.reply.is_closed()
    }
}

/// The handle on a backend's batching task, which it starts on first use
/// (and again if the runtime that ran it has ended).
pub(crate) struct KeyChecks {
    client: Client,
    servers: String,
    limit: Duration,
    /// Reads per transaction, kept across tasks, lowered when the server
    /// refuses that many.
    batches: Batches<Check>,
    /// The last read of each shared lease's keys, by lease id (random
    /// ids: a fixed hasher serves).
    lists: Mutex<HashMap<i64, Slot, FixedState>>,
    /// The keys' hashes, with a seed of this handle.
    hasher: RandomState,
}

/// A shared lease's last read of its keys, and the turn to read them
/// (one read at a time).
#[derive(Default)]
struct Slot {
    list: Option<KeyList>,
    reading: Arc<tokio::sync::Mutex<()>>,
}

/// The keys attached to a lease, as one read found them.
struct KeyList {
    /// When the read was sent.
    sent: Instant,
    /// The lease lived (its ttl was above zero).
    alive: bool,
    /// The next read was asked for ahead ([`KeyChecks::attached_known`]).
    ahead: bool,
    /// The hashes of the keys found ([`KeyChecks::key_hash`]). They are
    /// seeded hashes already, so a fixed hasher spreads them.
    keys: HashSet<u64, FixedState>,
}

impl KeyList {
    /// Whether the lease lived and the key of hash `key` was on it.
    fn has(&self, key: u64) -> bool {
        self.alive && self.keys.contains(&key)
    }
}

impl KeyChecks {
    /// A handle for `client`; `limit` bounds each batch's request. Its
    /// task runs on the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it is called from `connect`, inside one).
    pub(crate) fn new(client: Client, servers: String, limit: Duration) -> Self {
        KeyChecks {
            client,
            servers,
            limit,
            batches: Batches::new(WINDOW, PER_TXN, IN_FLIGHT),
            lists: Mutex::default(),
            hasher: RandomState::new(),
        }
    }

    /// The hash of `key` that [`attached`](Self::attached) looks for.
    pub(crate) fn key_hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Whether the key of hash `key` ([`key_hash`](Self::key_hash)) is
    /// attached to `lease`, by a read of the lease's keys
    /// sent at `not_before` or later: the last one, or a new one (which
    /// the renewals of the other locks on the lease then take).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn attached(&self, lease: i64, key: u64, not_before: Instant) -> Result<bool> {
        let reading = lock(&self.lists).entry(lease).or_default().reading.clone();
        self.read_on(&reading, lease, key, not_before, self.limit)
            .await
    }

    /// Reads the keys of `lease` for the renewals to come, unless a read
    /// sent after the one at `after` is in by its turn (the read
    /// [`attached_known`](Self::attached_known) asked ahead from); within
    /// `limit`, a renewal's, so that the renewals waiting for the turn do
    /// not wait longer than their own limit. Nothing for a lease
    /// forgotten. Errors are the next renewal's to meet.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn read_ahead(&self, lease: i64, after: Instant, limit: Duration) {
        let Some(reading) = lock(&self.lists).get(&lease).map(|s| s.reading.clone()) else {
            return;
        };
        let not_before = after.checked_add(Duration::from_nanos(1)).unwrap_or(after);
        let _ = self.read_on(&reading, lease, 0, not_before, limit).await;
    }

    /// [`attached`](Self::attached) with the turn to read `lease`'s keys,
    /// the read bounded by `limit`.
    async fn read_on(
        &self,
        reading: &tokio::sync::Mutex<()>,
        lease: i64,
        key: u64,
        not_before: Instant,
        limit: Duration,
    ) -> Result<bool> {
        let _turn = reading.lock().await;
        // A read that came in while this one waited for its turn serves.
        if let Some((found, _)) = self.attached_known(lease, key, not_before, None) {
            return Ok(found);
        }
        let sent = Instant::now();
        let mut lc = self.client.lease_client();
        let opts = LeaseTimeToLiveOptions::new().with_keys();
        let r = match tokio::time::timeout(limit, lc.time_to_live(lease, Some(opts))).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return Err(map_err(
                    e,
                    "reading the shared lease's keys",
                    &self.servers,
                    false,
                ))
            }
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "reading the shared lease's keys on {}: no answer within {limit:?}",
                        self.servers
                    ),
                ))
            }
        };
        let list = KeyList {
            sent,
            alive: r.ttl() > 0,
            ahead: false,
            keys: r.keys().iter().map(|k| self.key_hash(k)).collect(),
        };
        let found = list.has(key);
        // Not kept for a lease forgotten meanwhile (it ended), nor over a
        // later read (of a slot made after that).
        if let Some(slot) = lock(&self.lists).get_mut(&lease) {
            if slot.list.as_ref().is_none_or(|l| l.sent <= sent) {
                slot.list = Some(list);
            }
        }
        Ok(found)
    }

    /// What [`attached`](Self::attached) would answer now from a read
    /// already made, without waiting; `None` when it would read (no read
    /// so recent). With it, when the caller should have the next read
    /// made now ([`read_ahead`](Self::read_ahead)), the instant the read
    /// it took was sent: once for each read, for the first caller that
    /// finds it sent at `ahead_after` or before, so that the renewals
    /// after it find a new read rather than each wait for one.
    pub(crate) fn attached_known(
        &self,
        lease: i64,
        key: u64,
        not_before: Instant,
        ahead_after: Option<Instant>,
    ) -> Option<(bool, Option<Instant>)> {
        let mut lists = lock(&self.lists);
        let list = lists.get_mut(&lease)?.list.as_mut()?;
        if list.sent < not_before {
            return None;
        }
        let ahead = !list.ahead && ahead_after.is_some_and(|a| list.sent <= a);
        list.ahead |= ahead;
        Some((list.has(key), ahead.then_some(list.sent)))
    }

    /// Forgets the key list of `lease` (it ended).
    pub(crate) fn forget(&self, lease: i64) {
        lock(&self.lists).remove(&lease);
    }

    /// Whether `key` is still there with create revision `rev`, read
    /// after this call began.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn still_there(&self, key: &str, rev: i64) -> Result<bool> {
        let (reply, answer) = oneshot::channel();
        self.send(Check {
            key: key.to_owned(),
            rev,
            reply,
        });
        answer.await.unwrap_or_else(|_| {
            Err(Error::unavailable(
                NAME,
                format!(
                    "reading the lock key on {}: the reading task ended",
                    self.servers
                ),
            ))
        })
    }

    fn send(&self, check: Check) {
        self.batches.send(check, || {
            let batcher = Batcher {
                client: self.client.clone(),
                servers: Arc::from(self.servers.as_str()),
                limit: self.limit,
                per_txn: self.batches.most(),
            };
            move |batch| {
                let me = batcher.clone();
                async move { me.read(batch).await }
            }
        });
    }
}

#[derive(Clone)]
struct Batcher {
    client: Client,
    servers: Arc<str>,
    limit: Duration,
    /// Reads per transaction: [`PER_TXN`], or less once the server refused
    /// that many (its `--max-txn-ops` is lower).
    per_txn: Arc<AtomicUsize>,
}

impl Batcher {
    /// Reads the keys of `batch` and answers each: in one transaction, or
    /// in halves while the server refuses that many operations in one.
    async fn read(&self, batch: Vec<Check>) {
        let mut batches = vec![batch];
        while let Some(batch) = batches.pop() {
            if let Some(refused) = self.read_one(batch).await {
                let half = refused.len().div_ceil(2);
                self.per_txn.fetch_min(half, Ordering::Relaxed);
                tracing::debug!(
                    backend = NAME,
                    reads = half,
                    "the server refused a transaction of {} reads; sending at most {half}",
                    refused.len()
                );
                let mut first = refused;
                let second = first.split_off(half);
                batches.push(second);
                batches.push(first);
            }
        }
    }

    /// Reads the keys of `batch` in one transaction and answers each;
    /// gives the batch back when the server refused that many operations
    /// in a transaction (and there are two or more).
    async fn read_one(&self, batch: Vec<Check>) -> Option<Vec<Check>> {
        let ops: Vec<TxnOp> = batch
            .iter()
            .map(|c| TxnOp::get(c.key.clone(), Some(GetOptions::new().with_keys_only())))
            .collect();
        let mut kv = self.client.kv_client();
        let res = tokio::time::timeout(self.limit, kv.txn(Txn::new().and_then(ops))).await;
        let err = match res {
            Ok(Ok(r)) if r.op_responses().len() == batch.len() => {
                for (c, op) in batch.into_iter().zip(r.op_responses()) {
                    let there = match op {
                        TxnOpResponse::Get(g) => g
                            .kvs()
                            .first()
                            .is_some_and(|kv| kv.create_revision() == c.rev),
                        _ => false,
                    };
                    let _ = c.reply.send(Ok(there));
                }
                return None;
            }
            Ok(Err(etcd_client::Error::GRpcStatus(s)))
                if batch.len() > 1
                    && s.code() == tonic::Code::InvalidArgument
                    && s.message().contains("too many operations") =>
            {
                return Some(batch);
            }
            Ok(Ok(r)) => Error::backend_error(
                NAME,
                format!(
                    "reading the lock keys on {}: {} answers to {} reads",
                    self.servers,
                    r.op_responses().len(),
                    batch.len()
                ),
            ),
            Ok(Err(e)) => map_err(e, "reading the lock keys", &self.servers, false),
            Err(_) => Error::unavailable(
                NAME,
                format!(
                    "reading the lock keys on {}: no answer within {:?}",
                    self.servers, self.limit
                ),
            ),
        };
        for c in batch {
            let _ = c
                .reply
                .send(Err(Error::new(err.kind(), NAME, err.message())));
        }
        None
    }
}
