//! The backend: connect, acquire (a lease per held lock, recycled through
//! `spare.rs`, and a key per acquisition, then the wait of `wait.rs`),
//! inspect.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseGrantOptions, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp,
};
use lockcore::address::Secret;
use lockcore::backend::prelude::*;
use lockcore::sync::lock;

use crate::config::{EtcdConfig, NAME};
use crate::error::{is_lease_not_found, map_err};
use crate::keys::{first_kv, header_rev, lease_id_of, range_of, OWNER_MARK};
use crate::lease::{revoke, EtcdLease};
use crate::spare::{Spare, SpareLeases};
use crate::wait::Turn;

/// An etcd lock backend. Cheap to clone (clones share the connection).
///
/// Each held lock has its own etcd lease (see the crate docs for why), and
/// its lock key `<prefix>/<encoded name>/<lease id in hex>` is attached to
/// it. The lease of a cleanly released lock is kept for the next
/// acquisition with the same ttl.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) prefix: String,
    pub(crate) request_timeout: Duration,
    pub(crate) servers: String,
    pub(crate) counters: Arc<EtcdCounters>,
    pub(crate) spares: SpareLeases,
}

/// The live counters of one backend, for tests and monitoring: a handle
/// that outlives the backend (see [`EtcdBackend::counters`]).
#[derive(Debug, Default)]
pub struct EtcdCounters {
    pub(crate) predecessor_events: AtomicU64,
    pub(crate) compacted_watches: AtomicU64,
}

/// A snapshot of a backend's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Predecessors found gone by waiters: a deletion seen by the watch,
    /// or the key found gone (or put again) by the look once the watch was
    /// set up. With no herd, one hand-off costs one, however many wait.
    pub predecessor_events: u64,
    /// Predecessor watches the server ended with a compaction (and that
    /// were set up again from a fresh read).
    pub compacted_watches: u64,
}

impl EtcdCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> EtcdStats {
        EtcdStats {
            predecessor_events: self.predecessor_events.load(Ordering::Relaxed),
            compacted_watches: self.compacted_watches.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Inner {
    /// Revokes the spare leases in the background: nothing is attached to
    /// them, and no acquisition of this backend can take them any more.
    fn drop(&mut self) {
        let spares = self.spares.drain();
        if spares.is_empty() {
            return;
        }
        let (client, limit) = (self.client.clone(), self.request_timeout);
        spawn_cleanup(
            "revoke the spare leases of a dropped etcd backend",
            async move {
                let mut lc = client.lease_client();
                for id in spares {
                    let _ = tokio::time::timeout(limit, lc.revoke(id)).await;
                }
            },
        );
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("servers", &self.inner.servers)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the members of `cfg` and checks that one answers.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for settings that cannot work (no endpoint, TLS
    /// without the feature, refused credentials), [`ErrorKind::Unavailable`]
    /// when no member answers within the connect and request timeouts.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state.
    pub async fn connect(cfg: EtcdConfig) -> Result<Self> {
        cfg.validate()?;
        let servers = cfg.servers();
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(3))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some(user) = &cfg.user {
            let password = cfg
                .password
                .as_ref()
                .map(Secret::expose)
                .unwrap_or_default();
            opts = opts.with_user(user.clone(), password);
        }
        #[cfg(feature = "tls")]
        if cfg.tls {
            // The system's roots, plus the CA file if one is given.
            let mut tls = etcd_client::TlsOptions::new().with_enabled_roots();
            if let Some(ca) = &cfg.ca_file {
                let pem = std::fs::read(ca).map_err(|e| {
                    Error::invalid_config(NAME, format!("reading the CA file {ca:?}: {e}"))
                        .with_source(e)
                })?;
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            if let Some(d) = &cfg.domain {
                tls = tls.domain_name(d.clone());
            }
            opts = opts.with_tls(tls);
        }
        let limit = cfg.connect_timeout + cfg.request_timeout;
        let client =
            match tokio::time::timeout(limit, Client::connect(cfg.endpoints.clone(), Some(opts)))
                .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return Err(map_err(e, "connecting", &servers, false)),
                Err(_) => {
                    return Err(Error::unavailable(
                        NAME,
                        format!("connecting to {servers}: no answer within {limit:?}"),
                    ))
                }
            };
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                client,
                prefix: cfg.prefix.clone(),
                request_timeout: cfg.request_timeout,
                servers,
                counters: Arc::default(),
                spares: SpareLeases::default(),
            }),
        };
        // One read, so that a wrong address or credentials fail here.
        let mut kv = backend.inner.client.kv_client();
        let probe = GetOptions::new().with_count_only();
        backend
            .request(
                cfg.request_timeout,
                "checking the connection",
                false,
                kv.get(format!("{}/", cfg.prefix), Some(probe)),
            )
            .await
            .map_err(|e| {
                if crate::error::is_other_protocol(&e) {
                    Error::unavailable(
                        NAME,
                        format!("connecting to {}: the server did not answer as etcd (gRPC over HTTP/2); is another service listening on that port?", backend.inner.servers),
                    )
                    .with_source(e)
                } else {
                    e
                }
            })?;
        Ok(backend)
    }

    /// The raw etcd client (shares this backend's connection).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// A handle on this backend's counters that stays readable after the
    /// backend is gone.
    pub fn counters(&self) -> Arc<EtcdCounters> {
        self.inner.counters.clone()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The timeout of one request for a lease of `ttl`: the configured one,
    /// capped at half the ttl (at least 1 s).
    pub(crate) fn op_timeout(&self, ttl: Duration) -> Duration {
        self.inner
            .request_timeout
            .min((ttl / 2).max(Duration::from_secs(1)))
    }

    /// One request within `limit`, its errors mapped; `what` says what was
    /// asked (`mutating`: it may have created state).
    pub(crate) async fn request<T>(
        &self,
        limit: Duration,
        what: &str,
        mutating: bool,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        let servers = &self.inner.servers;
        let asked = async { fut.await.map_err(|e| map_err(e, what, servers, mutating)) };
        within(NAME, format!("{what} on {servers}"), limit, mutating, asked).await
    }

    /// Grants `lease` with `ttl` (whole seconds); returns when the request
    /// was sent.
    async fn grant_lease(&self, lease: i64, ttl: Duration, limit: Duration) -> Result<Instant> {
        let mut lc = self.inner.client.lease_client();
        let sent = Instant::now();
        let granted = self
            .request(
                limit,
                "granting a lease",
                false,
                lc.grant(
                    i64::try_from(whole_seconds(ttl)).unwrap_or(i64::MAX),
                    Some(LeaseGrantOptions::new().with_id(lease)),
                ),
            )
            .await?;
        if !granted.error().is_empty() {
            return Err(Error::backend_error(
                NAME,
                format!("granting a lease: {}", granted.error()),
            ));
        }
        Ok(sent)
    }

    /// Puts `key` on `lease` if it does not exist yet, with `value` (a
    /// candidate's value, as `concurrency.Election` puts it; for a plain
    /// lock, its owner token behind [`OWNER_MARK`], where
    /// `concurrency.Mutex` puts nothing and reads nothing); returns its
    /// create revision and that of the oldest key of the lock (the
    /// holder's).
    async fn create_key(
        &self,
        key: &str,
        range: &str,
        lease: i64,
        value: Option<&str>,
        owner: OwnerToken,
        limit: Duration,
    ) -> Result<(i64, Option<i64>)> {
        let stored = value.map_or_else(|| format!("{OWNER_MARK}{owner}"), str::to_owned);
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, stored, Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(range, Some(first.clone())),
            ])
            .or_else([TxnOp::get(key, None), TxnOp::get(range, Some(first))]);
        let mut kv = self.inner.client.kv_client();
        let resp = self
            .request(limit, "creating the lock key", true, kv.txn(txn))
            .await?;
        let ops = resp.op_responses();
        let my_rev = if resp.succeeded() {
            header_rev(&resp)
        } else {
            first_kv(ops.first()).map_or(0, |kv| kv.1)
        };
        Ok((my_rev, first_kv(ops.get(1)).map(|kv| kv.1)))
    }

    /// An attempt that ends without the lock (a `try` that found the name
    /// held, a waiter whose deadline passed): deletes its key, compared on
    /// its create revision, and keeps the lease spare, as
    /// `concurrency.Mutex` keeps its session; one durable write, and the
    /// next acquisition needs no grant. If the delete did not succeed, or
    /// there are spares enough, the lease is revoked instead (the key goes
    /// with it); so is it when this is dropped halfway (`cleanup`).
    async fn step_back(
        &self,
        cleanup: CleanupOnDrop,
        key: &str,
        rev: i64,
        left: Spare,
        ttl: Duration,
        limit: Duration,
    ) {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]);
        let mut kv = self.inner.client.kv_client();
        let deleted = self
            .request(limit, "deleting a waiting key", false, kv.txn(txn))
            .await
            .is_ok_and(|r| r.succeeded());
        if deleted && self.inner.spares.put(whole_seconds(ttl), left) {
            cleanup.disarm();
        } else {
            cleanup.run_now().await;
        }
    }

    /// One try with `lease`: a spare one (renewed beside the key's put) or
    /// a new one (granted first); then create the key and wait for older
    /// keys to go.
    async fn attempt(
        &self,
        req: &AcquireRequest<'_>,
        lease: i64,
        spare: Option<Spare>,
    ) -> Result<std::result::Result<Option<Grant>, Retry>> {
        let name = req.name;
        let ttl = req.ttl;
        let limit = self.op_timeout(ttl);
        let range = range_of(&self.inner.prefix, name);
        let key = format!("{range}{lease:x}");
        // Armed before the first request is sent: the lease id is chosen
        // here, so a dropped acquire revokes it (and with it the key)
        // whatever the server had applied.
        let cleanup = CleanupOnDrop::new(
            "revoke the lease of a dropped etcd acquisition",
            revoke(self.clone(), lease, limit),
        );
        let (valid_from_grant, (my_rev, owner_rev)) = match spare {
            None => {
                let sent = self.grant_lease(lease, ttl, limit).await?;
                let created = self
                    .create_key(&key, &range, lease, req.value, req.owner, limit)
                    .await?;
                (validity_deadline(sent, ttl), created)
            }
            Some(spare) => {
                let sent = Instant::now();
                // Renewed within the drift allowance (a lock cycle ago): it
                // has its whole ttl but for that, as the validity says.
                let fresh = spare.valid_until + ttl / 100 >= validity_deadline(sent, ttl);
                let (alive, created) = if fresh {
                    let created = self
                        .create_key(&key, &range, lease, req.value, req.owner, limit)
                        .await;
                    (None, created)
                } else {
                    let (alive, created) = tokio::join!(
                        self.keep_alive_once(lease, limit),
                        self.create_key(&key, &range, lease, req.value, req.owner, limit)
                    );
                    (Some(alive), created)
                };
                let created = match created {
                    // Refused whole: nothing was created.
                    Err(e) if is_lease_not_found(&e) => {
                        cleanup.disarm();
                        return Ok(Err(Retry::SpareEnded));
                    }
                    other => other?,
                };
                let valid = match alive {
                    Some(Ok(true)) => validity_deadline(sent, ttl),
                    // It ended after the put: the key went with it.
                    Some(Ok(false)) => {
                        cleanup.run_now().await;
                        return Ok(Err(Retry::SpareEnded));
                    }
                    // Fresh: it lives as long as it was known to, nearly
                    // its whole ttl.
                    None => spare.valid_until,
                    // Not renewed: a waiting key could outlive it; start
                    // again with a new lease.
                    Some(Err(e)) => {
                        tracing::debug!(backend = NAME, error = %e, "renewing a spare lease failed");
                        cleanup.run_now().await;
                        return Ok(Err(Retry::SpareEnded));
                    }
                };
                (valid, created)
            }
        };
        let valid = Mutex::new(valid_from_grant);
        if owner_rev != Some(my_rev) {
            if req.deadline == Deadline::Now {
                let left = Spare {
                    id: lease,
                    valid_until: *lock(&valid),
                };
                self.step_back(cleanup, &key, my_rev, left, ttl, limit)
                    .await;
                return Ok(Ok(None));
            }
            let turn = self
                .wait_turn(req, lease, &range, &key, my_rev, &valid)
                .await?;
            match turn {
                Turn::Mine => {}
                Turn::Deadline => {
                    let left = Spare {
                        id: lease,
                        valid_until: *lock(&valid),
                    };
                    self.step_back(cleanup, &key, my_rev, left, ttl, limit)
                        .await;
                    return Ok(Ok(None));
                }
                Turn::Gone(why) => {
                    cleanup.run_now().await;
                    return Ok(Err(Retry::LostPlace(why)));
                }
            }
        }
        cleanup.disarm();
        let fence = u64::try_from(my_rev).map_err(|_| {
            Error::backend_error(NAME, format!("the server gave create revision {my_rev}"))
        })?;
        let valid_until = *lock(&valid);
        Ok(Ok(Some(Grant {
            lease: Box::new(EtcdLease {
                backend: self.clone(),
                name: name.to_owned(),
                key,
                lease,
                rev: my_rev,
                ttl,
                valid_until: Mutex::new(valid_until),
                finished: AtomicBool::new(false),
            }),
            fence: Some(fence),
            valid_until,
        })))
    }
}

/// Why an attempt must be made again, with a new lease.
enum Retry {
    /// The waiting lease or key vanished.
    LostPlace(&'static str),
    /// The spare lease taken had ended on the server.
    SpareEnded,
}

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, LeaseKind::Ttl)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: the lease id (a spare one, or a new one) is chosen
    /// before the first request is sent, and a dropped acquisition revokes
    /// that lease in the background, which deletes its key whether it was
    /// waiting or had just been granted.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let ttl_secs = whole_seconds(req.ttl);
        let margin = self.op_timeout(req.ttl);
        let mut spare = self.inner.spares.take(ttl_secs, Instant::now(), margin);
        let mut lease = spare.map_or_else(|| lease_id_of(req.owner), |s| s.id);
        loop {
            match self.attempt(&req, lease, spare).await? {
                Ok(grant) => return Ok(grant),
                Err(Retry::LostPlace(why)) => tracing::warn!(
                    backend = NAME,
                    name = req.name,
                    reason = why,
                    "a waiting acquisition lost its place; queueing again with a new lease"
                ),
                Err(Retry::SpareEnded) => tracing::debug!(
                    backend = NAME,
                    name = req.name,
                    "a spare lease had ended; granting a new one"
                ),
            }
            spare = None;
            lease = lease_id_of(OwnerToken::random());
        }
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let range = range_of(&self.inner.prefix, name);
        let mut kv = self.inner.client.kv_client();
        // The holder's key with its value, and the number of keys: one
        // read, which fetches no waiter's value.
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let count = GetOptions::new().with_prefix().with_count_only();
        let txn = Txn::new().and_then([
            TxnOp::get(range.clone(), Some(first)),
            TxnOp::get(range.clone(), Some(count)),
        ]);
        let resp = self
            .request(
                self.inner.request_timeout,
                "reading the lock keys",
                false,
                kv.txn(txn),
            )
            .await?;
        let (mut holder, mut keys, mut lease) = (None, 0usize, None);
        for (i, op) in resp.op_responses().iter().enumerate() {
            let etcd_client::TxnOpResponse::Get(g) = op else {
                continue;
            };
            if i == 0 {
                holder = g.kvs().first().map(|kv| {
                    let stored = String::from_utf8_lossy(kv.value()).into_owned();
                    // Our plain lock's value is its owner token behind the
                    // mark; another client's key (etcdctl lock) is named by
                    // its key, and a candidate's value is its value.
                    let (owner, value) = match stored.strip_prefix(OWNER_MARK) {
                        Some(token) => (Some(token.to_owned()), None),
                        None => (
                            String::from_utf8_lossy(kv.key())
                                .strip_prefix(range.as_str())
                                .map(str::to_owned),
                            Some(stored).filter(|v| !v.is_empty()),
                        ),
                    };
                    HolderInfo::new(owner, u64::try_from(kv.create_revision()).ok(), None)
                        .with_value(value)
                });
                lease = g.kvs().first().map(etcd_client::KeyValue::lease);
            } else {
                keys = usize::try_from(g.count()).unwrap_or(usize::MAX);
            }
        }
        // The holder's lease tells how long it lives without renewal.
        if let (Some(h), Some(id)) = (holder.as_mut(), lease.filter(|id| *id != 0)) {
            let mut leases = self.inner.client.lease_client();
            let ttl = self
                .request(
                    self.inner.request_timeout,
                    "reading the holder's lease",
                    false,
                    leases.time_to_live(id, None),
                )
                .await?;
            h.ttl_remaining = u64::try_from(ttl.ttl()).ok().map(Duration::from_secs);
        }
        Ok(Some(LockInfo::new(holder, Some(keys.saturating_sub(1)))))
    }

    /// The names with a key under the prefix (holders and waiters), read in
    /// one range request of keys only (two for the prefixes `.` and `..`,
    /// whose own segment is escaped while their longer names' are not).
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let root = if self.inner.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.inner.prefix)
        };
        // Character by character, as in a longer name; and the name's own
        // segment where it differs (`.`, `..`).
        let longer = lockcore::name::encode_segment(&format!("{prefix}x")).into_owned();
        let by_chars = longer.strip_suffix('x').unwrap_or(&longer).to_owned();
        let whole = lockcore::name::encode_segment(prefix).into_owned();
        let mut starts = vec![format!("{root}{by_chars}")];
        if whole != by_chars {
            starts.push(format!("{root}{whole}/"));
        }
        let asked = limit.saturating_add(1).saturating_mul(8);
        let mut names = Vec::new();
        let mut complete = true;
        for start in starts {
            let mut kv = self.inner.client.kv_client();
            let opts = GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(i64::try_from(asked).unwrap_or(i64::MAX));
            let resp = self
                .request(
                    self.inner.request_timeout,
                    "listing the lock keys",
                    false,
                    kv.get(start, Some(opts)),
                )
                .await?;
            complete &= !resp.more();
            names.extend(resp.kvs().iter().filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key());
                let seg = key.strip_prefix(root.as_str())?.split_once('/')?.0;
                lockcore::name::decode_segment(seg).filter(|n| n.starts_with(prefix))
            }));
        }
        names.sort();
        names.dedup();
        let mut listing = Listing::bounded(names, limit);
        listing.complete &= complete;
        Ok(Some(listing))
    }
}
