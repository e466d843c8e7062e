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
}

impl std::fmt::Debug for UrlHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlHarness")
            .field("url", &lockcore::address::redact(&self.url))
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
        })
    }
}

#[async_trait]
impl Harness for UrlHarness {
    async fn connect(&self) -> lockcore::Result<Locker> {
        (self.connect)(self.url.clone()).await
    }
}
