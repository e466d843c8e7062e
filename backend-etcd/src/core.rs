//! The backend's handle: the client, its settings and counters, and the one
//! way a server call is made.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use lockcore::raw::address::Secret;
use lockcore::raw::prelude::*;

use crate::config::{EtcdConfig, NAME};
use crate::error::{map_err, On};
use crate::keepalive::KeepAlives;
use crate::keycheck::KeyChecks;
use crate::shared::SharedLeases;
use crate::spare::SpareLeases;

/// An etcd lock backend. Cheap to clone (clones share the connection).
///
/// Each acquisition puts its lock key `<prefix>/<encoded name>/<lease id in
/// hex>` on an etcd lease of its own; a lock the watchdog renews moves onto
/// a lease shared with the others of its ttl at its first renewal (see the
/// crate docs). The lease of a lock released before that is kept for the
/// next acquisition with the same ttl.
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
    /// The lease of each ttl that renewed locks share.
    pub(crate) shared: SharedLeases,
    /// The one keep-alive stream of every lease.
    pub(crate) keepalives: KeepAlives,
    /// Renewals' reads of their keys, batched.
    pub(crate) keychecks: KeyChecks,
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
    /// Revokes the spare and shared leases in the background: nothing is
    /// attached to them (every lock on a shared lease holds the backend),
    /// and no acquisition of this backend can take them any more.
    fn drop(&mut self) {
        let mut spares = self.spares.drain();
        spares.extend(self.shared.drain());
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
        let keepalives = KeepAlives::new(client.clone(), servers.clone());
        let keychecks = KeyChecks::new(client.clone(), servers.clone(), cfg.request_timeout);
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                keepalives,
                keychecks,
                client,
                prefix: cfg.prefix.clone(),
                request_timeout: cfg.request_timeout,
                servers,
                counters: Arc::default(),
                spares: SpareLeases::default(),
                shared: SharedLeases::default(),
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
        within(NAME, On(what, servers), limit, mutating, asked).await
    }
}
