//! A held lock on one instance or a cluster: owner-checked renew and
//! release by script.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;

use crate::config::SyncReplicas;
use crate::conn::Conn;
use crate::error::{map_err, unconfirmed};
use crate::renewals::{KeyToken, Renewals, RENEWING};
use crate::scripts::{ttl_ms, Keys, FENCE_KEEP, RELEASE, RENEW, RENEW_WITH_VALUE};

/// Compare-and-delete with `token`, and a wake-up on the release channel:
/// the cleanup of an acquisition that may have applied.
pub(crate) async fn release(conn: Conn, keys: Keys, token: String) {
    let r: redis::RedisResult<i64> = conn
        .script(&RELEASE, &[&keys.lock], &[&token, &keys.channel])
        .await;
    if let Err(e) = r {
        tracing::warn!(key = %keys.lock, error = %e, "cleanup compare-and-delete failed; the key ends by its ttl");
    }
}

/// One held lock: its keys and its owner token.
#[derive(Debug)]
pub(crate) struct RedisLease {
    conn: Conn,
    /// Where a plain renewal goes with others (see `renewals.rs`), when
    /// the backend batches them.
    renewals: Option<Arc<Renewals>>,
    /// The key and token, as the batched renewals take them.
    renewing: Arc<KeyToken>,
    keys: Keys,
    token: String,
    server: String,
    /// For a lease that carries a value key (renewed beside the lock key):
    /// its fencing token, which the renewal keeps the counter at.
    with_value: Option<u64>,
    /// The replica-sync guard every renewal and the release wait for.
    sync: Option<SyncReplicas>,
}

impl RedisLease {
    pub(crate) fn new(
        conn: Conn,
        renewals: Option<Arc<Renewals>>,
        keys: Keys,
        token: String,
        server: String,
        with_value: Option<u64>,
        sync: Option<SyncReplicas>,
    ) -> Self {
        RedisLease {
            conn,
            renewals,
            renewing: KeyToken::new(&keys.lock, &token),
            keys,
            token,
            server,
            with_value,
            sync,
        }
    }
}

#[async_trait]
impl BackendLease for RedisLease {
    /// `PEXPIRE` only if the key still holds this owner's token (and the
    /// value key with it, for a lease that carries one). With the
    /// replica-sync guard, a renewal its replicas did not confirm is an
    /// error: the validity is not extended past what a promoted replica
    /// would know.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let sent = Instant::now();
        let renewing = match self.with_value {
            Some(fence) => {
                let (ttl_arg, keep, fence) = (ttl_ms(ttl), ttl_ms(FENCE_KEEP), fence.to_string());
                // Boxed, as below: a script call's future is large, and in
                // line it would make every renewal's future (allocated per
                // renewal) as large, the common batched one too.
                Box::pin(self.conn.script_synced(
                    &RENEW_WITH_VALUE,
                    &[&self.keys.lock, &self.keys.value, &self.keys.fence],
                    &[&self.token, &ttl_arg, &keep, &fence],
                    self.sync,
                ))
                .await
            }
            None => match &self.renewals {
                // Gone (-1) and another owner's (0) are both lost here.
                Some(batched) => batched
                    .renew(
                        &self.renewing,
                        u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                    )
                    .await
                    .map(|r| (r.max(0), u32::MAX)),
                None => {
                    let ttl_arg = ttl_ms(ttl);
                    let args = [self.token.as_str(), ttl_arg.as_str()];
                    Box::pin(
                        self.conn
                            .script_synced(&RENEW, &[&self.keys.lock], &args, self.sync),
                    )
                    .await
                }
            },
        };
        let (r, acked): (i64, u32) =
            renewing.map_err(|e| map_err(e, RENEWING, &self.server, true))?;
        if r == 1 {
            if let Some(e) = unconfirmed(
                self.sync,
                &self.server,
                "renewal",
                acked,
                "the lease's validity was not extended",
            ) {
                return Err(e);
            }
        }
        Ok(if r == 1 {
            Renewal::Renewed {
                valid_until: validity_deadline(sent, ttl),
            }
        } else {
            Renewal::Lost
        })
    }

    /// A plain lease's renewal (no value key, no replica-sync guard) goes
    /// in the server's next batch of renewals, answered from its task.
    fn renew_then(&self, ttl: Duration, done: Renewing) -> std::result::Result<(), Renewing> {
        match (&self.renewals, self.with_value) {
            (Some(batched), None) => {
                batched.renew_then(&self.renewing, ttl, done);
                Ok(())
            }
            _ => Err(done),
        }
    }

    /// Compare-and-delete, then a wake-up on the release channel. With the
    /// replica-sync guard, a release its replicas did not confirm is an
    /// error: a promoted replica may keep the name taken until the ttl.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the key; it then ends
    /// by its ttl.
    async fn release(&self) -> Result<Released> {
        let (r, acked): (i64, u32) = self
            .conn
            .script_synced(
                &RELEASE,
                &[&self.keys.lock],
                &[&self.token, &self.keys.channel],
                self.sync,
            )
            .await
            .map_err(|e| map_err(e, "release (compare-and-delete)", &self.server, true))?;
        if r == 1 {
            if let Some(e) = unconfirmed(
                self.sync,
                &self.server,
                "release",
                acked,
                "a replica promoted now may keep the name taken until the ttl",
            ) {
                return Err(e);
            }
        }
        Ok(if r == 1 {
            Released::Released
        } else {
            Released::NotHeld
        })
    }
}
