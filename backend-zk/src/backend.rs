//! The backend: acquire by the ephemeral-sequential recipe, the lease, inspection.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use lockcore::backend::prelude::*;
use lockcore::sync::lock;
use lockcore::Role;
use zookeeper_client as zk;

use crate::config::{AclMode, ZkConfig, NAME};
use crate::error::map_err;
use crate::lease::ZkLease;
use crate::nodes::{
    create_node, data_of, delete_for_good, delete_node, delete_ours, list, lock_parent, since_of,
    sync_with_leader, vanished, AbortOnDrop,
};
use crate::recipe;
use crate::session::Session;

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
    sessions: std::sync::Mutex<Sessions>,
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

impl ZkBackend {
    /// Opens a backend and its first session (with the default ttl's
    /// timeout), so that an unreachable ensemble fails here with
    /// [`Unavailable`](lockcore::ErrorKind::Unavailable).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when no session is established within the
    /// connect timeout, [`ErrorKind::InvalidConfig`] for refused credentials.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state (a half-opened session expires).
    pub async fn connect(cfg: ZkConfig) -> Result<Self> {
        let backend = ZkBackend {
            acls: Arc::new(acls_of(cfg.acl)),
            cfg: Arc::new(cfg),
            sessions: std::sync::Mutex::default(),
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

    /// Expires this client's open ZooKeeper sessions on the server now, as
    /// a session expiry would (ZooKeeper's `KillServerSession` technique: a
    /// second handle on the same session id and password, closed at once).
    /// Holders on those sessions see their lost signal, waiters an error;
    /// their ephemeral nodes are gone. For fault injection; returns how
    /// many sessions were expired.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when the ensemble does not answer.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may have expired some of the sessions.
    pub async fn expire_sessions(&self) -> Result<usize> {
        let open: Vec<Arc<Session>> = {
            let sessions = lock(&self.sessions);
            let mut all: Vec<Arc<Session>> = sessions
                .by_secs
                .values()
                .filter_map(Weak::upgrade)
                .filter(|s| !s.is_dead())
                .collect();
            all.dedup_by(|a, b| Arc::ptr_eq(a, b));
            all
        };
        for s in &open {
            s.expire_on_server(&self.cfg).await?;
        }
        Ok(open.len())
    }

    /// The session for `ttl`, opening one if there is none alive. The pool
    /// is not locked while a session is opened: during an outage every
    /// caller waits one connect timeout, not one per caller ahead of it.
    async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let secs = whole_seconds(ttl);
        {
            let mut sessions = lock(&self.sessions);
            if let Some(s) = sessions.live(secs) {
                sessions.touch(&s);
                return Ok(s);
            }
        }
        let s = Session::connect(&self.cfg, Duration::from_secs(secs)).await?;
        self.counters
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        let mut sessions = lock(&self.sessions);
        if let Some(other) = sessions.live(secs) {
            // Another caller opened one meanwhile: use it, ours expires.
            sessions.touch(&other);
            return Ok(other);
        }
        sessions.by_secs.insert(secs, Arc::downgrade(&s));
        sessions.touch(&s);
        Ok(s)
    }
}

impl ZkBackend {
    /// Waits until `pred` changes (it went, or a session event came: the
    /// caller looks again); false when `deadline` passed first.
    async fn watch_predecessor(
        &self,
        session: &Session,
        pred: &str,
        deadline: Deadline,
    ) -> Result<bool> {
        let watched = session
            .call(|c| async move { c.check_and_watch_stat(pred).await })
            .await;
        let watcher = match watched {
            Ok((Some(_), w)) => w,
            // Gone already: look again.
            Ok((None, _)) => return Ok(true),
            Err(e) => return Err(map_err(e, format!("watching {pred}"), false)),
        };
        let mut event = AbortOnDrop(tokio::spawn(watcher.changed()));
        tokio::select! {
            ev = &mut event.0 => {
                self.counters.predecessor_events.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(event = ?ev.ok().map(|e| e.event_type), %pred, "predecessor watch fired");
                Ok(true)
            }
            _ = session.dead() => Err(Error::unavailable(NAME, format!(
                "the ZooKeeper session ended while waiting: {}",
                session.reason().unwrap_or("closed")
            ))),
            () = deadline.sleep() => Ok(false),
        }
    }
}

/// A node of ours that reached the head of its queue.
struct Queued {
    path: String,
    czxid: i64,
    /// When the request that proved the session alive was sent.
    sent: Instant,
    /// Deletes the node unless disarmed.
    cleanup: CleanupOnDrop,
}

impl ZkBackend {
    /// Creates our node `<parent>/<prefix><seq>` and waits until it holds
    /// (see [`recipe::blocker`]), watching only the node it queues behind;
    /// `None` when `req.deadline` passed first (the node deleted).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call deletes its node in the background.
    async fn queue(
        &self,
        session: &Arc<Session>,
        parent: &str,
        prefix: &str,
        req: &AcquireRequest<'_>,
        started: Instant,
    ) -> Result<Option<Queued>> {
        let cleanup = CleanupOnDrop::new(
            "delete the lock node of a dropped acquisition",
            delete_ours(session.clone(), parent.to_owned(), prefix.to_owned()),
        );
        let creating = create_node(session, &self.acls, parent, prefix, req.owner, req.value);
        let (node, czxid) = within(
            NAME,
            format!("creating a lock node under {parent}"),
            session.request_timeout() * 2,
            true,
            creating,
        )
        .await?;
        let path = format!("{parent}/{node}");
        let mut first_look = true;
        loop {
            let sent = if std::mem::take(&mut first_look) {
                started
            } else {
                Instant::now()
            };
            let children = list(session, parent).await?;
            self.delete_twins(session, parent, prefix, &node, &children);
            let queue = recipe::contenders(children);
            let Some(pos) = queue.iter().position(|c| c.name == node) else {
                return Err(vanished(parent));
            };
            let Some(blocker) = recipe::blocker(&queue, pos) else {
                return Ok(Some(Queued {
                    path,
                    czxid,
                    sent,
                    cleanup,
                }));
            };
            if req.deadline.passed(Instant::now()) {
                cleanup.run_now().await;
                return Ok(None);
            }
            let pred = format!("{parent}/{}", blocker.name);
            if !self.watch_predecessor(session, &pred, req.deadline).await? {
                cleanup.run_now().await;
                return Ok(None);
            }
        }
    }

    /// Deletes, in the background, nodes of ours other than `node` (a
    /// create sent again after a connection loss may have left a twin).
    fn delete_twins(
        &self,
        session: &Arc<Session>,
        parent: &str,
        prefix: &str,
        node: &str,
        children: &[String],
    ) {
        for twin in children
            .iter()
            .filter(|c| c.starts_with(prefix) && *c != node)
        {
            let (s, p) = (session.clone(), format!("{parent}/{twin}"));
            spawn_cleanup("delete a twin lock node", async move {
                let _ = delete_node(&s, &p).await;
            });
        }
    }

    /// A permit of a semaphore of `permits`, in Curator's
    /// `InterProcessSemaphoreV2` layout: under the semaphore's mutex
    /// (`<name>/locks`), create `<name>/leases/_c_<uuid>-lease-<seq>`, and
    /// wait until `leases` has at most `permits` children; then let the
    /// mutex go. Waiters queue on the mutex, in arrival order; a try skips
    /// it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call deletes its lease node and its mutex
    /// node in the background.
    async fn acquire_permit(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest<'_>,
        permits: u32,
        started: Instant,
    ) -> Result<Option<Grant>> {
        let base = self.lock_parent(req.name);
        let (locks, leases) = (format!("{base}/locks"), format!("{base}/leases"));
        // A try does not queue on the mutex, which a waiter holds while it
        // waits: it counts the leases with its own among them, which is as
        // safe (a grant sees every lease created before its listing) and
        // only barges ahead of the waiters, as a try may.
        let mutex = if req.deadline == Deadline::Now {
            None
        } else {
            let Some(mutex) = self
                .queue(session, &locks, &mutex_prefix(req.owner), req, started)
                .await?
            else {
                return Ok(None);
            };
            Some(mutex)
        };
        let prefix = recipe::lease_prefix(req.owner);
        let cleanup = CleanupOnDrop::new(
            "delete the lease node of a dropped permit acquisition",
            delete_ours(session.clone(), leases.clone(), prefix.clone()),
        );
        let data = recipe::lease_data(permits);
        let creating = create_node(
            session,
            &self.acls,
            &leases,
            &prefix,
            req.owner,
            Some(&data),
        );
        let (node, czxid) = within(
            NAME,
            format!("creating a lease node under {leases}"),
            session.request_timeout() * 2,
            true,
            creating,
        )
        .await?;
        let path = format!("{leases}/{node}");
        let mut unchecked = true;
        loop {
            let sent = Instant::now();
            let listed = session
                .call(|c| {
                    let leases = &leases;
                    async move { c.list_and_watch_children(leases).await }
                })
                .await;
            let (children, watcher) = match listed {
                Ok(l) => l,
                Err(zk::Error::NoNode) => return Err(vanished(&leases)),
                Err(e) => return Err(map_err(e, format!("listing {leases}"), false)),
            };
            self.delete_twins(session, &leases, &prefix, &node, &children);
            if !children.contains(&node) {
                return Err(vanished(&leases));
            }
            // A twin of ours about to go counts once.
            let held = children
                .iter()
                .filter(|c| !c.starts_with(&prefix) || **c == node)
                .count();
            if held <= permits as usize {
                // The mutex goes in the background (sent at once, tried
                // again until done): admission is over, the permit holds.
                if let Some(mutex) = mutex {
                    mutex.cleanup.disarm();
                    let (s, prefix) = (session.clone(), mutex_prefix(req.owner));
                    spawn_cleanup("let a semaphore's mutex go", async move {
                        delete_for_good(s.clone(), mutex.path).await;
                        // A late twin of a create cut off by a connection loss.
                        delete_ours(s, locks, prefix).await;
                    });
                }
                cleanup.disarm();
                let lease = ZkLease::new(session.clone(), leases, prefix, path, req.lost.clone());
                return Ok(Some(Grant {
                    lease: Box::new(lease),
                    fence: u64::try_from(czxid).ok(),
                    valid_until: session.valid_until(sent, req.ttl),
                }));
            }
            // Full by our count: a client of ours counting otherwise is an
            // error, not a wait (looked at once per acquisition).
            let mismatch = if std::mem::take(&mut unchecked) {
                self.other_count(session, &leases, &children, &prefix, permits)
                    .await?
            } else {
                None
            };
            if let Some(other) = mismatch {
                cleanup.run_now().await;
                if let Some(mutex) = mutex {
                    mutex.cleanup.run_now().await;
                }
                return Err(Error::invalid_config(
                    NAME,
                    format!(
                        "semaphore {:?} is in use by a client that counts {other} permits, and this one counts {permits}: every client of a semaphore must count the same",
                        req.name
                    ),
                ));
            }
            if req.deadline.passed(Instant::now()) {
                cleanup.run_now().await;
                if let Some(mutex) = mutex {
                    mutex.cleanup.run_now().await;
                }
                return Ok(None);
            }
            let mut event = AbortOnDrop(tokio::spawn(watcher.changed()));
            tokio::select! {
                _ = &mut event.0 => {}
                _ = session.dead() => return Err(Error::unavailable(NAME, format!(
                    "the ZooKeeper session ended while waiting: {}",
                    session.reason().unwrap_or("closed")
                ))),
                () = req.deadline.sleep() => {
                    cleanup.run_now().await;
                    if let Some(mutex) = mutex {
                        mutex.cleanup.run_now().await;
                    }
                    return Ok(None);
                }
            }
        }
    }
}

impl ZkBackend {
    /// The count of permits another client of ours admits by, among the
    /// holders of `leases`, where it differs from `permits` (Curator's
    /// nodes say none, and are taken to agree).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn other_count(
        &self,
        session: &Session,
        leases: &str,
        children: &[String],
        prefix: &str,
        permits: u32,
    ) -> Result<Option<u32>> {
        for c in children.iter().filter(|c| !c.starts_with(prefix)) {
            let Some((data, _)) = data_of(session, &format!("{leases}/{c}")).await? else {
                continue;
            };
            if let Some(n) = recipe::permits_of(&data).filter(|n| *n != permits) {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }
}

/// The prefix of our node on a semaphore's mutex.
fn mutex_prefix(owner: OwnerToken) -> String {
    recipe::node_prefix(owner, false, Mode::Exclusive)
}

/// A lease lives by its session: a ttl above the negotiated session timeout
/// (the server's `maxSessionTimeout`) cannot be kept.
pub(crate) fn check_ttl(session: &Session, ttl: Duration) -> Result<()> {
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
            .values(true)
            .rw_layout(self.cfg.rwlock)
            .semaphore_layout(self.cfg.semaphore)
    }

    /// Creates `_c_<uuid>-lock-<seq>` (`-latch-` with a value, `-__READ__`
    /// and `-__WRIT__` for a reader and a writer) under the name's parent,
    /// then waits for the node it queues behind to go, watching only it:
    /// its predecessor of its own kind, or for a reader the last writer
    /// before it (see the crate docs for the kinds).
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
        if let Mode::Permit { permits } = req.mode {
            return self.acquire_permit(&session, &req, permits, started).await;
        }
        let parent = self.lock_parent(req.name);
        let prefix = recipe::node_prefix(req.owner, req.value.is_some(), req.mode);
        let Some(ours) = self
            .queue(&session, &parent, &prefix, &req, started)
            .await?
        else {
            return Ok(None);
        };
        ours.cleanup.disarm();
        let lease = ZkLease::new(session.clone(), parent, prefix, ours.path, req.lost.clone());
        Ok(Some(Grant {
            lease: Box::new(lease),
            fence: u64::try_from(ours.czxid).ok(),
            valid_until: session.valid_until(ours.sent, req.ttl),
        }))
    }

    /// The name's lock: its first contender is the holder, the others
    /// wait. A read-write lock's readers and writers on the name are not
    /// the lock's, and are not shown.
    ///
    /// The reads are preceded by a `sync` on the name's parent, so they see
    /// every acquisition and release acknowledged before the call, also
    /// those made on another session, through another server of the
    /// ensemble (a follower answers reads from what it has applied so far;
    /// barring a change of leader in between, as `sync` is not itself a
    /// quorum operation). That is one more round trip per call.
    /// [`Election::leader`] and its observer read through here.
    ///
    /// [`Election::leader`]: lockcore::Election::leader
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (a `sync` changes nothing).
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        let parent = self.lock_parent(name);
        // Our session's server may lag behind the server of the session
        // that acquired or released: catch it up with the leader first.
        // Later listings on this session (the rounds below) never see an
        // older state than this one.
        sync_with_leader(&session, &parent).await?;
        // A listed node may go before it is read (a release): the first
        // listed node that still exists is the holder, since every node
        // created after the listing sorts after it. Only when all are gone
        // is the name listed again.
        for _ in 0..INSPECT_ROUNDS {
            let mut queue = recipe::contenders(list(&session, &parent).await?);
            queue.retain(|c| c.kind.is_lock());
            if queue.is_empty() {
                return Ok(Some(LockInfo::new(None, Some(0))));
            }
            for (i, node) in queue.iter().enumerate() {
                let Some((data, stat)) =
                    data_of(&session, &format!("{parent}/{}", node.name)).await?
                else {
                    continue;
                };
                // The node's data is a candidate's value, or the owner token
                // of a plain lock of ours (not a value), or what another
                // client wrote (Curator writes the host address).
                let value = Some(String::from_utf8_lossy(&data).into_owned())
                    .filter(|v| !recipe::is_own_token(&node.name, v));
                let holder = HolderInfo::new(
                    Some(recipe::owner_of(&node.name)),
                    u64::try_from(stat.czxid).ok(),
                    None,
                )
                .with_value(value)
                .with_since(since_of(&stat));
                return Ok(Some(LockInfo::new(Some(holder), Some(queue.len() - i - 1))));
            }
        }
        Err(Error::backend_error(
            NAME,
            format!("every contender of {parent} was gone by the time it was read, {INSPECT_ROUNDS} times over"),
        ))
    }

    /// The names whose parent node, a child of the base path
    /// (`<chroot><prefix>`), has a contender: a holder or a waiter of a
    /// lock, an election, a read-write lock, or a semaphore (a lease or a
    /// waiter on its mutex). Parent nodes are flat (a name's `/` is
    /// encoded), so every name is one child, decoded back; children that
    /// are not the encoding of a name are left out. After a `sync`, as
    /// `inspect`; one listing per candidate name, in name order, until
    /// `limit` are found.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        let names =
            crate::listing::held_names(&session, &self.cfg, prefix, limit.saturating_add(1))
                .await?;
        Ok(Some(Listing::bounded(names, limit)))
    }

    /// The readers holding now (`__READ__` nodes before the first writer),
    /// the writer holding now (a `__WRIT__` node first in the read-write
    /// lock's queue), or the permits held (the semaphore's lease nodes, see
    /// the crate docs), with owner, token (`czxid`) and `since` (`ctime`)
    /// read from each node; `None` for a primitive laid out from locks
    /// (`rwlock=built`, `semaphore=built`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        if !crate::listing::is_native(&self.cfg, role) {
            return Ok(None);
        }
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        crate::listing::role_holders(&session, &self.cfg, name, role).await
    }
}

/// How often `inspect` lists again when every listed node went before it
/// was read.
const INSPECT_ROUNDS: usize = 8;
