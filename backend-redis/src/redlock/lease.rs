//! A lease held on a majority of the masters.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;

use super::quorum::*;
use super::round::{QuorumRound, Retakes};
use crate::config::NAME;
use crate::managed::Managed;
use crate::renewals::KeyToken;
use crate::scripts::ttl_ms;

#[derive(Debug)]
pub(super) struct RedLockLease {
    pub(super) instances: Arc<Vec<Instance>>,
    pub(super) response_timeout: Duration,
    /// The lease's key and owner token, shared with its batched renewals.
    pub(super) renewing: Arc<KeyToken>,
    /// The channel a release notifies waiters on.
    pub(super) channel: String,
    pub(super) quorum: usize,
    pub(super) limit: Duration,
    /// The acquire's calls still out when it returned: the release is sent
    /// on each of their instances once the call there finished.
    pub(super) acquiring: Straggling,
    /// The keys its renewals answered at the majority set again.
    pub(super) retakes: Arc<Retakes>,
}

#[async_trait]
impl BackendLease for RedLockLease {
    /// `PEXPIRE` only where the key still holds this attempt's token, on
    /// every instance at once; renewed when a majority renewed within the
    /// validity counted from the send, and then the key is set again (`SET
    /// NX`) on an instance that lost it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease (or set it
    /// again where it was missing) on some instances, each still bounded by
    /// the ttl. A renewal's `SET NX` still out when the lease is released
    /// can land after the release and leave the key on a minority of the
    /// instances until its ttl: never a majority, so never a second holder,
    /// but a name that others wait for a little longer.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        // After the `SET NX` of a round answered earlier, if one is out:
        // it carries that round's ttl, which this renewal may change.
        self.retakes.wait().await;
        let sent = Instant::now();
        let replies = renew_all(
            &self.instances,
            &self.renewing,
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            self.limit,
        )
        .await;
        let mut renewed = count(&replies, 1);
        let refused = count(&replies, 0);
        // Renewed on a majority: take the key back where an instance lost it
        // (restarted without persistence), with NX, so that restarts one
        // after another never leave the holder on a minority (redsync #149).
        // Without a majority nothing is taken back: a lease an operator
        // deleted everywhere stays deleted.
        if renewed >= self.quorum {
            let missing: Vec<Arc<Managed>> = self
                .instances
                .iter()
                .zip(&replies)
                .filter(|(_, r)| matches!(r, Some((-1, _))))
                .map(|(i, _)| i.conn.clone())
                .collect();
            if !missing.is_empty() {
                let call = Call {
                    key: self.renewing.key().to_owned(),
                    ask: Ask::SetNx {
                        token: self.renewing.token().to_owned(),
                        ttl: ttl_ms(ttl),
                    },
                    limit: self.limit,
                };
                // Boxed: rare, and large beside the renewal's own future.
                let (retaken, _) =
                    Box::pin(on_each(&missing, call, |_| false, Straggling::default())).await;
                renewed += count(&retaken, 1);
            }
        }
        let valid_until = validity_deadline(sent, ttl);
        if renewed >= self.quorum && Instant::now() < valid_until {
            return Ok(Renewal::Renewed { valid_until });
        }
        if refused > self.instances.len() - self.quorum {
            return Ok(Renewal::Lost);
        }
        Err(Error::unavailable(
            NAME,
            format!(
                "RedLock renewal: {renewed} of {} instances renewed, {} needed",
                self.instances.len(),
                self.quorum
            ),
        ))
    }

    /// The renewal of [`renew`](Self::renew), in each master's next batch,
    /// counted as the replies come: decided once a majority renewed
    /// (without waiting for the others) or refused, or once all replied
    /// (see `round.rs`).
    fn renew_then(&self, ttl: Duration, done: Renewing) -> std::result::Result<(), Renewing> {
        let round = QuorumRound::new(
            done,
            ttl,
            self.quorum,
            self.limit,
            self.instances.clone(),
            self.renewing.clone(),
            self.retakes.clone(),
        );
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        for (at, instance) in self.instances.iter().enumerate() {
            instance
                .renewals
                .renew_part(&self.renewing, ttl_ms, round.clone(), at);
        }
        Ok(())
    }

    /// No key is set again on a master after this (see `retakes`).
    fn abandon(&self) {
        self.retakes.end();
    }

    /// Compare-and-delete on every instance, returning once a majority
    /// released it or all answered (the rest finish in the background):
    /// `NotHeld` when too many answered that it was not this owner's for a
    /// majority to have held it (the lease was lost, even if a minority
    /// still had it), `Released` when a majority released it; otherwise
    /// `Indeterminate`, and the keys that remain end by their ttl.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the key on each
    /// instance (its calls still out are dropped with it; one already sent
    /// may still apply); a key it left ends by its ttl, as if the holder had
    /// died.
    async fn release(&self) -> Result<Released> {
        self.retakes.end();
        self.retakes.wait().await;
        // Sent on each instance after the acquire's call there, if that
        // was still out.
        let acquiring = self.acquiring.clone();
        let n = release_all(
            self.instances.clone(),
            self.response_timeout,
            self.renewing.key().to_owned(),
            self.channel.clone(),
            self.renewing.token().to_owned(),
            acquiring,
        )
        .await;
        // As a renewal counts: lost once too many refused for a majority
        // to have held it, whatever a minority still held; released once
        // a majority released it; otherwise nobody can tell.
        if n.refused > self.instances.len() - self.quorum {
            return Ok(Released::NotHeld);
        }
        if n.released >= self.quorum {
            return Ok(Released::Released);
        }
        Err(Error::new(
            ErrorKind::Indeterminate,
            NAME,
            format!(
                "RedLock release: {} of {} instances answered, {} released the lease and {} refused, so whether a majority held it until now is unknown; the keys that remain end by their ttl",
                n.released + n.refused,
                self.instances.len(),
                n.released,
                n.refused
            ),
        ))
    }
}
