//! Moving a lock's key between leases (`shared.rs`): onto the shared lease
//! at its first renewal, back onto a lease of its own when it is abandoned,
//! and deleting it in the background when its release failed.
//!
//! The move is one transaction, compared on the key's create revision, that
//! puts the key again with its value on the other lease (its create
//! revision, the fencing token, does not change). The lease it leaves for
//! the shared one, attached to nothing, is revoked: its id is in the key's
//! name, so no other lock may take it. A moved lock whose release fails or
//! is cut off is deleted in the background, retried until the server
//! answers; an abandoned one moves back onto a lease of its own, granted
//! then and never renewed, so it ends by its ttl as if its holder had died.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use lockcore::raw::prelude::*;
use lockcore::raw::retry::Backoff;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::is_lease_not_found;
use crate::keys::lease_id_of;
use crate::shared::Moved;

/// How many times a background delete or move-back is tried.
const TRIES: u32 = 60;

impl EtcdBackend {
    /// The shared lease of `ttl`, renewed (or granted) now: its id and when
    /// the request that vouches for it was sent.
    async fn shared_lease(
        &self,
        ttl: Duration,
        window: Duration,
        limit: Duration,
    ) -> Result<(i64, Instant)> {
        let secs = whole_seconds(ttl);
        let shared = &self.inner.shared;
        let mut granting = None;
        loop {
            if let Some(id) = shared.current(secs) {
                match self.keep_alive_within(id, limit, window).await? {
                    Some(sent) => return Ok((id, sent)),
                    None => shared.forget(secs, id),
                }
            }
            if granting.is_some() {
                break;
            }
            // Another renewal may be granting one: wait for it, then look
            // again.
            let turn = tokio::time::timeout(limit, shared.granting.lock()).await;
            granting = Some(turn.map_err(|_| {
                Error::unavailable(
                    NAME,
                    "granting the shared lease: another grant took too long",
                )
            })?);
        }
        let id = lease_id_of(OwnerToken::random());
        let sent = self.grant_lease(id, ttl, limit).await?;
        shared.set(secs, id);
        Ok((id, sent))
    }

    /// Puts `key`, if its create revision is `rev` (and, with `from`, it
    /// is on that lease), again with its value on lease `to`. Answers the
    /// lease the key is on after the call (`to` when moved), or `None`
    /// when the key is gone or another lock's. Compared on `from`, a move
    /// that reaches the server late changes nothing once the key has gone
    /// elsewhere.
    async fn move_key(
        &self,
        key: &str,
        rev: i64,
        from: Option<i64>,
        to: i64,
        limit: Duration,
    ) -> Result<Option<i64>> {
        let put = PutOptions::new().with_lease(to).with_ignore_value();
        let mut when = vec![Compare::create_revision(key, CompareOp::Equal, rev)];
        if let Some(from) = from {
            when.push(Compare::lease(key, CompareOp::Equal, from));
        }
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::put(key, "", Some(put))])
            .or_else([TxnOp::get(key, None)]);
        let mut kv = self.inner.client.kv_client();
        let r = self
            .request(
                limit,
                "moving the lock key to another lease",
                true,
                kv.txn(txn),
            )
            .await?;
        if r.succeeded() {
            return Ok(Some(to));
        }
        Ok(match r.op_responses().first() {
            Some(TxnOpResponse::Get(g)) => g
                .kvs()
                .first()
                .filter(|kv| kv.create_revision() == rev)
                .map(etcd_client::KeyValue::lease),
            _ => None,
        })
    }

    /// Moves `key` (create revision `rev`, on lease `from`) onto the shared
    /// lease of `ttl` (renewed, or its answer taken within `window`), and
    /// revokes `from` once it is attached to nothing. `sent` is set just
    /// before the move is sent (from then on it may apply).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn move_to_shared(
        &self,
        key: &str,
        rev: i64,
        from: i64,
        ttl: Duration,
        window: Duration,
        limit: Duration,
        sent: &AtomicBool,
    ) -> Moved {
        let (to, since) = match self.shared_lease(ttl, window, limit).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(backend = NAME, error = %e, "no shared lease; renewing the lock's own");
                return Moved::No { since: None };
            }
        };
        sent.store(true, Ordering::SeqCst);
        match self.move_key(key, rev, Some(from), to, limit).await {
            Ok(Some(on)) if on == to => {
                spawn_cleanup(
                    "revoke the lease an etcd lock moved off",
                    self.clone().revoke(from, limit),
                );
                Moved::Yes { to, since }
            }
            // An earlier move, whose answer was lost, took it to another
            // shared lease: it stays there, renewed from now on.
            Ok(Some(on)) if on != from && on != 0 => {
                match self.keep_alive_within(on, limit, window).await {
                    Ok(Some(since)) => {
                        spawn_cleanup(
                            "revoke the lease an etcd lock moved off",
                            self.clone().revoke(from, limit),
                        );
                        Moved::Yes { to: on, since }
                    }
                    Ok(None) => Moved::Gone,
                    Err(e) => {
                        tracing::debug!(backend = NAME, error = %e, "renewing the shared lease a lock key is on failed");
                        Moved::No { since: None }
                    }
                }
            }
            // Still on its own lease (not moved; nothing was applied).
            Ok(Some(_)) => Moved::No { since: None },
            Ok(None) => Moved::Gone,
            Err(e) => {
                tracing::debug!(backend = NAME, error = %e, "moving a lock key to the shared lease failed");
                if is_lease_not_found(&e) {
                    self.inner.shared.forget(whole_seconds(ttl), to);
                }
                Moved::No { since: Some(since) }
            }
        }
    }

    /// Deletes `key` if its create revision is still `rev`, retrying until
    /// the server answers: a key on a shared lease, whose release failed or
    /// was cut off, would otherwise live as long as the other locks renew
    /// that lease.
    pub(crate) async fn delete_in_background(self, key: String, rev: i64, limit: Duration) {
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then([TxnOp::delete(key.clone(), None)]);
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        for _ in 0..TRIES {
            let mut kv = self.inner.client.kv_client();
            match self
                .request(limit, "deleting the lock key", false, kv.txn(txn.clone()))
                .await
            {
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(backend = NAME, key, error = %e, "deleting a released lock key failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
        tracing::warn!(backend = NAME, key, "a released lock key on a shared lease could not be deleted; it lives while that lease is renewed");
    }

    /// An abandoned lock that may be on the shared lease: moves its key
    /// onto a lease of its own, granted now and never renewed, so that it
    /// ends by its ttl; retried until the server answers.
    pub(crate) async fn move_back(self, key: String, rev: i64, ttl: Duration, limit: Duration) {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        for _ in 0..TRIES {
            let own = lease_id_of(OwnerToken::random());
            let moved = match self.grant_lease(own, ttl, limit).await {
                Ok(_) => self.move_key(&key, rev, None, own, limit).await,
                Err(e) => Err(e),
            };
            match moved {
                Ok(Some(_)) => return,
                // Gone already: the new lease has nothing attached.
                Ok(None) => {
                    self.revoke(own, limit).await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(backend = NAME, key, error = %e, "moving an abandoned lock key off the shared lease failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
        tracing::warn!(backend = NAME, key, "an abandoned lock key could not be moved off the shared lease; it lives while that lease is renewed");
    }
}
