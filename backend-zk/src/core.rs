//! The backend's handle: its configuration, ACLs and the sessions its leases live on.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use tokio::sync::watch;
use zookeeper_client as zk;

use crate::config::{AclMode, ZkConfig, NAME};
use crate::nodes::lock_parent;
use crate::session::Session;

/// The live counters of one backend, for tests and monitoring: a handle
/// that outlives the backend (see [`ZkBackend::counters`]).
#[derive(Debug, Default)]
pub struct ZkCounters {
    pub(crate) predecessor_events: AtomicU64,
    pub(crate) sessions_opened: AtomicU64,
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
    pub(crate) cfg: Arc<ZkConfig>,
    pub(crate) acls: Arc<Vec<zk::Acl>>,
    sessions: Arc<std::sync::Mutex<Sessions>>,
    pub(crate) counters: Arc<ZkCounters>,
}

/// How a session's opening ended, for the callers that waited for it: the
/// session, or the error's kind and message.
type Opened = Option<std::result::Result<Arc<Session>, (ErrorKind, String)>>;

/// The open sessions, by timeout in whole seconds.
#[derive(Default)]
struct Sessions {
    by_secs: HashMap<u64, Weak<Session>>,
    /// The most recently used, kept open while idle (most recent last).
    recent: VecDeque<Arc<Session>>,
    /// Sessions being opened, by timeout: the callers that need one wait
    /// for that opening instead of opening one each.
    opening: HashMap<u64, watch::Receiver<Opened>>,
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
            sessions: Arc::default(),
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

    /// The session for `ttl`, opening one if there is none alive. An
    /// opening is a task of its own that every caller needing that timeout
    /// meanwhile waits for (a server limits the connections of one
    /// address), so a caller that gives up does not stop it for the
    /// others; the pool is not locked meanwhile: during an outage every
    /// caller waits one connect timeout, not one per caller ahead of it.
    pub(crate) async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let secs = whole_seconds(ttl);
        // The opening ends by its own connect timeout; this only bounds a
        // wait for a task that is never polled (its runtime shutting down).
        let bound = self.cfg.connect_timeout * 3 + Duration::from_secs(1);
        loop {
            let mut rx = {
                let mut sessions = lock(&self.sessions);
                if let Some(s) = sessions.live(secs) {
                    sessions.touch(&s);
                    return Ok(s);
                }
                match sessions.opening.get(&secs) {
                    // Being opened (its task has not ended).
                    Some(rx) if rx.has_changed().is_ok() => rx.clone(),
                    _ => {
                        let (tx, rx) = watch::channel(None);
                        sessions.opening.insert(secs, rx.clone());
                        let opening = Opening {
                            cfg: self.cfg.clone(),
                            pool: self.sessions.clone(),
                            counters: self.counters.clone(),
                            secs,
                        };
                        tokio::spawn(opening.run(tx));
                        rx
                    }
                }
            };
            match tokio::time::timeout(bound, rx.wait_for(Option::is_some)).await {
                Ok(Ok(opened)) => match opened.as_ref() {
                    Some(Ok(s)) if !s.is_dead() => return Ok(s.clone()),
                    Some(Err((kind, message))) => {
                        return Err(Error::new(*kind, NAME, message.clone()))
                    }
                    // Dead already (expired meanwhile): open anew.
                    _ => {}
                },
                // The task ended without a result (its runtime shut down).
                Ok(Err(_)) => {}
                Err(_) => {
                    return Err(Error::unavailable(
                        NAME,
                        format!("opening a ZooKeeper session: no outcome within {bound:?}"),
                    ))
                }
            };
        }
    }
}

/// The opening of one session, in a task of its own.
struct Opening {
    cfg: Arc<ZkConfig>,
    pool: Arc<std::sync::Mutex<Sessions>>,
    counters: Arc<ZkCounters>,
    secs: u64,
}

impl Opening {
    /// Opens the session, puts it in the pool and tells the waiters.
    async fn run(self, tx: watch::Sender<Opened>) {
        let opened = Session::connect(&self.cfg, Duration::from_secs(self.secs)).await;
        let mut sessions = lock(&self.pool);
        sessions.opening.remove(&self.secs);
        let s = match opened {
            Ok(s) => s,
            Err(e) => {
                tx.send_replace(Some(Err((e.kind(), e.message().to_owned()))));
                return;
            }
        };
        self.counters
            .sessions_opened
            .fetch_add(1, Ordering::Relaxed);
        let s = match sessions.live(self.secs) {
            // Opened beside this one all the same: use it, ours expires.
            Some(other) => other,
            None => {
                sessions.by_secs.insert(self.secs, Arc::downgrade(&s));
                s
            }
        };
        sessions.touch(&s);
        tx.send_replace(Some(Ok(s)));
    }
}
