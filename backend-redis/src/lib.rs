//! Redis backend for [`lockcore`]: one instance, the master that Redis
//! Sentinel names (followed across failovers), a Redis Cluster, or RedLock
//! over independent masters.
//!
//! **Keys.** A lock name `N` maps to the key `<prefix>{N}` (prefix `lock:` by
//! default, set with `?prefix=`), which holds the owner token (32 hex digits)
//! as a plain string with a PX expiry, exactly as the common recipe (`SET key
//! token NX PX ttl`, compare-and-delete on release, as redis-py's `Lock`
//! does). So another client using that recipe on `lock:{N}` excludes and is
//! excluded. Beside it live `<prefix>{N}:fence`, the fencing counter, and
//! the pub/sub channel
//! `<prefix>{N}:released` on which a release wakes waiters. The braces are a
//! hash tag: a lock's keys share one cluster slot whatever the name.
//! RedLock writes `<owner token>.<attempt>` instead (a token per attempt,
//! see [`RedLockBackend`]).
//!
//! **Elections.** A [`lockcore::Election`]'s leader holds the lock key as
//! any holder does, and its value lives beside it in `<prefix>{N}:value` as
//! `"<owner token> <value>"`, set by the same script that takes the lock,
//! with the lock key's expiry, and renewed with it. Inspection reports the
//! value only when the token in it is the lock key's holder, so an earlier
//! leader's value is never shown for a later one. On RedLock a candidate's
//! value follows its attempt token in the lock key's own value
//! (`<owner token>.<attempt> <value>`), and the leader is the token a
//! majority of masters hold, read from every master at once (see
//! [`RedLockBackend`]); RedLock has no fencing, so a leadership has no term.
//!
//! **Fencing tokens.** The script that takes the lock also sets the counter
//! to `max(counter + 1, server TIME in µs)` and keeps it for an hour after
//! the name's last acquisition. Tokens rise strictly per name; counters do
//! not pile up (a server holds one per name used in the last hour, not one
//! per name ever used); and a counter lost with the server's data (a
//! restart without persistence, a failover) is replaced by the clock, which
//! is already past every earlier token, as long as the server's clock has
//! not stepped back by more than the time since the name's last acquisition.
//!
//! **Promises.** One instance or a cluster: strict fencing while the server
//! keeps its data ([`Fencing::StrictWhileDataKept`](lockcore::Fencing)), and
//! in practice also across data loss, as above. A failover to a lagging
//! replica, or a restart without persistence, can lose the lock itself: a
//! second holder can then get it while the first still believes it holds it
//! until its next renewal fails (its lost signal fires then). The optional
//! replica-sync guard (`?sync_replicas=N`, see [`SyncReplicas`]) counts an
//! acquire, every renewal and the release only once `N` replicas confirm it
//! (`WAIT`, in the same pipeline), as Redisson's `checkLockSyncedSlaves`
//! does for the acquire: a failover then cannot promote a replica that
//! misses a lease its holder still trusts.
//! Sentinel (`redis+sentinel://`): the master is the one a majority of the
//! sentinels names, checked with `ROLE`; it is asked again after a
//! connection error or a `READONLY` reply, and every second in the
//! background.
//! RedLock: no fencing (see [`RedLockBackend`]). Waiters are woken by pub/sub
//! (not fair: whoever retries first wins), with a bounded poll as fallback.
//!
//! **Renewals.** On one instance, Sentinel's master and each RedLock master,
//! the renewals asked within 2 ms go to the server together, up to 256 keys
//! in one script call (`PEXPIRE` of each key that still holds its owner's
//! token), and each lease gets its own key's answer: thousands of held
//! leases cost tens of calls a second, not thousands. A key that another
//! owner took, or that holds a value of another type, is lost for its lease
//! alone. A Redis Cluster (whose keys of one call must share a slot), the
//! replica-sync guard, and leaders' leases renew one to a call.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let locker = lockcore_redis::connect("redis://127.0.0.1:6379").await?;
//! let guard = locker.lock("jobs/nightly").await?; // key "lock:{jobs/nightly}"
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
mod client;
pub mod config;
mod conn;
mod error;
mod lease;
mod link;
mod managed;
mod multi;
mod redlock;
mod renewals;
mod scripts;
mod sentinel;
mod wake;

pub use backend::RedisBackend;
pub use config::{Node, RedisConfig, SentinelSet, SyncReplicas, Topology, NAME, SCHEMES};
pub use redlock::RedLockBackend;

use lockcore::Locker;

/// Connects to the Redis topology that `url` describes (see [`config`]) and
/// returns a [`Locker`] over it.
///
/// # Errors
///
/// [`InvalidConfig`](lockcore::ErrorKind::InvalidConfig) for a malformed
/// URL, [`Unavailable`](lockcore::ErrorKind::Unavailable) when the server
/// does not answer.
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect(url: &str) -> lockcore::Result<Locker> {
    let cfg = RedisConfig::parse(url)?;
    connect_config(cfg).await
}

/// Like [`connect`], from parsed settings.
///
/// # Errors
///
/// As [`connect`].
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect_config(cfg: RedisConfig) -> lockcore::Result<Locker> {
    Ok(match cfg.topology {
        Topology::RedLock(_) => Locker::new(RedLockBackend::connect(cfg).await?),
        _ => Locker::new(RedisBackend::connect(cfg).await?),
    })
}

/// The Redis key that holds the owner token of lock `name` under `prefix`.
///
/// ```
/// assert_eq!(lockcore_redis::lock_key("lock:", "jobs/nightly"), "lock:{jobs/nightly}");
/// ```
pub fn lock_key(prefix: &str, name: &str) -> String {
    scripts::Keys::new(prefix, name).lock
}
