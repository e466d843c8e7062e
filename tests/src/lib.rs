//! The conformance suite: the lock contract, checked the same way on every
//! backend.
//!
//! Each case is a public async function over a [`Ctx`]; [`run`] runs all the
//! cases that a backend's [`Capabilities`] select,
//! against one or more [`Target`]s, as named trials
//! (`<target>::<case>`) that can be filtered like any test. A backend's own
//! `tests/` calls it from a `harness = false` test:
//!
//! ```no_run
//! use std::sync::Arc;
//! use lockcore::{Locker, memory::MemoryBackend};
//! use lockcore_conformance::{run, Harness, Target};
//!
//! #[derive(Debug)]
//! struct Memory(MemoryBackend);
//!
//! #[async_trait::async_trait]
//! impl Harness for Memory {
//!     async fn connect(&self) -> lockcore::Result<Locker> {
//!         Ok(Locker::new(self.0.clone()))
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     run(vec![Target::new("memory", None, |_config| async {
//!         Ok(Arc::new(Memory(MemoryBackend::new())) as Arc<dyn Harness>)
//!     })])
//! }
//! ```
//!
//! A target names the environment variable that holds its server's address
//! (`LOCKTEST_REDIS_URL`, ...). When it is unset, the target's trials are
//! reported as ignored, with a line saying so, never as passed. With
//! `LOCKTEST_REQUIRE=all` (or a comma-separated list of target names), a
//! missing or unreachable server fails the run with a message naming the
//! variable and `compose/`.
//!
//! Every run works in its own random namespace (a name prefix), so runs
//! against one server never collide.

// Test code: a failed expectation is a failed trial.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod cases;
mod faults;
pub mod processes;
pub mod proxy;
mod runner;
pub mod scenarios;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Capabilities, Locker};

pub use runner::{run, run_serial, Target, COMPOSE_HINT};

pub use faults::{compose, ClientPause, ConnectFn, ConnectFuture, UndoOnDrop, UrlHarness};
pub use processes::{soak_pausing, ServerFault, Soak, SoakReport};
pub use proxy::{Dir, Proxies};

/// How the suite reaches a backend: implemented once per backend, in its
/// own `tests/`.
#[async_trait]
pub trait Harness: Send + Sync + fmt::Debug + 'static {
    /// A new client with its own connection or session, as a separate
    /// process would have.
    async fn connect(&self) -> lockcore::Result<Locker>;

    /// A client aimed at an address where no server answers, for the
    /// "server absent" case; `None` skips that case (the memory backend).
    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        None
    }

    /// Whether [`revoke`](Harness::revoke) works.
    fn can_revoke(&self) -> bool {
        false
    }

    /// Takes the lease on `name` away from its holder on the server, as an
    /// operator or a fault would (delete the key, the node, kill the
    /// connection), without telling the holder's client: it must find out
    /// by itself (its renewal is refused, a watch fires, its connection
    /// breaks). Returns whether something was held.
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        let _ = name;
        Ok(false)
    }

    /// Whether [`connect_via`](Harness::connect_via) works.
    fn can_proxy(&self) -> bool {
        false
    }

    /// A new client whose every connection to the server goes through
    /// `proxies` (route each server address with [`Proxies::route`] or
    /// [`Proxies::route_url`]), so a case can delay, blackhole or cut that
    /// client's traffic while the server and other clients run on. `None`
    /// when the backend cannot be proxied (in-process, or a cluster whose
    /// redirects name the servers' own addresses).
    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        let _ = proxies;
        None
    }

    /// How many wake-ups the waiters of `clients` (made by this harness)
    /// have had from the server so far (watch notifications on a
    /// predecessor), where the backend counts them; `None` skips the no-herd
    /// case. Only these clients count: other cases run at the same time.
    fn wakeups(&self, clients: &[&Locker]) -> Option<u64> {
        let _ = clients;
        None
    }

    /// What is left on the server for `names` once every client that used
    /// them has ended and their ttls have passed: lock keys or nodes,
    /// waiter entries, leases, open transactions, fencing counters kept for
    /// ever. Each item says what it is; `None` when the harness cannot look
    /// (the soak then skips that check).
    async fn leftovers(&self, names: &[String]) -> Option<Vec<String>> {
        let _ = names;
        None
    }
}

/// What a case gets: the harness, the backend's capabilities and the run's
/// namespace.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The backend under test.
    pub harness: Arc<dyn Harness>,
    /// Its capabilities, as its clients report them.
    pub caps: Capabilities,
    /// The name prefix of this run.
    pub namespace: String,
    /// The value of the target's environment variable (`""` when it has none).
    pub config: String,
    /// The target's name (as in the trial names `<target>::<case>`).
    pub target: String,
}

impl Ctx {
    /// A lock name private to this run and `case`.
    pub fn name(&self, case: &str) -> String {
        format!("{}/{case}", self.namespace)
    }

    /// A new client; panics (fails the trial) if it cannot connect.
    pub async fn locker(&self) -> Locker {
        match self.harness.connect().await {
            Ok(l) => l,
            Err(e) => panic!("connecting a new client failed: {e}"),
        }
    }

    /// A new client through `proxies` (see [`Harness::connect_via`]), or
    /// `None` when the harness cannot proxy; panics if it cannot connect.
    pub async fn locker_via(&self, proxies: &Proxies) -> Option<Locker> {
        match self.harness.connect_via(proxies).await? {
            Ok(l) => Some(l),
            Err(e) => panic!("connecting a new client through a proxy failed: {e}"),
        }
    }
}
