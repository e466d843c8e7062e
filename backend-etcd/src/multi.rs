//! Several names in one transaction, all or none: the uncontended path of
//! a multi-name acquisition. Each name keeps a lease of its own (granted
//! side by side), so each guard renews and releases alone; one
//! transaction puts every key if no name has a key at all (no holder, no
//! waiter), so the keys share one create revision, each name's token.

use std::time::Instant;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lockcore::raw::prelude::*;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::is_lease_not_found;
use crate::keys::{header_rev, lease_id_of, range_of, OWNER_MARK};
use crate::lease::EtcdLease;
use crate::spare::Spare;

/// Where the lease of one name comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A spare renewed a moment ago: alive until then.
    Fresh(Instant),
    /// A spare to renew first.
    Renew,
    /// A new lease to grant.
    Grant,
}

/// The most names one transaction takes: two operations each stay within
/// etcd's default `--max-txn-ops` (128).
const MOST: usize = 64;

impl EtcdBackend {
    /// Every one of `reqs` in one transaction (see the module docs), after
    /// their leases are granted (or spare ones renewed) side by side. When a name has a key, no
    /// key is put and the leases are kept spare for the next acquisitions
    /// (or revoked).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: each lease id is chosen, and its revocation armed,
    /// before any request is sent; a dropped call revokes them all (and
    /// the keys go with them) in the background.
    pub(crate) async fn take_all(&self, reqs: &[AcquireRequest<'_>]) -> Result<AllOrNone> {
        let plain = reqs
            .iter()
            .all(|r| r.value.is_none() && matches!(r.mode, Mode::Exclusive));
        if !plain || reqs.is_empty() || reqs.len() > MOST {
            return Ok(AllOrNone::Unsupported);
        }
        let limits: Vec<_> = reqs.iter().map(|r| self.op_timeout(r.ttl)).collect();
        // A spare lease where there is one (renewed first unless it was
        // renewed a moment ago), a new one otherwise.
        let now = Instant::now();
        let sources: Vec<(i64, Source)> = reqs
            .iter()
            .zip(&limits)
            .map(
                |(r, &margin)| match self.inner.spares.take(whole_seconds(r.ttl), now, margin) {
                    Some(s) if s.valid_until + r.ttl / 100 >= validity_deadline(now, r.ttl) => {
                        (s.id, Source::Fresh(s.valid_until))
                    }
                    Some(s) => (s.id, Source::Renew),
                    None => (lease_id_of(r.owner), Source::Grant),
                },
            )
            .collect();
        let leases: Vec<i64> = sources.iter().map(|(id, _)| *id).collect();
        let mut cleanups: Vec<CleanupOnDrop> = leases
            .iter()
            .zip(&limits)
            .map(|(&lease, &limit)| {
                CleanupOnDrop::new(
                    "revoke a lease of a dropped etcd multi-name acquisition",
                    self.clone().revoke(lease, limit),
                )
            })
            .collect();
        let mut valid: Vec<Option<Instant>> = vec![None; reqs.len()];
        let mut granting = tokio::task::JoinSet::new();
        for (i, (req, (&(lease, source), &limit))) in
            reqs.iter().zip(sources.iter().zip(&limits)).enumerate()
        {
            let (me, ttl) = (self.clone(), req.ttl);
            match source {
                Source::Fresh(until) => valid[i] = Some(until),
                Source::Renew => {
                    granting.spawn(async move {
                        let sent = Instant::now();
                        let alive = me.keep_alive_once(lease, limit).await;
                        (i, alive.map(|a| a.then(|| validity_deadline(sent, ttl))))
                    });
                }
                Source::Grant => {
                    granting.spawn(async move {
                        let granted = me.grant_lease(lease, ttl, limit).await;
                        (i, granted.map(|sent| Some(validity_deadline(sent, ttl))))
                    });
                }
            }
        }
        while let Some(done) = granting.join_next().await {
            let (i, ready) = done.map_err(|e| {
                Error::backend_error(NAME, format!("granting a lease: the task ended: {e}"))
            })?;
            match ready? {
                Some(until) => valid[i] = Some(until),
                // A spare that had ended: the names are taken one by one.
                None => return Ok(AllOrNone::Unsupported),
            }
        }
        let Some(valid) = valid.into_iter().collect::<Option<Vec<Instant>>>() else {
            return Ok(AllOrNone::Unsupported);
        };
        let ranges: Vec<String> = reqs
            .iter()
            .map(|r| range_of(&self.inner.prefix, r.name))
            .collect();
        let keys: Vec<String> = ranges
            .iter()
            .zip(&leases)
            .map(|(range, lease)| format!("{range}{lease:x}"))
            .collect();
        let free: Vec<Compare> = ranges
            .iter()
            .map(|range| {
                Compare::create_revision(range.as_str(), CompareOp::Equal, 0).with_prefix()
            })
            .collect();
        let puts: Vec<TxnOp> = reqs
            .iter()
            .zip(keys.iter().zip(&leases))
            .map(|(req, (key, &lease))| {
                TxnOp::put(
                    key.as_str(),
                    format!("{OWNER_MARK}{}", req.owner),
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        let limit = limits.iter().copied().min().unwrap_or_default();
        let mut kv = self.inner.client.kv_client();
        let resp = match self
            .request(
                limit,
                "creating the lock keys",
                true,
                kv.txn(Txn::new().when(free).and_then(puts)),
            )
            .await
        {
            Ok(resp) => resp,
            // A spare lease had ended on the server: refused whole, nothing
            // put; the names are taken one by one.
            Err(e) if is_lease_not_found(&e) => return Ok(AllOrNone::Unsupported),
            Err(e) => return Err(e),
        };
        if !resp.succeeded() {
            // Nothing put: the fresh leases serve the next acquisitions.
            for ((cleanup, (&lease, req)), &valid_until) in
                cleanups.drain(..).zip(leases.iter().zip(reqs)).zip(&valid)
            {
                let spare = Spare {
                    id: lease,
                    valid_until,
                };
                if self.inner.spares.put(whole_seconds(req.ttl), spare) {
                    cleanup.disarm();
                } else {
                    cleanup.run_now().await;
                }
            }
            return Ok(AllOrNone::Held);
        }
        let rev = header_rev(&resp);
        let Ok(fence) = u64::try_from(rev) else {
            return Err(Error::backend_error(
                NAME,
                format!("the server gave create revision {rev}"),
            ));
        };
        for cleanup in cleanups {
            cleanup.disarm();
        }
        let grants = reqs
            .iter()
            .zip(keys)
            .zip(leases.iter().zip(valid))
            .map(|((req, key), (&lease, valid_until))| Grant {
                lease: Box::new(EtcdLease::new(
                    self.clone(),
                    req,
                    key,
                    lease,
                    rev,
                    valid_until,
                )),
                fence: Some(fence),
                valid_until,
            })
            .collect();
        Ok(AllOrNone::Granted(grants))
    }
}
