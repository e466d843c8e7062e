//! Several names in one script, all or none: the uncontended path of a
//! multi-name acquisition on one instance (or behind Sentinel), where
//! every key is on the one server.

use std::sync::Arc;
use std::time::Instant;

use lockcore::raw::prelude::*;

use crate::config::{RedisConfig, Topology, NAME};
use crate::conn::Conn;
use crate::error::{map_err, unconfirmed};
use crate::lease::{release, RedisLease};
use crate::renewals::Renewals;
use crate::scripts::{ttl_ms, Keys, ACQUIRE_ALL, FENCE_KEEP};

/// Every one of `reqs` by one script ([`ACQUIRE_ALL`]), with the
/// replica-sync guard where set: a grant its replicas did not confirm
/// is undone, and the names are then taken one by one (which rides
/// out a failover). A cluster spreads the names over slots, and RedLock
/// over instances: not there.
///
/// # Cancel safety
///
/// Cancel safe: armed before it is sent with a compare-and-delete of
/// every key by its owner's token, run in the background if the future
/// is dropped (or the script was cut off) while it may have applied.
pub(crate) async fn take_all(
    conn: &Conn,
    renewals: Option<&Arc<Renewals>>,
    cfg: &RedisConfig,
    server: &str,
    reqs: &[AcquireRequest<'_>],
) -> Result<AllOrNone> {
    let one_server = matches!(cfg.topology, Topology::Single(_) | Topology::Sentinel(_));
    let plain = reqs
        .iter()
        .all(|r| r.value.is_none() && matches!(r.mode, Mode::Exclusive));
    if !one_server || !plain || reqs.is_empty() {
        return Ok(AllOrNone::Unsupported);
    }
    let keys: Vec<Keys> = reqs
        .iter()
        .map(|r| Keys::new(&cfg.prefix, r.name))
        .collect();
    let tokens: Vec<String> = reqs.iter().map(|r| r.owner.to_string()).collect();
    let cleanup = CleanupOnDrop::new(
        "compare-and-delete a cut-off multi-name acquire",
        release_each(conn.clone(), keys.clone(), tokens.clone()),
    );
    let key_args: Vec<&str> = keys
        .iter()
        .flat_map(|k| [k.lock.as_str(), k.fence.as_str()])
        .collect();
    let ttls: Vec<String> = reqs.iter().map(|r| ttl_ms(r.ttl)).collect();
    let keep = ttl_ms(FENCE_KEEP);
    let mut args: Vec<&str> = tokens
        .iter()
        .zip(&ttls)
        .flat_map(|(t, ttl)| [t.as_str(), ttl.as_str()])
        .collect();
    args.push(&keep);
    let sent = Instant::now();
    let r: redis::RedisResult<(Vec<i64>, u32)> = conn
        .script_synced(&ACQUIRE_ALL, &key_args, &args, cfg.sync_replicas)
        .await;
    let (reply, acked) = match r {
        Ok(v) => v,
        Err(e) => {
            let err = map_err(e, "multi-name acquire", server, true);
            // A script that failed midway keeps the writes made before
            // the failure: undo unless the request never left.
            if err.kind() == ErrorKind::Unavailable {
                cleanup.disarm();
            } else {
                cleanup.run_now().await;
            }
            return Err(err);
        }
    };
    match reply.first() {
        Some(1) => {}
        Some(0) => {
            cleanup.disarm();
            return Ok(AllOrNone::Held);
        }
        _ => {
            cleanup.run_now().await;
            return Err(Error::backend_error(
                NAME,
                format!("the multi-name acquire script answered {reply:?}"),
            ));
        }
    }
    if unconfirmed(cfg.sync_replicas, server, "lock", acked, "undone").is_some() {
        // Undone; the names are taken one by one, each with the
        // guard's own retries.
        cleanup.run_now().await;
        return Ok(AllOrNone::Unsupported);
    }
    let fences: Option<Vec<u64>> = reply[1..].iter().map(|f| u64::try_from(*f).ok()).collect();
    let Some(fences) = fences.filter(|f| f.len() == reqs.len()) else {
        cleanup.run_now().await;
        return Err(Error::backend_error(
            NAME,
            format!("the multi-name acquire script answered {reply:?}"),
        ));
    };
    cleanup.disarm();
    let grants = reqs
        .iter()
        .zip(keys)
        .zip(tokens)
        .zip(fences)
        .map(|(((req, keys), token), fence)| Grant {
            lease: Box::new(RedisLease::new(
                conn.clone(),
                renewals.cloned(),
                keys,
                token,
                server.to_owned(),
                None,
                cfg.sync_replicas,
            )),
            fence: Some(fence),
            valid_until: validity_deadline(sent, req.ttl),
        })
        .collect();
    Ok(AllOrNone::Granted(grants))
}

/// Compare-and-delete of each key by its owner's token.
async fn release_each(conn: Conn, keys: Vec<Keys>, tokens: Vec<String>) {
    for (keys, token) in keys.into_iter().zip(tokens) {
        release(conn.clone(), keys, token).await;
    }
}
