//! A held lock: its key, its lease and the key's create revision; renewal
//! by keepalive and a read of the key, release by a compare-guarded delete
//! that leaves the lease spare for the next acquisition.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lockcore::raw::prelude::*;
use lockcore::raw::retry::Backoff;
use lockcore::raw::sync::lock;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::is_transient;
use crate::spare::Spare;

impl EtcdBackend {
    /// One keepalive of `lease` on the backend's shared stream: `Ok(true)`
    /// renewed, `Ok(false)` the lease is gone (the server answered ttl 0).
    pub(crate) async fn keep_alive_once(&self, lease: i64, limit: Duration) -> Result<bool> {
        match tokio::time::timeout(limit, self.inner.keepalives.renew(lease, limit)).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(
                NAME,
                format!(
                    "renewing the lease on {}: no answer within {limit:?}",
                    self.inner.servers
                ),
            )),
        }
    }
}

/// Revokes `lease` (deleting its key), logging failures: the lease then ends
/// by its ttl.
pub(crate) async fn revoke(backend: EtcdBackend, lease: i64, limit: Duration) {
    let mut lc = backend.inner.client.lease_client();
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

/// One granted lock: its key, its lease and the key's create revision.
pub(crate) struct EtcdLease {
    pub(crate) backend: EtcdBackend,
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) lease: i64,
    pub(crate) rev: i64,
    pub(crate) ttl: Duration,
    /// Until when the lease is surely alive, as the last renewal showed.
    pub(crate) valid_until: Mutex<Instant>,
    /// Set by the first release: the lease may serve another lock since,
    /// so this handle neither renews nor releases (nor revokes) it again.
    pub(crate) finished: AtomicBool,
}

impl EtcdLease {
    /// Whether the server still has this lock's lease (time to live above
    /// zero).
    async fn lease_alive(&self, limit: Duration) -> Result<bool> {
        let mut lc = self.backend.inner.client.lease_client();
        let r = self
            .backend
            .request(
                limit,
                "reading the lease's time to live",
                false,
                lc.time_to_live(self.lease, None),
            )
            .await?;
        Ok(r.ttl() > 0)
    }
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.key)
            .field("lease", &format_args!("{:x}", self.lease))
            .field("revision", &self.rev)
            .finish()
    }
}

#[async_trait]
impl BackendLease for EtcdLease {
    /// One keepalive of the lease and one read of the key, in parallel:
    /// `Lost` when the lease is gone (ttl 0) or the key was deleted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        self.check_ttl(ttl)?;
        if self.finished.load(Ordering::Acquire) {
            return Ok(Renewal::Lost);
        }
        let b = &self.backend;
        let limit = b.op_timeout(self.ttl);
        let sent = Instant::now();
        let read = async {
            match tokio::time::timeout(limit, b.inner.keychecks.still_there(&self.key, self.rev))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(Error::unavailable(
                    NAME,
                    format!(
                        "reading the lock key on {}: no answer within {limit:?}",
                        b.inner.servers
                    ),
                )),
            }
        };
        let (alive, still) = tokio::join!(b.keep_alive_once(self.lease, limit), read);
        if !alive? {
            return Ok(Renewal::Lost);
        }
        if !still? {
            return Ok(Renewal::Lost);
        }
        let valid_until = validity_deadline(sent, ttl);
        *lock(&self.valid_until) = valid_until;
        Ok(Renewal::Renewed { valid_until })
    }

    /// The server's lease keeps its granted ttl: a longer one would count
    /// validity the server does not give, a shorter one would leave the
    /// name held on the server long after a dead holder's validity.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl != self.ttl {
            return Err(Error::invalid_config(
                NAME,
                format!(
                    "an etcd lease keeps the ttl it was granted with ({:?}); acquire with the ttl {ttl:?} instead",
                    self.ttl
                ),
            ));
        }
        Ok(())
    }

    /// Deletes the key if it is still this lock's (compare on its create
    /// revision). When it was, the lease, now attached to nothing, is kept
    /// spare for the handle's next acquisition with the same ttl; otherwise
    /// it is revoked in the background.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the key; the lease then
    /// ends by its ttl as if the holder had died, and is never reused.
    async fn release(&self) -> Result<Released> {
        if self.finished.swap(true, Ordering::AcqRel) {
            // Released before: the lease may be another lock's by now.
            return Ok(Released::NotHeld);
        }
        let b = &self.backend;
        let limit = b.op_timeout(self.ttl);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let mut kv = b.inner.client.kv_client();
        // The delete is compare-guarded, so retrying it is safe; retry a
        // transient failure (no leader during an election) for a while.
        // A request that reached a member while its leader died waits there
        // for the next leader, so each try gets a third of the time.
        let give_up = Instant::now() + limit;
        let per_try = (limit / 3).max(Duration::from_millis(300));
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        let mut retried = false;
        let res = loop {
            let res = b
                .request(per_try, "deleting the lock key", false, kv.txn(txn.clone()))
                .await;
            match res {
                Err(e) if is_transient(&e) => {
                    let delay = backoff.next_delay();
                    if Instant::now() + delay >= give_up {
                        break Err(e);
                    }
                    tracing::debug!(backend = NAME, name = %self.name, error = %e, "deleting the lock key failed; retrying");
                    tokio::time::sleep(delay).await;
                    retried = true;
                }
                other => break other,
            }
        };
        let mut deleted = matches!(&res, Ok(r) if r.succeeded());
        if retried && !deleted && res.is_ok() {
            // The key is gone, but a try before may have deleted it and lost
            // its reply. Only this holder deletes its key while its lease
            // lives (an expiry or a revoke ends the lease with the key), so
            // a live lease says the delete was ours.
            deleted = match self.lease_alive(limit).await {
                Ok(alive) => alive,
                Err(e) => {
                    // Most likely our delete applied; nobody can tell now.
                    // The key, if it is there, ends with the lease's ttl.
                    spawn_cleanup(
                        "revoke the lease of a released etcd lock",
                        revoke(b.clone(), self.lease, limit),
                    );
                    return Err(Error::new(
                        ErrorKind::Indeterminate,
                        NAME,
                        format!("the lock key was gone when a retried delete came, and the lease could not be read to tell whether the first delete was ours: {e}"),
                    ));
                }
            };
        }
        let spare = Spare {
            id: self.lease,
            valid_until: *lock(&self.valid_until),
        };
        if !(deleted && b.inner.spares.put(whole_seconds(self.ttl), spare)) {
            spawn_cleanup(
                "revoke the lease of a released etcd lock",
                revoke(b.clone(), self.lease, limit),
            );
        }
        res?;
        Ok(if deleted {
            Released::Released
        } else {
            Released::NotHeld
        })
    }

    /// Nothing to stop: after the grant this lease is renewed only by the
    /// guard's watchdog (which `abandon` stops), never in the background.
    /// The key stays on the server until the lease's ttl runs out, exactly
    /// as when the holding process dies; the handle's other locks, each on
    /// its own lease, are not affected.
    fn abandon(&self) {
        tracing::debug!(backend = NAME, key = %self.key, "lease abandoned; it ends by its ttl");
    }
}
