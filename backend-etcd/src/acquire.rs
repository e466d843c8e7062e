//! One acquisition's steps: the lease, the key, the wait behind the
//! keys before it, and stepping back from a failed attempt.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::is_lease_not_found;
use crate::keys::{first_kv, header_rev, range_of, OWNER_MARK};
use crate::lease::EtcdLease;
use crate::spare::Spare;
use crate::wait::Turn;

impl EtcdBackend {
    /// Puts `key` on `lease` if it does not exist yet, with `value` (a
    /// candidate's value, as `concurrency.Election` puts it; for a plain
    /// lock, its owner token behind [`OWNER_MARK`], where
    /// `concurrency.Mutex` puts nothing and reads nothing); returns its
    /// create revision and that of the oldest key of the lock (the
    /// holder's).
    pub(crate) async fn create_key(
        &self,
        key: &str,
        range: &str,
        lease: i64,
        value: Option<&str>,
        owner: OwnerToken,
        limit: Duration,
    ) -> Result<(i64, Option<i64>)> {
        let stored = value.map_or_else(|| format!("{OWNER_MARK}{owner}"), str::to_owned);
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, stored, Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(range, Some(first.clone())),
            ])
            .or_else([TxnOp::get(key, None), TxnOp::get(range, Some(first))]);
        let mut kv = self.inner.client.kv_client();
        let resp = self
            .request(limit, "creating the lock key", true, kv.txn(txn))
            .await?;
        let ops = resp.op_responses();
        let my_rev = if resp.succeeded() {
            header_rev(&resp)
        } else {
            first_kv(ops.first()).map_or(0, |kv| kv.1)
        };
        Ok((my_rev, first_kv(ops.get(1)).map(|kv| kv.1)))
    }

    /// An attempt that ends without the lock (a `try` that found the name
    /// held, a waiter whose deadline passed): deletes its key, compared on
    /// its create revision, and keeps the lease spare, as
    /// `concurrency.Mutex` keeps its session; one durable write, and the
    /// next acquisition needs no grant. If the delete did not succeed, or
    /// there are spares enough, the lease is revoked instead (the key goes
    /// with it); so is it when this is dropped halfway (`cleanup`).
    pub(crate) async fn step_back(
        &self,
        cleanup: CleanupOnDrop,
        key: &str,
        rev: i64,
        left: Spare,
        ttl: Duration,
        limit: Duration,
    ) {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key, None)]);
        let mut kv = self.inner.client.kv_client();
        let deleted = self
            .request(limit, "deleting a waiting key", false, kv.txn(txn))
            .await
            .is_ok_and(|r| r.succeeded());
        if deleted && self.inner.spares.put(whole_seconds(ttl), left) {
            cleanup.disarm();
        } else {
            cleanup.run_now().await;
        }
    }

    /// One try with `lease`: a spare one (renewed beside the key's put) or
    /// a new one (granted first); then create the key and wait for older
    /// keys to go.
    pub(crate) async fn attempt(
        &self,
        req: &AcquireRequest<'_>,
        lease: i64,
        spare: Option<Spare>,
    ) -> Result<std::result::Result<Option<Grant>, Retry>> {
        let name = req.name;
        let ttl = req.ttl;
        let limit = self.op_timeout(ttl);
        let range = range_of(&self.inner.prefix, name);
        let key = format!("{range}{lease:x}");
        // Armed before the first request is sent: the lease id is chosen
        // here, so a dropped acquire revokes it (and with it the key)
        // whatever the server had applied.
        let cleanup = CleanupOnDrop::new(
            "revoke the lease of a dropped etcd acquisition",
            self.clone().revoke(lease, limit),
        );
        let (valid_from_grant, (my_rev, owner_rev)) = match spare {
            None => {
                let sent = self.grant_lease(lease, ttl, limit).await?;
                let created = self
                    .create_key(&key, &range, lease, req.value, req.owner, limit)
                    .await?;
                (validity_deadline(sent, ttl), created)
            }
            Some(spare) => {
                let sent = Instant::now();
                // Renewed within the drift allowance (a lock cycle ago): it
                // has its whole ttl but for that, as the validity says.
                let fresh = spare.valid_until + ttl / 100 >= validity_deadline(sent, ttl);
                let (alive, created) = if fresh {
                    let created = self
                        .create_key(&key, &range, lease, req.value, req.owner, limit)
                        .await;
                    (None, created)
                } else {
                    let (alive, created) = tokio::join!(
                        self.keep_alive_once(lease, limit),
                        self.create_key(&key, &range, lease, req.value, req.owner, limit)
                    );
                    (Some(alive), created)
                };
                let created = match created {
                    // Refused whole: nothing was created.
                    Err(e) if is_lease_not_found(&e) => {
                        cleanup.disarm();
                        return Ok(Err(Retry::SpareEnded));
                    }
                    other => other?,
                };
                let valid = match alive {
                    Some(Ok(true)) => validity_deadline(sent, ttl),
                    // It ended after the put: the key went with it.
                    Some(Ok(false)) => {
                        cleanup.run_now().await;
                        return Ok(Err(Retry::SpareEnded));
                    }
                    // Fresh: it lives as long as it was known to, nearly
                    // its whole ttl.
                    None => spare.valid_until,
                    // Not renewed: a waiting key could outlive it; start
                    // again with a new lease.
                    Some(Err(e)) => {
                        tracing::debug!(backend = NAME, error = %e, "renewing a spare lease failed");
                        cleanup.run_now().await;
                        return Ok(Err(Retry::SpareEnded));
                    }
                };
                (valid, created)
            }
        };
        let valid = Mutex::new(valid_from_grant);
        if owner_rev != Some(my_rev) {
            if req.deadline == Deadline::Now {
                let left = Spare {
                    id: lease,
                    valid_until: *lock(&valid),
                };
                self.step_back(cleanup, &key, my_rev, left, ttl, limit)
                    .await;
                return Ok(Ok(None));
            }
            waiting();
            let turn = self
                .wait_turn(req, lease, &range, &key, my_rev, &valid)
                .await?;
            match turn {
                Turn::Mine => {}
                Turn::Deadline => {
                    let left = Spare {
                        id: lease,
                        valid_until: *lock(&valid),
                    };
                    self.step_back(cleanup, &key, my_rev, left, ttl, limit)
                        .await;
                    return Ok(Ok(None));
                }
                Turn::Gone(why) => {
                    cleanup.run_now().await;
                    return Ok(Err(Retry::LostPlace(why)));
                }
            }
        }
        cleanup.disarm();
        let fence = u64::try_from(my_rev).map_err(|_| {
            Error::backend_error(NAME, format!("the server gave create revision {my_rev}"))
        })?;
        let valid_until = *lock(&valid);
        Ok(Ok(Some(Grant {
            lease: Box::new(EtcdLease::new(
                self.clone(),
                req,
                key,
                lease,
                my_rev,
                valid_until,
            )),
            fence: Some(fence),
            valid_until,
        })))
    }
}

/// Why an attempt must be made again, with a new lease.
pub(crate) enum Retry {
    /// The waiting lease or key vanished.
    LostPlace(&'static str),
    /// The spare lease taken had ended on the server.
    SpareEnded,
}
