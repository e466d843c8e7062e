//! The backend: acquire by the ephemeral-sequential recipe, the lease, inspection.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::cleanup::{spawn_cleanup, CleanupOnDrop};
use lockcore::name::encode_segment;
use lockcore::{
    AcquireRequest, Backend, BackendLease, Capabilities, Deadline, Error, Fencing, Grant,
    HolderInfo, LeaseKind, LockInfo, OwnerToken, Released, Renewal, Result,
};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::config::{AclMode, ZkConfig, NAME};
use crate::recipe;
use crate::session::{is_session_end, map_err, Session};

/// How often a create is retried when a container parent is reaped under it.
const MAX_PARENT_RETRIES: usize = 8;

/// Counters of one backend, for tests and monitoring.
#[derive(Debug, Default)]
struct Counters {
    predecessor_events: AtomicU64,
    sessions_opened: AtomicU64,
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

/// A ZooKeeper lock backend (see the crate docs for the layout).
///
/// Sessions are opened per session timeout: locks whose ttl asks for the
/// same timeout share one session, which is the lease of all of them.
pub struct ZkBackend {
    cfg: Arc<ZkConfig>,
    acls: Arc<Vec<zk::Acl>>,
    sessions: tokio::sync::Mutex<HashMap<u64, Arc<Session>>>,
    counters: Arc<Counters>,
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
            sessions: tokio::sync::Mutex::new(HashMap::new()),
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
        ZkStats {
            predecessor_events: self.counters.predecessor_events.load(Ordering::Relaxed),
            sessions_opened: self.counters.sessions_opened.load(Ordering::Relaxed),
        }
    }

    /// The parent node of lock `name` (full path, chroot included).
    pub fn lock_parent(&self, name: &str) -> String {
        lock_parent(&self.cfg, name)
    }

    /// The session for `ttl`, opening one if there is none alive.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let key = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let mut map = self.sessions.lock().await;
        if let Some(s) = map.get(&key) {
            if !s.is_dead() {
                return Ok(s.clone());
            }
        }
        map.retain(|_, s| !s.is_dead());
        let s = Session::connect(&self.cfg, ttl).await?;
        self.counters
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        map.insert(key, s.clone());
        Ok(s)
    }

    /// Creates our ephemeral sequential node; returns its name and czxid.
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
        let mut parent_retries = 0;
        loop {
            let client = session.client()?;
            match client.create(&full, data.as_bytes(), &opts).await {
                Ok((stat, seq)) => {
                    let name = format!("{prefix}{seq}");
                    let czxid = if stat.czxid > 0 {
                        stat.czxid
                    } else {
                        // Servers before 3.5 give no stat on create.
                        self.czxid_of(session, &format!("{parent}/{name}"))
                            .await?
                            .ok_or_else(|| vanished(parent))?
                    };
                    return Ok((name, czxid));
                }
                Err(zk::Error::NoNode) if parent_retries < MAX_PARENT_RETRIES => {
                    parent_retries += 1;
                    let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                    match client.mkdir(parent, &dir).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(zk::Error::ConnectionLoss) => session.wait_connected().await?,
                        Err(e) => {
                            return Err(map_err(e, format!("creating the lock parent {parent}")))
                        }
                    }
                }
                Err(zk::Error::ConnectionLoss) => {
                    // The create may have applied: find it by our uuid.
                    drop(client);
                    session.wait_connected().await?;
                    if let Some(name) = self.find_ours(session, parent, prefix).await? {
                        if let Some(czxid) =
                            self.czxid_of(session, &format!("{parent}/{name}")).await?
                        {
                            return Ok((name, czxid));
                        }
                    }
                }
                Err(e) => return Err(map_err(e, format!("creating a lock node under {parent}"))),
            }
        }
    }

    async fn find_ours(
        &self,
        session: &Session,
        parent: &str,
        prefix: &str,
    ) -> Result<Option<String>> {
        let children = list(session, parent).await?;
        Ok(children.into_iter().find(|c| c.starts_with(prefix)))
    }

    async fn czxid_of(&self, session: &Session, path: &str) -> Result<Option<i64>> {
        loop {
            let client = session.client()?;
            match client.check_stat(path).await {
                Ok(stat) => return Ok(stat.map(|s| s.czxid)),
                Err(zk::Error::ConnectionLoss) => {
                    drop(client);
                    session.wait_connected().await?;
                }
                Err(e) => return Err(map_err(e, format!("reading {path}"))),
            }
        }
    }
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

/// Children of `parent`, retried across connection losses; `NoNode` is empty.
async fn list(session: &Session, parent: &str) -> Result<Vec<String>> {
    loop {
        let client = session.client()?;
        match client.list_children(parent).await {
            Ok(c) => return Ok(c),
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(zk::Error::ConnectionLoss) => {
                drop(client);
                session.wait_connected().await?;
            }
            Err(e) => return Err(map_err(e, format!("listing {parent}"))),
        }
    }
}

/// Deletes `path` (ours by its uuid), retrying across connection losses.
/// Returns whether it was there.
async fn delete_node(session: &Session, path: &str) -> Result<bool> {
    let mut cut_off = false;
    loop {
        let client = session.client()?;
        match client.delete(path, None).await {
            Ok(()) => return Ok(true),
            Err(zk::Error::NoNode) => return Ok(cut_off),
            Err(zk::Error::ConnectionLoss) => {
                cut_off = true;
                drop(client);
                session.wait_connected().await?;
            }
            Err(e) => return Err(map_err(e, format!("deleting {path}"))),
        }
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
        let name = req.name;
        // The validity of a lease granted at the first look is measured from
        // here: before the session and the node existed, so conservative.
        let started = Instant::now();
        let session = self.session(req.ttl).await.map_err(|e| e.with_name(name))?;
        check_ttl(&session, req.ttl).map_err(|e| e.with_name(name))?;
        let parent = self.lock_parent(name);
        let prefix = recipe::node_prefix(req.owner);
        let cleanup = CleanupOnDrop::new(
            "delete the lock node of a dropped acquisition",
            delete_ours(session.clone(), parent.clone(), prefix.clone()),
        );
        let (node, czxid) = self
            .create_node(&session, &parent, &prefix, req.owner)
            .await
            .map_err(|e| e.with_name(name))?;
        let path = format!("{parent}/{node}");
        let mut first_look = true;
        loop {
            let sent = if std::mem::take(&mut first_look) {
                started
            } else {
                Instant::now()
            };
            let children = list(&session, &parent)
                .await
                .map_err(|e| e.with_name(name))?;
            // A create retried after a connection loss may have left a twin.
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
                return Err(vanished(&parent).with_name(name));
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
            let client = session.client().map_err(|e| e.with_name(name))?;
            let watcher = match client.check_and_watch_stat(&pred).await {
                Ok((Some(_), w)) => w,
                Ok((None, _)) => continue,
                Err(zk::Error::ConnectionLoss) => {
                    drop(client);
                    session
                        .wait_connected()
                        .await
                        .map_err(|e| e.with_name(name))?;
                    continue;
                }
                Err(e) => {
                    return Err(map_err(e, format!("watching {pred}")).with_name(name));
                }
            };
            drop(client);
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
                    )).with_name(name));
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
        let session = self
            .session(lockcore::DEFAULT_TTL)
            .await
            .map_err(|e| e.with_name(name))?;
        let parent = self.lock_parent(name);
        let queue = recipe::contenders(
            list(&session, &parent)
                .await
                .map_err(|e| e.with_name(name))?,
        );
        let Some(first) = queue.first() else {
            return Ok(Some(LockInfo::new(None, Some(0))));
        };
        let fence = self
            .czxid_of(&session, &format!("{parent}/{}", first.name))
            .await
            .map_err(|e| e.with_name(name))?
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
        let watcher = match session.client() {
            Err(_) => None,
            Ok(client) => match client.check_and_watch_stat(&path).await {
                Ok((Some(_), w)) => Some(w),
                Ok((None, _)) => {
                    flags.gone.store(true, Ordering::SeqCst);
                    if !flags.released.load(Ordering::SeqCst) {
                        tracing::warn!(node = %path, "our lock node was deleted by someone else");
                        lost.cancel();
                    }
                    return;
                }
                Err(e) if is_session_end(&e) => None,
                Err(_) => {
                    drop(client);
                    if session.wait_connected().await.is_err() {
                        None
                    } else {
                        continue;
                    }
                }
            },
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
        let Ok(client) = self.session.client() else {
            return Ok(Renewal::Lost);
        };
        let sent = Instant::now();
        match client.check_stat(&self.path).await {
            Ok(Some(stat)) if stat.ephemeral_owner == self.session.id => Ok(Renewal::Renewed {
                valid_until: self.session.valid_until(sent, ttl),
            }),
            Ok(_) => Ok(Renewal::Lost),
            Err(e) if is_session_end(&e) => Ok(Renewal::Lost),
            Err(e) => Err(map_err(e, format!("checking the lock node {}", self.path))),
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
