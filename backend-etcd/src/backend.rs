//! The backend: leases, lock keys ordered by create revision, and waiters
//! that watch only their predecessor.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaseGrantOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType,
    WatchOptions,
};
use lockcore::backend::validity_deadline;
use lockcore::cleanup::{spawn_cleanup, CleanupOnDrop};
use lockcore::name::encode_segment;
use lockcore::retry::Backoff;
use lockcore::{
    AcquireRequest, Backend, BackendLease, Capabilities, Deadline, Error, ErrorKind, Fencing,
    Grant, HolderInfo, LeaseKind, LockInfo, OwnerToken, Released, Renewal, Result,
};

use crate::config::EtcdConfig;
use crate::BACKEND;

/// An etcd lock backend. Cheap to clone (clones share the connection).
///
/// Each acquisition gets its own etcd lease (see the crate docs for why),
/// and its lock key `<prefix>/<encoded name>/<lease id in hex>` is attached
/// to it.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    prefix: String,
    request_timeout: Duration,
    servers: String,
    faults: Faults,
    counters: Arc<EtcdCounters>,
}

/// The live counters of one backend, for tests and monitoring: a handle
/// that outlives the backend (see [`EtcdBackend::counters`]).
#[derive(Debug, Default)]
pub struct EtcdCounters {
    predecessor_events: AtomicU64,
}

/// A snapshot of a backend's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct EtcdStats {
    /// Deletions of their predecessor's key seen by waiters' watches. With
    /// no herd, one hand-off costs one, however many wait.
    pub predecessor_events: u64,
}

impl EtcdCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> EtcdStats {
        EtcdStats {
            predecessor_events: self.predecessor_events.load(Ordering::Relaxed),
        }
    }
}

/// Fault-injection switches, for tests.
#[derive(Default)]
struct Faults {
    renewals_paused: AtomicBool,
    watch_delay_ms: AtomicU64,
    compacted_watches: AtomicU64,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("servers", &self.inner.servers)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// The key range of lock `name` under `prefix`: every key of the lock
/// (holder and waiters) starts with it.
pub(crate) fn range_of(prefix: &str, name: &str) -> String {
    let seg = encode_segment(name);
    if prefix.is_empty() {
        format!("{seg}/")
    } else {
        format!("{prefix}/{seg}/")
    }
}

/// A positive, non-zero lease id from a random owner token.
fn lease_id_of(owner: OwnerToken) -> i64 {
    let id = (owner.as_u128() as u64 >> 1) as i64;
    id.max(1)
}

/// The whole seconds an etcd lease needs to live at least `ttl`.
fn ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s).unwrap_or(i64::MAX)
}

fn is_transient(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Indeterminate)
}

/// How a wait ended.
enum Turn {
    /// Our key is the oldest: the lock is ours.
    Mine,
    /// The caller's deadline passed.
    Deadline,
    /// The waiting lease or key vanished; start over with a new lease.
    Gone(&'static str),
}

enum WatchEnd {
    Deleted,
    Recheck,
}

impl EtcdBackend {
    /// Connects to the members of `cfg` and checks that one answers.
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
            opts = opts.with_user(user.clone(), cfg.password.clone().unwrap_or_default());
        }
        #[cfg(feature = "tls")]
        if cfg.tls {
            // The system's roots, plus the CA file if one is given.
            let mut tls = etcd_client::TlsOptions::new().with_enabled_roots();
            if let Some(ca) = &cfg.ca_file {
                let pem = std::fs::read(ca).map_err(|e| {
                    Error::invalid_config(BACKEND, format!("reading the CA file {ca:?}: {e}"))
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
                        BACKEND,
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
                faults: Faults::default(),
                counters: Arc::default(),
            }),
        };
        // One read, so that a wrong address or credentials fail here.
        let mut kv = backend.inner.client.kv_client();
        let probe = GetOptions::new().with_count_only();
        backend
            .timed(
                cfg.request_timeout,
                kv.get(format!("{}/", cfg.prefix), Some(probe)),
                "checking the connection",
                None,
                false,
            )
            .await?;
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

    /// Fault injection for tests: while paused, lease renewals hang instead
    /// of reaching the server, as if the holding process were stalled (a GC
    /// pause, a stopped VM). The lease then ends on the server after its ttl.
    #[doc(hidden)]
    pub fn pause_renewals(&self, paused: bool) {
        self.inner
            .faults
            .renewals_paused
            .store(paused, Ordering::SeqCst);
    }

    /// Fault injection for tests: waiters sleep this long between reading
    /// their predecessor and watching it, which widens the window in which a
    /// compaction can overtake the watch's start revision.
    #[doc(hidden)]
    pub fn delay_watches(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.inner.faults.watch_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// How many predecessor watches found their start revision compacted
    /// (and were re-established from a fresh read), for tests.
    #[doc(hidden)]
    pub fn compacted_watches(&self) -> u64 {
        self.inner.faults.compacted_watches.load(Ordering::SeqCst)
    }

    /// The timeout of one request for a lease of `ttl`: the configured one,
    /// capped at half the ttl (at least 1 s).
    fn op_timeout(&self, ttl: Duration) -> Duration {
        self.inner
            .request_timeout
            .min((ttl / 2).max(Duration::from_secs(1)))
    }

    async fn timed<T>(
        &self,
        limit: Duration,
        fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
        what: &str,
        name: Option<&str>,
        mutating: bool,
    ) -> Result<T> {
        let err = match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => map_err(e, what, &self.inner.servers, mutating),
            Err(_) => {
                let kind = if mutating {
                    ErrorKind::Indeterminate
                } else {
                    ErrorKind::Unavailable
                };
                Error::new(
                    kind,
                    BACKEND,
                    format!(
                        "{what} on {}: no answer within {limit:?}",
                        self.inner.servers
                    ),
                )
            }
        };
        Err(match name {
            Some(n) => err.with_name(n),
            None => err,
        })
    }

    /// One keepalive of `lease`: `Ok(true)` renewed, `Ok(false)` the lease is
    /// gone (the server answered ttl 0).
    async fn keep_alive_once(&self, lease: i64, limit: Duration, name: &str) -> Result<bool> {
        let mut lc = self.inner.client.lease_client();
        match tokio::time::timeout(limit, lc.keep_alive(lease)).await {
            // Dropping the keeper and its stream ends that keepalive stream.
            Ok(Ok(_)) => Ok(true),
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => Ok(false),
            Ok(Err(e)) => {
                Err(map_err(e, "renewing the lease", &self.inner.servers, false).with_name(name))
            }
            Err(_) => Err(Error::unavailable(
                BACKEND,
                format!(
                    "renewing the lease on {}: no answer within {limit:?}",
                    self.inner.servers
                ),
            )
            .with_name(name)),
        }
    }

    /// Keeps a waiting acquisition's lease alive at ttl/3; returns only when
    /// the lease is gone or could not be renewed before it ran out.
    async fn keep_waiting_lease_alive(
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
            match self.keep_alive_once(lease, limit, name).await {
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
                            BACKEND,
                            format!("the lease of a waiting acquisition could not be renewed before it ran out: {e}"),
                        )
                        .with_name(name)
                        .with_source(e));
                    }
                    tracing::debug!(backend = BACKEND, name, error = %e, "renewing a waiting lease failed; retrying");
                    next = Instant::now() + backoff.next_delay();
                }
            }
        }
    }

    /// Waits until no key older than ours is left under `range`, watching
    /// only the one just before ours.
    async fn wait_predecessors(
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
                .timed(limit, kv.txn(txn), "reading the waiters", Some(name), false)
                .await;
            let resp = match read {
                Ok(r) => r,
                Err(e) if is_transient(&e) && Instant::now() < *lock(valid) => {
                    tracing::debug!(backend = BACKEND, name, error = %e, "reading the waiters failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let rev = resp.header().map_or(0, |h| h.revision());
            let ops = resp.op_responses();
            let mine = first_kv(ops.get(1)).map(|kv| kv.1);
            if mine != Some(my_rev) {
                return Ok(Turn::Gone("the waiting key was deleted"));
            }
            let Some((pred_key, _)) = first_kv(ops.first()) else {
                return Ok(Turn::Mine);
            };
            let delay = self.inner.faults.watch_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            match self.watch_delete(pred_key, rev + 1, limit, name).await {
                Ok(_) => backoff.reset(),
                // Watching only reads: whatever broke it, read again while
                // the waiting lease lives (but not with bad credentials).
                Err(e) if e.kind() != ErrorKind::InvalidConfig && Instant::now() < *lock(valid) => {
                    tracing::debug!(backend = BACKEND, name, error = %e, "watching the predecessor failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Watches `key` from revision `from` until it is deleted, or until the
    /// watch ends for another reason (compaction, cancel, stream end), after
    /// which the caller reads again.
    async fn watch_delete(
        &self,
        key: Vec<u8>,
        from: i64,
        limit: Duration,
        name: &str,
    ) -> Result<WatchEnd> {
        let mut wc = self.inner.client.watch_client();
        let opts = WatchOptions::new()
            .with_start_revision(from)
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = self
            .timed(
                limit,
                wc.watch(key, Some(opts)),
                "watching the predecessor",
                Some(name),
                false,
            )
            .await?;
        loop {
            let msg = stream.message().await.map_err(|e| {
                map_err(e, "watching the predecessor", &self.inner.servers, false).with_name(name)
            })?;
            let Some(resp) = msg else {
                return Ok(WatchEnd::Recheck);
            };
            if resp.compact_revision() > 0 {
                self.inner
                    .faults
                    .compacted_watches
                    .fetch_add(1, Ordering::SeqCst);
                tracing::debug!(
                    backend = BACKEND,
                    name,
                    from,
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

    /// One try with one lease: create the key, then wait for older keys to go.
    async fn attempt(
        &self,
        req: &AcquireRequest<'_>,
        lease: i64,
    ) -> Result<std::result::Result<Option<Grant>, &'static str>> {
        let name = req.name;
        let ttl = req.ttl;
        let limit = self.op_timeout(ttl);
        let range = range_of(&self.inner.prefix, name);
        let key = format!("{range}{lease:x}");
        // Armed before the grant is sent: the lease id is chosen here, so a
        // dropped acquire revokes it (and with it the key) whatever the
        // server had applied.
        let cleanup = CleanupOnDrop::new(
            "revoke the lease of a dropped etcd acquisition",
            revoke(self.clone(), lease, limit),
        );
        let mut lc = self.inner.client.lease_client();
        let sent = Instant::now();
        let granted = self
            .timed(
                limit,
                lc.grant(ttl_secs(ttl), Some(LeaseGrantOptions::new().with_id(lease))),
                "granting a lease",
                Some(name),
                false,
            )
            .await?;
        if !granted.error().is_empty() {
            return Err(Error::backend_error(
                BACKEND,
                format!("granting a lease: {}", granted.error()),
            )
            .with_name(name));
        }
        let valid = Mutex::new(validity_deadline(sent, ttl));
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(range.clone(), Some(first.clone())),
            ])
            .or_else([
                TxnOp::get(key.clone(), None),
                TxnOp::get(range.clone(), Some(first)),
            ]);
        let mut kv = self.inner.client.kv_client();
        let resp = self
            .timed(
                limit,
                kv.txn(txn),
                "creating the lock key",
                Some(name),
                true,
            )
            .await?;
        let ops = resp.op_responses();
        let my_rev = if resp.succeeded() {
            header_rev(&resp)
        } else {
            first_kv(ops.first()).map_or(0, |kv| kv.1)
        };
        let owner_rev = first_kv(ops.get(1)).map(|kv| kv.1);
        if owner_rev != Some(my_rev) {
            if req.deadline == Deadline::Now {
                cleanup.run_now().await;
                return Ok(Ok(None));
            }
            let turn = {
                let waiting = self.wait_predecessors(name, &range, &key, my_rev, ttl, &valid);
                let keep = self.keep_waiting_lease_alive(lease, ttl, &valid, name);
                let until = async {
                    match req.deadline.instant() {
                        Some(t) => tokio::time::sleep_until(t.into()).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    t = waiting => t?,
                    t = keep => t?,
                    () = until => Turn::Deadline,
                }
            };
            match turn {
                Turn::Mine => {}
                Turn::Deadline => {
                    cleanup.run_now().await;
                    return Ok(Ok(None));
                }
                Turn::Gone(why) => {
                    cleanup.run_now().await;
                    return Ok(Err(why));
                }
            }
        }
        cleanup.disarm();
        let fence = u64::try_from(my_rev).map_err(|_| {
            Error::backend_error(BACKEND, format!("the server gave create revision {my_rev}"))
                .with_name(name)
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
            }),
            fence: Some(fence),
            valid_until,
        })))
    }
}

fn lock<T: Copy>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn header_rev(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// The first key of a range response in a transaction, with its create
/// revision.
fn first_kv(op: Option<&TxnOpResponse>) -> Option<(Vec<u8>, i64)> {
    match op {
        Some(TxnOpResponse::Get(g)) => g
            .kvs()
            .first()
            .map(|kv| (kv.key().to_vec(), kv.create_revision())),
        _ => None,
    }
}

/// Revokes `lease` (deleting its key), logging failures: the lease then ends
/// by its ttl.
async fn revoke(backend: EtcdBackend, lease: i64, limit: Duration) {
    let mut lc = backend.inner.client.lease_client();
    match tokio::time::timeout(limit, lc.revoke(lease)).await {
        Ok(Ok(_)) => {}
        Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.code() == tonic::Code::NotFound => {}
        Ok(Err(e)) => {
            tracing::debug!(backend = BACKEND, lease, error = %e, "revoking a lease failed; it ends by its ttl")
        }
        Err(_) => {
            tracing::debug!(
                backend = BACKEND,
                lease,
                "revoking a lease timed out; it ends by its ttl"
            )
        }
    }
}

/// Maps a client error to the lockcore kind. `mutating`: the request may
/// have created state, so a cut-off one is `Indeterminate`.
pub(crate) fn map_err(e: etcd_client::Error, what: &str, servers: &str, mutating: bool) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    let cut_off = if mutating {
        ErrorKind::Indeterminate
    } else {
        ErrorKind::Unavailable
    };
    let (kind, hint) = match &e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                (cut_off, "is the cluster up and does it have a leader?")
            }
            // tonic reports a broken connection (an h2 or I/O error) as
            // Unknown or Internal, with the transport error as source.
            Code::Unknown | Code::Internal
                if std::error::Error::source(s).is_some()
                    || ["h2 protocol", "transport", "connection", "leader"]
                        .iter()
                        .any(|w| s.message().contains(w)) =>
            {
                (cut_off, "is the cluster up and does it have a leader?")
            }
            Code::Unauthenticated | Code::PermissionDenied => (
                ErrorKind::InvalidConfig,
                "check the user, password and the role's permissions on the key prefix",
            ),
            _ => (ErrorKind::Backend, "see the source error"),
        },
        E::TransportError(_) | E::IoError(_) => (cut_off, "is an etcd member listening there?"),
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) | E::EndpointError(_) => {
            (ErrorKind::InvalidConfig, "check the endpoints and options")
        }
        _ => (ErrorKind::Backend, "see the source error"),
    };
    Error::new(kind, BACKEND, format!("{what} on {servers}: {e} ({hint})")).with_source(e)
}

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, LeaseKind::Ttl)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: the lease id is chosen before the grant is sent, and a
    /// dropped acquisition revokes that lease in the background, which
    /// deletes its key whether it was waiting or had just been granted.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let mut lease = lease_id_of(req.owner);
        loop {
            match self.attempt(&req, lease).await? {
                Ok(grant) => return Ok(grant),
                Err(why) => {
                    tracing::warn!(
                        backend = BACKEND,
                        name = req.name,
                        reason = why,
                        "a waiting acquisition lost its place; queueing again with a new lease"
                    );
                    lease = lease_id_of(OwnerToken::random());
                }
            }
        }
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let range = range_of(&self.inner.prefix, name);
        let mut kv = self.inner.client.kv_client();
        let opts = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        let resp = self
            .timed(
                self.inner.request_timeout,
                kv.get(range.clone(), Some(opts)),
                "reading the lock keys",
                Some(name),
                false,
            )
            .await?;
        let kvs = resp.kvs();
        let holder = kvs.first().map(|kv| {
            let owner = String::from_utf8_lossy(kv.key())
                .strip_prefix(range.as_str())
                .map(str::to_owned);
            HolderInfo::new(owner, u64::try_from(kv.create_revision()).ok(), None)
        });
        Ok(Some(LockInfo::new(
            holder,
            Some(kvs.len().saturating_sub(1)),
        )))
    }
}

/// One granted lock: its key, its lease and the key's create revision.
struct EtcdLease {
    backend: EtcdBackend,
    name: String,
    key: String,
    lease: i64,
    rev: i64,
    ttl: Duration,
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.key)
            .field("lease", &format_args!("{:x}", self.lease))
            .field("revision", &self.rev)
            .finish()
    }
}

#[async_trait]
impl BackendLease for EtcdLease {
    /// One keepalive of the lease and one read of the key, in parallel:
    /// `Lost` when the lease is gone (ttl 0) or the key was deleted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        if ttl > self.ttl {
            return Err(Error::invalid_config(
                BACKEND,
                format!(
                    "an etcd lease keeps the ttl it was granted with ({:?}); acquire with the longer ttl {ttl:?} instead",
                    self.ttl
                ),
            )
            .with_name(self.name.clone()));
        }
        if self
            .backend
            .inner
            .faults
            .renewals_paused
            .load(Ordering::SeqCst)
        {
            std::future::pending::<()>().await;
        }
        let b = &self.backend;
        let limit = b.op_timeout(self.ttl);
        let sent = Instant::now();
        let mut kv = b.inner.client.kv_client();
        let (alive, read) = tokio::join!(
            b.keep_alive_once(self.lease, limit, &self.name),
            b.timed(
                limit,
                kv.get(self.key.clone(), Some(GetOptions::new().with_keys_only())),
                "reading the lock key",
                Some(&self.name),
                false,
            )
        );
        if !alive? {
            return Ok(Renewal::Lost);
        }
        let still = read?
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == self.rev);
        if !still {
            return Ok(Renewal::Lost);
        }
        Ok(Renewal::Renewed {
            valid_until: validity_deadline(sent, ttl),
        })
    }

    /// Deletes the key if it is still this lock's (compare on its create
    /// revision), then revokes the lease in the background.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the key; the lease then
    /// ends by its ttl as if the holder had died.
    async fn release(&self) -> Result<Released> {
        let b = &self.backend;
        let limit = b.op_timeout(self.ttl);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let mut kv = b.inner.client.kv_client();
        // The delete is compare-guarded, so retrying it is safe; retry a
        // transient failure (no leader during an election) for a while.
        // A request that reached a member while its leader died waits there
        // for the next leader, so each try gets a third of the time.
        let give_up = Instant::now() + limit;
        let per_try = (limit / 3).max(Duration::from_millis(300));
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        let res = loop {
            let res = b
                .timed(
                    per_try,
                    kv.txn(txn.clone()),
                    "deleting the lock key",
                    Some(&self.name),
                    false,
                )
                .await;
            match res {
                Err(e) if is_transient(&e) => {
                    let delay = backoff.next_delay();
                    if Instant::now() + delay >= give_up {
                        break Err(e);
                    }
                    tracing::debug!(backend = BACKEND, name = %self.name, error = %e, "deleting the lock key failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                other => break other,
            }
        };
        spawn_cleanup(
            "revoke the lease of a released etcd lock",
            revoke(b.clone(), self.lease, limit),
        );
        Ok(if res?.succeeded() {
            Released::Released
        } else {
            Released::NotHeld
        })
    }

    /// Nothing to stop: after the grant this lease is renewed only by the
    /// guard's watchdog (which `abandon` stops), never in the background.
    /// The key stays on the server until the lease's ttl runs out, exactly
    /// as when the holding process dies; the handle's other locks, each on
    /// its own lease, are not affected.
    fn abandon(&self) {
        tracing::debug!(backend = BACKEND, key = %self.key, "lease abandoned; it ends by its ttl");
    }
}
