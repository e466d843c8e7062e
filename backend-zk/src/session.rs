//! One ZooKeeper session, its liveness, the one way requests are made on it
//! ([`Session::call`] and [`Session::once`], which own the request timeout
//! and the retry across a reconnect), and the error mapping.
//!
//! Sessions are *detached*: when the last handle on a session goes, the
//! connection is closed without a `closeSession`, so the server expires the
//! session (and its ephemeral nodes) after the session timeout, exactly as
//! when the process dies. Normal releases delete their nodes explicitly, so
//! nothing but an empty session is ever left to expire.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockcore::{Error, Result};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::config::{ZkConfig, NAME};
use crate::error::{is_connection_error, map_err};
use crate::signals::LostSignals;

/// How long a request that failed on its connection waits, at most, for
/// the client's state to move before it is retried.
const SETTLE: Duration = Duration::from_millis(50);

/// State shared with the monitor task.
#[derive(Debug)]
struct Shared {
    client: Mutex<Option<zk::Client>>,
    dead: CancellationToken,
    reason: OnceLock<&'static str>,
    /// The lost signals of the leases on the session, raised when it ends.
    lost: LostSignals,
}

impl Shared {
    fn kill(&self, reason: &'static str) {
        let _ = self.reason.set(reason);
        // Dropping our handle closes the connection once in-flight requests
        // are answered; the session is detached, so no closeSession is sent.
        let client = self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(client);
        self.dead.cancel();
        // After `dead`: a lease woken by its signal sees the session ended.
        self.lost.raise();
    }
}

/// A live (or dead) ZooKeeper session.
#[derive(Debug)]
pub(crate) struct Session {
    shared: Arc<Shared>,
    /// The negotiated session timeout.
    pub(crate) timeout: Duration,
    /// How long one request may take.
    request_timeout: Duration,
    /// The session id (owner of our ephemeral nodes).
    pub(crate) id: i64,
    state: zk::StateWatcher,
    monitor: AbortHandle,
    /// When the latest request that proved the session alive was sent
    /// (see [`Session::prove_alive`]); one proof at a time.
    proof: tokio::sync::Mutex<Option<Instant>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

impl Session {
    /// A lease lives by its session: a ttl above the negotiated session
    /// timeout (the server's `maxSessionTimeout`) cannot be kept.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl > self.timeout {
            return Err(Error::invalid_config(
                NAME,
                format!(
                    "ttl {ttl:?} (with the lock-delay, if any) is above the session timeout the server grants ({:?}, its maxSessionTimeout): a ZooKeeper lease lives by its session, so use a ttl and lock-delay that add up to that at most",
                    self.timeout
                ),
            ));
        }
        Ok(())
    }

    /// Opens a session asking for `ttl` as its timeout.
    pub(crate) async fn connect(cfg: &ZkConfig, ttl: Duration) -> Result<Arc<Session>> {
        let requested = ttl.max(Duration::from_millis(1));
        let mut connector = zk::Client::connector()
            .with_session_timeout(requested)
            .with_connection_timeout(cfg.connection_timeout.min(requested * 2 / 5))
            .with_detached()
            .with_fail_eagerly();
        if let Some((user, pass)) = &cfg.digest {
            connector =
                connector.with_auth("digest", format!("{user}:{}", pass.expose()).as_bytes());
        }
        let hosts = cfg.connect_string();
        let client = match tokio::time::timeout(cfg.connect_timeout, connector.connect(&hosts))
            .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                if crate::error::is_connection_error(&e) {
                    return Err(Error::unavailable(
                        NAME,
                        format!("opening a ZooKeeper session with {hosts}: no server there answered as ZooKeeper ({e}): down, without a quorum, or another service on that port?"),
                    )
                    .with_source(e));
                }
                return Err(map_err(
                    e,
                    format!("opening a ZooKeeper session with {hosts}"),
                    false,
                ));
            }
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!(
                        "opening a ZooKeeper session with {hosts}: no session within {:?} (connect_timeout_ms; no server there answered as ZooKeeper: down, without a quorum, or another service on that port?)",
                        cfg.connect_timeout
                    ),
                ))
            }
        };
        let timeout = client.session_timeout();
        if timeout != requested {
            tracing::warn!(
                requested = ?requested,
                negotiated = ?timeout,
                "the lock ttl is outside the server's session timeout bounds (minSessionTimeout..maxSessionTimeout); the session, and so the lease, lives by the server's value"
            );
        }
        let id = client.session_id().0;
        let state = client.state_watcher();
        let shared = Arc::new(Shared {
            client: Mutex::new(Some(client)),
            dead: CancellationToken::new(),
            reason: OnceLock::new(),
            lost: LostSignals::default(),
        });
        // Lost after being disconnected for about the session timeout: the
        // server may expire the session `timeout` after it last heard from
        // us, which was up to one connection timeout before we noticed.
        let conn_timeout = cfg.connection_timeout.min(timeout * 2 / 5);
        let grace = timeout.saturating_sub(conn_timeout);
        let monitor = tokio::spawn(monitor(shared.clone(), state.clone(), grace)).abort_handle();
        tracing::debug!(
            session = format_args!("{id:#x}"),
            ?timeout,
            "ZooKeeper session opened"
        );
        Ok(Arc::new(Session {
            shared,
            timeout,
            request_timeout: cfg.request_timeout,
            id,
            state,
            monitor,
            proof: tokio::sync::Mutex::new(None),
        }))
    }

    /// A handle for one request, or `Unavailable` once the session ended.
    pub(crate) fn client(&self) -> Result<zk::Client> {
        self.shared
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| self.ended_error())
    }

    fn ended_error(&self) -> Error {
        Error::unavailable(
            NAME,
            format!(
                "the ZooKeeper session {:#x} ended: {}",
                self.id,
                self.reason().unwrap_or("closed")
            ),
        )
    }

    /// Why the session ended, once it did.
    pub(crate) fn reason(&self) -> Option<&'static str> {
        self.shared.reason.get().copied()
    }

    /// Whether the session ended (expired, closed, abandoned, or
    /// disconnected for about its timeout).
    pub(crate) fn is_dead(&self) -> bool {
        self.shared.dead.is_cancelled()
    }

    /// Proves the session alive for every lease on it at once, and returns
    /// when the request that proved it was sent: one read of the root
    /// (`exists`), shared by every renewal that asks before it is sent,
    /// while it is in flight, or up to `max_age` after it was sent (the
    /// caller counts its validity from that send). The renewals of any number of leases on a session
    /// cost one request per such window, not one per lease (a lease's node
    /// is watched for the rest: see `lease.rs`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn prove_alive(
        &self,
        max_age: Duration,
    ) -> std::result::Result<Instant, zk::Error> {
        // Asked now: a proof sent before, or up to `max_age` after, serves
        // (one in flight while this waited included), so renewals waiting
        // behind a slow request never send one each in turn.
        let asked = Instant::now();
        let mut proof = self.proof.lock().await;
        if self.is_dead() {
            return Err(zk::Error::SessionExpired);
        }
        if let Some(sent) = *proof {
            if sent + max_age >= asked {
                return Ok(sent);
            }
        }
        let sent = Instant::now();
        self.call(|c| async move { c.check_stat("/").await.map(drop) })
            .await?;
        *proof = Some(sent);
        Ok(sent)
    }

    /// The send time of a proof [`prove_alive`](Self::prove_alive) would
    /// take now with `max_age`, if there is one and no proof is being
    /// made; `None` otherwise.
    pub(crate) fn known_proof(&self, max_age: Duration) -> Option<Instant> {
        let proof = self.proof.try_lock().ok()?;
        let sent = (*proof)?;
        (!self.is_dead() && sent + max_age >= Instant::now()).then_some(sent)
    }

    /// Raises `lost` when the session ends (at once if it has): one event
    /// for every lease on the session. Returns the key to
    /// [`forget_lost`](Session::forget_lost) it by once the lease ends.
    pub(crate) fn on_end_raise(&self, lost: &CancellationToken) -> usize {
        self.shared.lost.add(lost)
    }

    /// Forgets the lost signal added under `key`.
    pub(crate) fn forget_lost(&self, key: usize) {
        self.shared.lost.remove(key);
    }

    /// Resolves when the session ends.
    pub(crate) fn dead(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shared.dead.cancelled()
    }

    /// Ends the session without a goodbye (the server expires it).
    pub(crate) fn kill(&self, reason: &'static str) {
        self.shared.kill(reason);
    }

    /// After a request failed on its connection: waits until the state
    /// moves, the session ends, or [`SETTLE`] passed. The client may fail a
    /// request before its state says the connection is gone, or (its task
    /// stopped, as when the runtime shuts down) never say so; without this
    /// pause a retry loop would spin without yielding, so that neither its
    /// request timeout nor a shutdown could stop it.
    async fn settle(&self) {
        let mut w = self.state.clone();
        let _ = w.state();
        tokio::select! {
            _ = w.changed() => {}
            _ = self.dead() => {}
            () = tokio::time::sleep(SETTLE) => {}
        }
    }

    /// Waits until the session is connected again, or fails once it ended.
    pub(crate) async fn wait_connected(&self) -> Result<()> {
        let mut w = self.state.clone();
        loop {
            if self.is_dead() {
                return Err(self.ended_error());
            }
            match w.state() {
                zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                    return Ok(())
                }
                s if s.is_terminated() => {
                    self.shared.kill("the session expired or was closed");
                    return Err(self.ended_error());
                }
                _ => {}
            }
            tokio::select! {
                _ = w.changed() => {}
                _ = self.dead() => {}
            }
        }
    }

    /// One request, retried across connection losses (the client reconnects
    /// within the session), the whole bounded by the request timeout; a
    /// timeout is reported as [`zk::Error::Timeout`], a session that ended as
    /// [`zk::Error::SessionExpired`]. For requests that can be repeated
    /// (reads, deletes of our own node, creating a container parent).
    ///
    /// # Cancel safety
    ///
    /// As the request it repeats.
    pub(crate) async fn call<T, F, Fut>(&self, mut op: F) -> std::result::Result<T, zk::Error>
    where
        F: FnMut(zk::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        let attempts = async {
            loop {
                let client = self.client().map_err(|_| zk::Error::SessionExpired)?;
                match op(client).await {
                    Err(e) if is_connection_error(&e) => {
                        self.settle().await;
                        self.wait_connected()
                            .await
                            .map_err(|_| zk::Error::SessionExpired)?;
                    }
                    other => return other,
                }
            }
        };
        tokio::time::timeout(self.request_timeout, attempts)
            .await
            .unwrap_or(Err(zk::Error::Timeout))
    }

    /// One request, sent once (not repeated across a reconnect), bounded by
    /// the request timeout; for a creation, which a repeat would duplicate.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have applied.
    pub(crate) async fn once<T, F, Fut>(&self, op: F) -> std::result::Result<T, zk::Error>
    where
        F: FnOnce(zk::Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        let client = self.client().map_err(|_| zk::Error::SessionExpired)?;
        tokio::time::timeout(self.request_timeout, op(client))
            .await
            .unwrap_or(Err(zk::Error::Timeout))
    }

    /// How long one request may take.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Waits until the session is connected again, within the request
    /// timeout.
    pub(crate) async fn reconnected(&self) -> std::result::Result<(), zk::Error> {
        match tokio::time::timeout(self.request_timeout, self.wait_connected()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(zk::Error::SessionExpired),
            Err(_) => Err(zk::Error::Timeout),
        }
    }

    /// The validity of a lease proven alive by a request sent at `sent`:
    /// `min(ttl, session timeout)` later, less a clock-drift allowance of
    /// 1% + 2 ms.
    pub(crate) fn valid_until(&self, sent: Instant, ttl: Duration) -> Instant {
        lockcore::raw::validity_deadline(sent, ttl.min(self.timeout))
    }
}

async fn monitor(shared: Arc<Shared>, mut state: zk::StateWatcher, grace: Duration) {
    let mut disconnected_at: Option<Instant> = None;
    loop {
        let current = state.state();
        match current {
            zk::SessionState::Disconnected => {
                disconnected_at.get_or_insert_with(Instant::now);
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                disconnected_at = None;
            }
            zk::SessionState::Expired => return shared.kill("the session expired"),
            zk::SessionState::AuthFailed => return shared.kill("authentication failed"),
            zk::SessionState::Closed => return shared.kill("the session was closed"),
        }
        let give_up = disconnected_at.map(|t| t + grace);
        tokio::select! {
            _ = state.changed() => {}
            _ = shared.dead.cancelled() => return,
            _ = async {
                match give_up {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::warn!(?grace, "disconnected from ZooKeeper for about the session timeout; the session's leases count as lost");
                return shared.kill("disconnected for about the session timeout");
            }
        }
    }
}
