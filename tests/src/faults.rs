//! Helpers for fault-injection cases: drive `compose/local`, undo a fault
//! even when the case fails, and a harness that only connects by URL.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use lockcore::Locker;

use crate::Harness;

fn script() -> String {
    std::env::var("LOCKTEST_COMPOSE").unwrap_or_else(|_| {
        panic!("fault cases need compose/local: LOCKTEST_COMPOSE is unset (eval \"$(compose/local env)\")")
    })
}

/// Stops, starts, pauses or resumes one server of `compose/local` (from
/// `LOCKTEST_COMPOSE`); panics with a clear message when that variable is
/// unset or the command fails.
pub async fn compose(action: &str, server: &str) {
    let script = script();
    let status = tokio::process::Command::new(&script)
        .args([action, server])
        .status()
        .await
        .unwrap_or_else(|e| panic!("running {script} {action} {server}: {e}"));
    assert!(
        status.success(),
        "{script} {action} {server} failed: {status}"
    );
}

/// Runs `compose/local <action> <server>` for each server when dropped, so a
/// case restores what it broke also when it fails.
///
/// ```no_run
/// # async fn case() {
/// use lockcore_conformance::{compose, UndoOnDrop};
/// let _undo = UndoOnDrop::new("start", &["redlock-4"]);
/// compose("kill", "redlock-4").await;
/// // ... assertions; redlock-4 is started again however this ends
/// # }
/// ```
#[derive(Debug)]
#[must_use = "the fault is undone when this is dropped"]
pub struct UndoOnDrop {
    action: &'static str,
    servers: Vec<String>,
}

impl UndoOnDrop {
    /// Undo with `action` (`start`, `resume`) on `servers`.
    pub fn new(action: &'static str, servers: &[&str]) -> Self {
        UndoOnDrop {
            action,
            servers: servers.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

impl Drop for UndoOnDrop {
    fn drop(&mut self) {
        let script = std::env::var("LOCKTEST_COMPOSE").unwrap_or_default();
        for s in &self.servers {
            let _ = std::process::Command::new(&script)
                .args([self.action, s])
                .status();
        }
    }
}

/// The future of a [`ConnectFn`].
pub type ConnectFuture = Pin<Box<dyn Future<Output = lockcore::Result<Locker>> + Send>>;

/// How a [`UrlHarness`] connects.
pub type ConnectFn = fn(String) -> ConnectFuture;

/// A harness that only makes clients by URL (for binaries of
/// backend-specific cases that need no revocation or unreachable client).
pub struct UrlHarness {
    url: String,
    connect: ConnectFn,
    /// The default port of the URL's hosts, when clients may be proxied.
    proxy_port: Option<u16>,
    /// A URL of the same backend where no server answers.
    unreachable: Option<String>,
}

impl std::fmt::Debug for UrlHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlHarness")
            .field("url", &lockcore::raw::address::redact(&self.url))
            .finish()
    }
}

impl UrlHarness {
    /// A harness connecting to `url` with `connect`, e.g.
    /// `UrlHarness::shared(url, |u| Box::pin(async move { my_backend::connect(&u).await }))`.
    pub fn shared(url: impl Into<String>, connect: ConnectFn) -> Arc<dyn Harness> {
        Arc::new(UrlHarness {
            url: url.into(),
            connect,
            proxy_port: None,
            unreachable: None,
        })
    }

    /// Like [`shared`](UrlHarness::shared), and the "server absent" case
    /// connects to `unreachable`, a URL of the same backend where no server
    /// answers.
    pub fn with_unreachable(
        url: impl Into<String>,
        unreachable: impl Into<String>,
        connect: ConnectFn,
    ) -> Arc<dyn Harness> {
        Arc::new(UrlHarness {
            url: url.into(),
            connect,
            proxy_port: None,
            unreachable: Some(unreachable.into()),
        })
    }

    /// Like [`shared`](UrlHarness::shared), and its clients can be routed
    /// through [`Proxies`](crate::Proxies) (every host of the URL is
    /// replaced by its proxy; `default_port` for hosts without one). Not
    /// for a cluster whose servers redirect clients to their own addresses.
    pub fn proxied(
        url: impl Into<String>,
        connect: ConnectFn,
        default_port: u16,
    ) -> Arc<dyn Harness> {
        Arc::new(UrlHarness {
            url: url.into(),
            connect,
            proxy_port: Some(default_port),
            unreachable: None,
        })
    }
}

#[async_trait]
impl Harness for UrlHarness {
    async fn connect(&self) -> lockcore::Result<Locker> {
        (self.connect)(self.url.clone()).await
    }

    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        let url = self.unreachable.clone()?;
        Some((self.connect)(url).await)
    }

    fn can_proxy(&self) -> bool {
        self.proxy_port.is_some()
    }

    async fn connect_via(&self, proxies: &crate::Proxies) -> Option<lockcore::Result<Locker>> {
        let port = self.proxy_port?;
        Some(match proxies.route_url(&self.url, port).await {
            Ok(url) => (self.connect)(url).await,
            Err(e) => Err(lockcore::Error::backend_error("proxy", e.to_string())),
        })
    }
}

/// A client-side pause, as a GC pause or a stopped VM makes one: a client
/// made by [`wrap`](ClientPause::wrap) runs as usual until
/// [`pause`](ClientPause::pause); then its leases' renewals and releases
/// hang (its watchdog can no longer renew), until
/// [`resume`](ClientPause::resume). The server and other clients run on.
///
/// ```no_run
/// # async fn case(ctx: lockcore_conformance::Ctx) {
/// use lockcore_conformance::ClientPause;
/// let pause = ClientPause::new();
/// let holder = pause.wrap(&ctx.locker().await);
/// let g = holder.lock("x").await.unwrap();
/// pause.pause();
/// g.lost().await; // the validity deadline passed without a renewal
/// pause.resume();
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClientPause {
    state: Arc<PauseState>,
}

#[derive(Debug, Default)]
struct PauseState {
    paused: std::sync::atomic::AtomicBool,
    resumed: tokio::sync::Notify,
}

impl PauseState {
    async fn wait(&self) {
        loop {
            let resumed = self.resumed.notified();
            if !self.paused.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            resumed.await;
        }
    }
}

impl ClientPause {
    /// A pause switch, not paused.
    pub fn new() -> Self {
        ClientPause::default()
    }

    /// A client over the same backend as `locker` whose leases stop renewing
    /// while this is paused.
    pub fn wrap(&self, locker: &Locker) -> Locker {
        Locker::from_arc(Arc::new(Paused {
            inner: locker.backend().clone(),
            state: self.state.clone(),
        }))
    }

    /// Stops the wrapped clients' renewals and releases.
    pub fn pause(&self) {
        self.state
            .paused
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Lets them go on.
    pub fn resume(&self) {
        self.state
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.state.resumed.notify_waiters();
    }
}

#[derive(Debug)]
struct Paused {
    inner: Arc<dyn lockcore::raw::Backend>,
    state: Arc<PauseState>,
}

#[derive(Debug)]
struct PausedLease {
    inner: Box<dyn lockcore::raw::BackendLease>,
    state: Arc<PauseState>,
}

#[async_trait]
impl lockcore::raw::Backend for Paused {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> lockcore::Capabilities {
        self.inner.capabilities()
    }

    async fn acquire(
        &self,
        req: lockcore::raw::AcquireRequest<'_>,
    ) -> lockcore::Result<Option<lockcore::raw::Grant>> {
        Ok(self
            .inner
            .acquire(req)
            .await?
            .map(|g| lockcore::raw::Grant {
                lease: Box::new(PausedLease {
                    inner: g.lease,
                    state: self.state.clone(),
                }),
                ..g
            }))
    }

    async fn inspect(&self, name: &str) -> lockcore::Result<Option<lockcore::LockInfo>> {
        self.inner.inspect(name).await
    }
}

#[async_trait]
impl lockcore::raw::BackendLease for PausedLease {
    async fn renew(&self, ttl: std::time::Duration) -> lockcore::Result<lockcore::raw::Renewal> {
        self.state.wait().await;
        self.inner.renew(ttl).await
    }

    async fn release(&self) -> lockcore::Result<lockcore::raw::Released> {
        self.state.wait().await;
        self.inner.release().await
    }

    fn abandon(&self) {
        self.inner.abandon();
    }
}
