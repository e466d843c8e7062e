//! Granting, renewing and revoking an etcd lease: the requests every other
//! file builds on (keepalives go through `keepalive.rs`).

use std::time::{Duration, Instant};

use etcd_client::LeaseGrantOptions;
use lockcore::raw::prelude::*;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::On;

impl EtcdBackend {
    /// Grants `lease` with `ttl` (whole seconds); returns when the request
    /// was sent.
    pub(crate) async fn grant_lease(
        &self,
        lease: i64,
        ttl: Duration,
        limit: Duration,
    ) -> Result<Instant> {
        let mut lc = self.inner.client.lease_client();
        let sent = Instant::now();
        let granted = self
            .request(
                limit,
                "granting a lease",
                false,
                lc.grant(
                    i64::try_from(whole_seconds(ttl)).unwrap_or(i64::MAX),
                    Some(LeaseGrantOptions::new().with_id(lease)),
                ),
            )
            .await?;
        if !granted.error().is_empty() {
            return Err(Error::backend_error(
                NAME,
                format!("granting a lease: {}", granted.error()),
            ));
        }
        Ok(sent)
    }

    /// One keepalive of `lease` on the backend's shared stream: `Ok(true)`
    /// renewed, `Ok(false)` the lease is gone (the server answered ttl 0).
    pub(crate) async fn keep_alive_once(&self, lease: i64, limit: Duration) -> Result<bool> {
        Ok(self
            .keep_alive_within(lease, limit, Duration::ZERO)
            .await?
            .is_some())
    }

    /// Renews `lease`, taking the answer of a keepalive of it sent within
    /// `fresh` if there is one: `Some(sent)` renewed by a keepalive sent
    /// at `sent`, `None` the lease is gone.
    pub(crate) async fn keep_alive_within(
        &self,
        lease: i64,
        limit: Duration,
        fresh: Duration,
    ) -> Result<Option<Instant>> {
        let renew = self.inner.keepalives.renew(lease, limit, fresh);
        let what = On("renewing the lease", &self.inner.servers);
        within(NAME, what, limit, false, renew).await
    }
}

impl EtcdBackend {
    /// Sends `lease` a keepalive in the background, unless one was sent
    /// within `fresh`: asked ahead of the end of the window in which
    /// renewals take its last answer (`KeepAlives::ask_ahead`), so that
    /// they find a new one. A failure is the next renewal's to meet.
    pub(crate) fn keep_alive_ahead(&self, lease: i64, limit: Duration, fresh: Duration) {
        let b = self.clone();
        spawn_ahead(async move {
            let _ = b.keep_alive_within(lease, limit, fresh).await;
        });
    }

    /// Reads the keys of the shared lease `lease` in the background
    /// ([`KeyChecks::read_ahead`](crate::keycheck::KeyChecks::read_ahead)).
    pub(crate) fn read_keys_ahead(&self, lease: i64, after: Instant, limit: Duration) {
        let b = self.clone();
        spawn_ahead(async move { b.inner.keychecks.read_ahead(lease, after, limit).await });
    }

    /// Revokes `lease` (deleting its keys), logging failures: the lease
    /// then ends by its ttl.
    pub(crate) async fn revoke(self, lease: i64, limit: Duration) {
        let mut lc = self.inner.client.lease_client();
        match tokio::time::timeout(limit, lc.revoke(lease)).await {
            Ok(Ok(_)) => {}
            Ok(Err(etcd_client::Error::GRpcStatus(s))) if s.code() == tonic::Code::NotFound => {}
            Ok(Err(e)) => {
                tracing::debug!(backend = NAME, lease, error = %e, "revoking a lease failed; it ends by its ttl")
            }
            Err(_) => {
                tracing::debug!(
                    backend = NAME,
                    lease,
                    "revoking a lease timed out; it ends by its ttl"
                )
            }
        }
    }
}

/// Runs `work` on the current runtime, if there is one.
fn spawn_ahead(work: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(work);
    }
}
