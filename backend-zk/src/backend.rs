//! The backend: acquire by the ephemeral-sequential recipe, the lease, inspection.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::cleanup::{spawn_cleanup, CleanupOnDrop};
use lockcore::name::encode_segment;
use lockcore::{
    AcquireRequest, Backend, BackendLease, Capabilities, Deadline, Error, ErrorKind, Fencing,
    Grant, HolderInfo, LeaseKind, LockInfo, OwnerToken, Released, Renewal, Result,
};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::config::{AclMode, ZkConfig, NAME};
use crate::recipe;
use crate::session::{is_connection_error, is_session_end, map_err, Session};

/// How often a create is retried when a container parent is reaped under it.
const MAX_PARENT_RETRIES: usize = 8;

/// The live counters of one backend, for tests and monitoring: a handle
/// that outlives the backend (see [`ZkBackend::counters`]).
#[derive(Debug, Default)]
pub struct ZkCounters {
    predecessor_events: AtomicU64,
    sessions_opened: AtomicU64,
}

impl ZkCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> ZkStats {
        ZkStats {
            predecessor_events: self.predecessor_events.load(Ordering::Relaxed),
            sessions_opened: self.sessions_opened.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of a backend's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ZkStats {
    /// Watch notifications received by waiters on their predecessor node.
    /// With no herd, one handoff costs one notification however many wait.
    pub predecessor_events: u64,
    /// ZooKeeper sessions this backend opened.
    pub sessions_opened: u64,
}

/// How many sessions are kept open with no lease on them (the most recently
/// used); the others close when their last lease goes.
const KEEP_IDLE: usize = 4;

/// A ZooKeeper lock backend (see the crate docs for the layout).
///
/// A lock's lease is a session whose timeout is the lock's ttl, rounded up
/// to whole seconds: locks whose ttls round alike share one session. A
/// session lives while a lease is on it; besides those, the few most
/// recently used stay open for the next acquisitions.
pub struct ZkBackend {
    cfg: Arc<ZkConfig>,
    acls: Arc<Vec<zk::Acl>>,
    sessions: tokio::sync::Mutex<Sessions>,
    counters: Arc<ZkCounters>,
}

/// The open sessions, by timeout in whole seconds.
#[derive(Default)]
struct Sessions {
    by_secs: HashMap<u64, Weak<Session>>,
    /// The most recently used, kept open while idle (most recent last).
    recent: VecDeque<Arc<Session>>,
}

impl Sessions {
    fn live(&self, secs: u64) -> Option<Arc<Session>> {
        self.by_secs
            .get(&secs)
            .and_then(Weak::upgrade)
            .filter(|s| !s.is_dead())
    }

    fn touch(&mut self, session: &Arc<Session>) {
        self.recent
            .retain(|s| !Arc::ptr_eq(s, session) && !s.is_dead());
        self.recent.push_back(session.clone());
        while self.recent.len() > KEEP_IDLE {
            self.recent.pop_front();
        }
        self.by_secs.retain(|_, w| w.strong_count() > 0);
    }
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn acls_of(mode: AclMode) -> Vec<zk::Acl> {
    let creator = zk::Acl::new(zk::Permission::ALL, zk::AuthId::authed());
    let anyone_all = zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone());
    let anyone_read = zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone());
    match mode {
        AclMode::Open => vec![anyone_all],
        AclMode::Creator => vec![creator],
        AclMode::CreatorRead => vec![creator, anyone_read],
    }
}

/// The whole seconds of `ttl`, rounded up: the session timeout that keeps it.
fn session_secs(ttl: Duration) -> u64 {
    ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)
}

impl ZkBackend {
    /// Opens a backend and its first session (with the default ttl's
    /// timeout), so that an unreachable ensemble fails here with
    /// [`Unavailable`](lockcore::ErrorKind::Unavailable).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state (a half-opened session expires).
    pub async fn connect(cfg: ZkConfig) -> Result<Self> {
        let backend = ZkBackend {
            acls: Arc::new(acls_of(cfg.acl)),
            cfg: Arc::new(cfg),
            sessions: tokio::sync::Mutex::default(),
            counters: Arc::default(),
        };
        backend.session(lockcore::DEFAULT_TTL).await?;
        Ok(backend)
    }

    /// The settings.
    pub fn config(&self) -> &ZkConfig {
        &self.cfg
    }

    /// The counters so far.
    pub fn stats(&self) -> ZkStats {
        self.counters.snapshot()
    }

    /// A handle on this backend's counters that stays readable after the
    /// backend is gone.
    pub fn counters(&self) -> Arc<ZkCounters> {
        self.counters.clone()
    }

    /// The parent node of lock `name` (full path, chroot included).
    pub fn lock_parent(&self, name: &str) -> String {
        lock_parent(&self.cfg, name)
    }

    /// The session for `ttl`, opening one if there is none alive.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let secs = session_secs(ttl);
        let mut sessions = self.sessions.lock().await;
        if let Some(s) = sessions.live(secs) {
            sessions.touch(&s);
            return Ok(s);
        }
        let s = Session::connect(&self.cfg, Duration::from_secs(secs)).await?;
        self.counters
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        sessions.by_secs.insert(secs, Arc::downgrade(&s));
        sessions.touch(&s);
        Ok(s)
    }

    /// Creates our ephemeral sequential node; returns its name and czxid.
    /// A creation cut off by a lost connection may have applied: it is
    /// looked for by our uuid before it is sent again.
    async fn create_node(
        &self,
        session: &Session,
        parent: &str,
        prefix: &str,
        owner: OwnerToken,
    ) -> Result<(String, i64)> {
        let full = format!("{parent}/{prefix}");
        let data = owner.to_string();
        let acls = zk::Acls::new(&self.acls);
        let opts = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let creating = || format!("creating a lock node under {parent}");
        let mut parent_retries = 0;
        let mut cut_off = 0;
        loop {
            let created = session
                .once(|c| {
                    let (full, data, opts) = (&full, data.as_bytes(), &opts);
                    async move { c.create(full, data, opts).await }
                })
                .await;
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{prefix}{seq}");
                    let czxid = if stat.czxid > 0 {
                        stat.czxid
                    } else {
                        // Servers before 3.5 give no stat on create.
                        czxid_of(session, &format!("{parent}/{name}"))
                            .await?
                            .ok_or_else(|| vanished(parent))?
                    };
                    return Ok((name, czxid));
                }
                Err(zk::Error::NoNode) if parent_retries < MAX_PARENT_RETRIES => {
                    parent_retries += 1;
                    let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                    let made = session
                        .call(|c| {
                            let dir = &dir;
                            async move { c.mkdir(parent, dir).await }
                        })
                        .await;
                    match made {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => {
                            return Err(map_err(
                                e,
                                format!("creating the lock parent {parent}"),
                                false,
                            ))
                        }
                    }
                }
                Err(e) if is_connection_error(&e) && cut_off < MAX_CUT_OFF => {
                    cut_off += 1;
                    session
                        .reconnected()
                        .await
                        .map_err(|e| map_err(e, creating(), true))?;
                    let children = list(session, parent)
                        .await
                        .map_err(|e| map_err_kind(e, ErrorKind::Indeterminate))?;
                    if let Some(name) = children.into_iter().find(|c| c.starts_with(prefix)) {
                        if let Some(czxid) = czxid_of(session, &format!("{parent}/{name}")).await? {
                            return Ok((name, czxid));
                        }
                    }
                }
                Err(e) => return Err(map_err(e, creating(), true)),
            }
        }
    }
}

/// How often a cut-off creation is looked for and sent again.
const MAX_CUT_OFF: usize = 3;

/// `e` with its kind replaced (a failed read after a cut-off creation leaves
/// the creation's outcome unknown).
fn map_err_kind(e: Error, kind: ErrorKind) -> Error {
    if matches!(e.kind(), ErrorKind::Unavailable) {
        Error::new(kind, NAME, e.message().to_owned())
    } else {
        e
    }
}

/// The czxid of `path`, or `None` when it does not exist.
async fn czxid_of(session: &Session, path: &str) -> Result<Option<i64>> {
    session
        .call(|c| async move { c.check_stat(path).await })
        .await
        .map(|stat| stat.map(|s| s.czxid))
        .map_err(|e| map_err(e, format!("reading {path}"), false))
}

/// The parent node of lock `name` under `cfg`.
pub(crate) fn lock_parent(cfg: &ZkConfig, name: &str) -> String {
    format!("{}/{}", cfg.base(), encode_segment(name))
}

/// A lease lives by its session: a ttl above the negotiated session timeout
/// (the server's `maxSessionTimeout`) cannot be kept.
fn check_ttl(session: &Session, ttl: Duration) -> Result<()> {
    if ttl > session.timeout {
        return Err(Error::invalid_config(
            NAME,
            format!(
                "ttl {ttl:?} is above the session timeout the server grants ({:?}, its maxSessionTimeout): a ZooKeeper lease lives by its session, so use a ttl up to that",
                session.timeout
            ),
        ));
    }
    Ok(())
}

fn vanished(parent: &str) -> Error {
    Error::unavailable(
        NAME,
        format!("our lock node under {parent} vanished while acquiring (session expired, or deleted by an operator)"),
    )
}

/// Children of `parent`; `NoNode` is empty.
async fn list(session: &Session, parent: &str) -> Result<Vec<String>> {
    match session
        .call(|c| async move { c.list_children(parent).await })
        .await
    {
        Ok(c) => Ok(c),
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(map_err(e, format!("listing {parent}"), false)),
    }
}

/// Deletes `path` (ours by its uuid), retried across connection losses.
/// Returns whether it was there (a deletion cut off by a connection loss,
/// then found gone, counts as done by us).
async fn delete_node(session: &Session, path: &str) -> Result<bool> {
    let mut tries = 0u32;
    let r = session
        .call(|c| {
            tries += 1;
            async move { c.delete(path, None).await }
        })
        .await;
    match r {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode) => Ok(tries > 1),
        Err(e) => Err(map_err(e, format!("deleting {path}"), true)),
    }
}

/// Deletes every child of `parent` that starts with `prefix` (our uuid).
async fn delete_ours(session: Arc<Session>, parent: String, prefix: String) {
    let children = match list(&session, &parent).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, %parent, "cleanup could not list; the node ends with the session");
            return;
        }
    };
    for c in children.into_iter().filter(|c| c.starts_with(&prefix)) {
        if let Err(e) = delete_node(&session, &format!("{parent}/{c}")).await {
            tracing::debug!(error = %e, node = %c, "cleanup could not delete; the node ends with the session");
        }
    }
}

/// Runs `fut` in a task that is aborted when the handle is dropped (so a
/// panic or a dropped sender inside the client cannot reach the caller).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[async_trait]
impl Backend for ZkBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, LeaseKind::Session)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
    }

    /// Creates `_c_<uuid>-lock-<seq>` under the name's parent, then waits
    /// for the predecessor node to go, watching only it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped acquisition deletes its node in the background
    /// (found by its uuid, also when the create was cut off by a connection
    /// loss).
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        // The validity of a lease granted at the first look is measured from
        // here: before the session and the node existed, so conservative.
        let started = Instant::now();
        let session = self.session(req.ttl).await?;
        check_ttl(&session, req.ttl)?;
        let parent = self.lock_parent(req.name);
        let prefix = recipe::node_prefix(req.owner);
        let cleanup = CleanupOnDrop::new(
            "delete the lock node of a dropped acquisition",
            delete_ours(session.clone(), parent.clone(), prefix.clone()),
        );
        let (node, czxid) = self
            .create_node(&session, &parent, &prefix, req.owner)
            .await?;
        let path = format!("{parent}/{node}");
        let mut first_look = true;
        loop {
            let sent = if std::mem::take(&mut first_look) {
                started
            } else {
                Instant::now()
            };
            let children = list(&session, &parent).await?;
            // A create sent again after a connection loss may have left a twin.
            for twin in children
                .iter()
                .filter(|c| c.starts_with(&prefix) && **c != node)
            {
                let (s, p) = (session.clone(), format!("{parent}/{twin}"));
                spawn_cleanup("delete a twin lock node", async move {
                    let _ = delete_node(&s, &p).await;
                });
            }
            let queue = recipe::contenders(children);
            let Some(pos) = queue.iter().position(|c| c.name == node) else {
                return Err(vanished(&parent));
            };
            if pos == 0 {
                cleanup.disarm();
                let lease = ZkLease::new(session.clone(), path, req.lost.clone());
                return Ok(Some(Grant {
                    lease: Box::new(lease),
                    fence: u64::try_from(czxid).ok(),
                    valid_until: session.valid_until(sent, req.ttl),
                }));
            }
            if req.deadline.passed(Instant::now()) {
                cleanup.run_now().await;
                return Ok(None);
            }
            let pred = format!("{parent}/{}", queue[pos - 1].name);
            let watched = session
                .call(|c| {
                    let pred = pred.as_str();
                    async move { c.check_and_watch_stat(pred).await }
                })
                .await;
            let watcher = match watched {
                Ok((Some(_), w)) => w,
                Ok((None, _)) => continue,
                Err(e) => return Err(map_err(e, format!("watching {pred}"), false)),
            };
            let mut event = AbortOnDrop(tokio::spawn(watcher.changed()));
            let deadline = req.deadline;
            tokio::select! {
                ev = &mut event.0 => {
                    self.counters.predecessor_events.fetch_add(1, Ordering::Relaxed);
                    tracing::trace!(event = ?ev.ok().map(|e| e.event_type), %pred, "predecessor watch fired");
                }
                _ = session.dead() => {
                    return Err(Error::unavailable(NAME, format!(
                        "the ZooKeeper session ended while waiting: {}",
                        session.reason().unwrap_or("closed")
                    )));
                }
                _ = async {
                    match deadline {
                        Deadline::At(t) => tokio::time::sleep_until(t.into()).await,
                        Deadline::Now | Deadline::Never => std::future::pending().await,
                    }
                } => {
                    cleanup.run_now().await;
                    return Ok(None);
                }
            }
        }
    }

    /// The first contender is the holder; the others wait.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        let parent = self.lock_parent(name);
        let queue = recipe::contenders(list(&session, &parent).await?);
        let Some(first) = queue.first() else {
            return Ok(Some(LockInfo::new(None, Some(0))));
        };
        let fence = czxid_of(&session, &format!("{parent}/{}", first.name))
            .await?
            .and_then(|z| u64::try_from(z).ok());
        Ok(Some(LockInfo::new(
            Some(HolderInfo::new(Some(first.name.clone()), fence, None)),
            Some(queue.len() - 1),
        )))
    }
}

/// Flags shared by a lease and its watch task.
#[derive(Debug, Default)]
struct Flags {
    released: AtomicBool,
    abandoned: AtomicBool,
    gone: AtomicBool,
}

/// One held lock: our node on our session.
struct ZkLease {
    session: Arc<Session>,
    path: String,
    flags: Arc<Flags>,
    task: tokio::task::AbortHandle,
}

impl fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.path)
            .field("session", &format_args!("{:#x}", self.session.id))
            .finish_non_exhaustive()
    }
}

impl ZkLease {
    fn new(session: Arc<Session>, path: String, lost: CancellationToken) -> Self {
        let flags = Arc::new(Flags::default());
        let task = tokio::spawn(watch_lease(
            session.clone(),
            path.clone(),
            lost,
            flags.clone(),
        ))
        .abort_handle();
        ZkLease {
            session,
            path,
            flags,
            task,
        }
    }
}

/// Raises the lost signal when the session ends or our node is deleted by
/// someone else; deletes our node when the lease is lost on the client side
/// (validity deadline passed), so the next waiter gets it.
async fn watch_lease(
    session: Arc<Session>,
    path: String,
    lost: CancellationToken,
    flags: Arc<Flags>,
) {
    loop {
        let watched = session
            .call(|c| {
                let path = path.as_str();
                async move { c.check_and_watch_stat(path).await }
            })
            .await;
        let watcher = match watched {
            Ok((Some(_), w)) => Some(w),
            Ok((None, _)) => {
                flags.gone.store(true, Ordering::SeqCst);
                if !flags.released.load(Ordering::SeqCst) {
                    tracing::warn!(node = %path, "our lock node was deleted by someone else");
                    lost.cancel();
                }
                return;
            }
            Err(e) if is_session_end(&e) || session.is_dead() => None,
            Err(_) => {
                // No answer within the request timeout, the session still
                // alive: look again (the monitor ends the session once it
                // has been disconnected for about its timeout).
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(watcher) = watcher else {
            lost.cancel();
            return;
        };
        let mut event = AbortOnDrop(tokio::spawn(watcher.changed()));
        tokio::select! {
            _ = &mut event.0 => continue,
            _ = session.dead() => {
                lost.cancel();
                return;
            }
            _ = lost.cancelled() => {
                if !flags.abandoned.load(Ordering::SeqCst) && !flags.released.load(Ordering::SeqCst) {
                    // Lost on the client's clock: free the name on the server.
                    if let Ok(true) = delete_node(&session, &path).await {
                        tracing::debug!(node = %path, "deleted the node of a lost lease");
                    }
                    flags.gone.store(true, Ordering::SeqCst);
                }
                return;
            }
        }
    }
}

#[async_trait]
impl BackendLease for ZkLease {
    /// Checks that our node still exists on our live session. A `ttl` above
    /// the session timeout is refused with `InvalidConfig` (the session
    /// cannot be lengthened).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        if self.session.is_dead() || self.flags.gone.load(Ordering::SeqCst) {
            return Ok(Renewal::Lost);
        }
        check_ttl(&self.session, ttl)?;
        let sent = Instant::now();
        let stat = self
            .session
            .call(|c| {
                let path = self.path.as_str();
                async move { c.check_stat(path).await }
            })
            .await;
        match stat {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session.id => Ok(Renewal::Renewed {
                valid_until: self.session.valid_until(sent, ttl),
            }),
            Ok(_) => Ok(Renewal::Lost),
            Err(e) if is_session_end(&e) => Ok(Renewal::Lost),
            Err(e) => Err(map_err(
                e,
                format!("checking the lock node {}", self.path),
                false,
            )),
        }
    }

    /// Deletes our node (never another owner's: the path carries our uuid).
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the node; dropping the
    /// lease then deletes it in the background.
    async fn release(&self) -> Result<Released> {
        self.flags.released.store(true, Ordering::SeqCst);
        self.task.abort();
        if self.flags.gone.load(Ordering::SeqCst) {
            return Ok(Released::NotHeld);
        }
        let res = delete_node(&self.session, &self.path).await;
        match res {
            Ok(true) => {
                self.flags.gone.store(true, Ordering::SeqCst);
                Ok(Released::Released)
            }
            Ok(false) => {
                self.flags.gone.store(true, Ordering::SeqCst);
                Ok(Released::NotHeld)
            }
            Err(_) if self.session.is_dead() => {
                // The session ended: its ephemeral node went with it.
                self.flags.gone.store(true, Ordering::SeqCst);
                Ok(Released::NotHeld)
            }
            Err(e) => Err(e),
        }
    }

    /// Ends this lease's whole session without a goodbye, as a crash would:
    /// the server expires it after the session timeout and deletes the node
    /// then. Other leases of this backend on the same session (same ttl)
    /// are lost with it, as they would be in a crash.
    fn abandon(&self) {
        self.flags.abandoned.store(true, Ordering::SeqCst);
        self.task.abort();
        self.session.kill("abandoned (as if the process died)");
    }
}

impl Drop for ZkLease {
    fn drop(&mut self) {
        self.task.abort();
        if self.flags.gone.load(Ordering::SeqCst)
            || self.flags.abandoned.load(Ordering::SeqCst)
            || self.session.is_dead()
        {
            return;
        }
        let (session, path) = (self.session.clone(), self.path.clone());
        spawn_cleanup("delete the node of a dropped lease", async move {
            let _ = delete_node(&session, &path).await;
        });
    }
}
