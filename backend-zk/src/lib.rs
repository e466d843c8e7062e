//! ZooKeeper backend for [`lockcore`]: ephemeral sequential nodes, fair and
//! herd-free, interoperable with Apache Curator's `InterProcessMutex`,
//! `LeaderLatch`, `InterProcessReadWriteLock` and `InterProcessSemaphoreV2`,
//! and kazoo's `Lock`, `ReadLock` and `WriteLock`.
//!
//! **Paths.** A lock name `N` maps to the parent node
//! `<chroot><prefix>/<encode_segment(N)>` (prefix `/lockcore` by default,
//! see [`config`]; [`encode_segment`](lockcore::name::encode_segment) keeps
//! ASCII letters, digits and `-_~.` and writes every other byte as `%XX`, so
//! `a/b` is `a%2Fb`, `..` is `%2E%2E`, and a 256-byte name stays one segment
//! well under ZooKeeper's limits). Under it, each contender creates an
//! ephemeral sequential node `_c_<uuid>-lock-<seq>` holding its owner token
//! (32 hex digits), exactly Curator's `InterProcessMutex` layout
//! (`<uuid>` is the owner token written as a UUID): a Java service using
//! `new InterProcessMutex(client, "<prefix>/<segment>")` on the same path
//! excludes and is excluded. kazoo's `Lock` nodes (`<uuid>__lock__<seq>`)
//! count as contenders too, so a Python service using
//! `client.Lock(path, extra_lock_patterns=["-lock-"])` interoperates. The
//! setting is needed: we count kazoo's nodes whatever its settings, but a
//! kazoo `Lock` without it does not see ours and takes the name beside our
//! holder.
//! A candidate of a [`lockcore::Election`] creates `_c_<uuid>-latch-<seq>`
//! with its value as the node's data instead: Curator's `LeaderLatch`
//! layout, so `new LeaderLatch(client, "<prefix>/<segment>", id)` campaigns
//! beside our candidates (one leader among both, checked with real Curator
//! clients), `LeaderLatch.getLeader()` names our leader's value, and our
//! `leader()` names Curator's. Curator's `LeaderSelector` (mutex nodes) and
//! `LeaderLatch` must not share a path, in Curator as here: likewise, a
//! Curator `InterProcessMutex` or a kazoo `Lock` on an election's path does
//! not see our candidates (nor Curator's `LeaderLatch` our plain locks),
//! while our own locks and candidates on one name do exclude each other.
//!
//! A [`lockcore::RwLock`] takes its name's path, in Curator's
//! `InterProcessReadWriteLock` layout ([`lockcore::Layout::Native`]): a
//! reader creates `_c_<uuid>-__READ__<seq>`, a writer
//! `_c_<uuid>-__WRIT__<seq>`, in one queue. A writer holds when no reader
//! or writer is queued before it; a reader holds when no writer is, and
//! waits on the last one that is. So `new
//! InterProcessReadWriteLock(client, "<prefix>/<segment>")` reads beside
//! our readers and excludes and is excluded by our writers (checked with
//! real Curator clients), and writers are not starved: a reader arriving
//! after a waiting writer waits for it. There is no reader limit. kazoo's
//! `ReadLock` nodes (`<uuid>__rlock__<seq>`) count as readers and its
//! `WriteLock` nodes (`__lock__`) as writers; kazoo sees ours only with
//! `extra_lock_patterns=["__WRIT__"]` on a `ReadLock` and
//! `["__WRIT__", "__READ__"]` on a `WriteLock`. Without them a kazoo
//! `WriteLock` writes beside our readers and writers, and a kazoo
//! `ReadLock` reads beside our writers: only kazoo clients given these
//! patterns are excluded.
//!
//! A name's lock and its read-write lock are two things, as on every other
//! backend and as Curator's `InterProcessMutex` and
//! `InterProcessReadWriteLock` on one path: lock and election nodes and
//! reader and writer nodes share the path but not the queue, and
//! [`inspect`](lockcore::Locker::inspect) shows the lock's. kazoo's
//! `__lock__` nodes, both its `Lock` and its `WriteLock`, count in both.
//!
//! A [`lockcore::Semaphore`] of N is Curator's `InterProcessSemaphoreV2`
//! ([`lockcore::Layout::Native`]): a client takes the semaphore's mutex
//! (`<segment>/locks`, the mutex layout above), creates
//! `<segment>/leases/_c_<uuid>-lease-<seq>`, waits (holding the mutex)
//! until `leases` has at most N children, then lets the mutex go; a permit
//! is its lease node, its token the node's czxid, rising across every
//! permit. So `new InterProcessSemaphoreV2(client, "<prefix>/<segment>",
//! N)` shares the N permits with ours (checked with real Curator clients),
//! waiters are served in arrival order, and a waiter queues once whatever
//! N is. Our lease nodes hold the count their client admits by
//! (`lockcore permits=N`): a client that finds the semaphore full by its
//! count while a client of ours counting otherwise holds a permit gets
//! `InvalidConfig`, not a wait. Curator's nodes say no count and are
//! taken to agree; a client counting more than the holders is not told
//! (it admits by its own N, as in Curator).
//!
//! The URL options `rwlock=built` and `semaphore=built` lay read-write
//! locks and semaphores out from locks instead, as on the other backends,
//! for a `migrate:` from one of them. The two layouts do not see each
//! other: every ZooKeeper client of a name must use the same one, and a
//! fleet changes layout only with the primitive's users stopped (see
//! [`config`]).
//!
//! All contenders are ordered by their 10-digit sequence suffix. Parents,
//! the prefix and the chroot are created as *container* nodes, which the
//! server reaps once empty, so short-lived names leave nothing behind.
//!
//! **Inspection.** [`inspect`](lockcore::Locker::inspect) (and so
//! [`Election::leader`](lockcore::Election::leader) and its observer)
//! lists the name's parent and reads the first contender's node after a
//! `sync` on the parent: a follower answers reads from what it has applied,
//! which may lag behind an acquisition or a release another session's
//! server already acknowledged, and the `sync` brings it up to date first.
//! What inspection shows includes every acquisition and release
//! acknowledged before it was called, at the cost of one more round trip
//! (barring a change of leader in between: ZooKeeper's `sync` is not
//! itself a quorum operation, ZOOKEEPER-1675).
//! [`list`](lockcore::raw::Backend::list) lists the base path's
//! children (one per name: a name's `/` is encoded, so there is no
//! nesting) and keeps the names whose parent has a contender node;
//! [`inspect_role`](lockcore::raw::Backend::inspect_role) reads the
//! readers holding (the `__READ__` nodes before the first writer), the
//! writer holding (a `__WRIT__` node first in the read-write lock's
//! queue) and the permits held (the first `N` lease nodes, `N` the count
//! our lease nodes carry; every lease node when only Curator's are there),
//! each with its node's `czxid` as token and `ctime` as `since`. Both
//! `sync` first, as inspection does.
//!
//! **The recipe.** The first contender holds the lock. Every other one
//! watches only its predecessor (an `exists` watch), so a release wakes one
//! waiter, the next in arrival order: fair, and no herd. (A writer's
//! release wakes the readers queued right behind it, which then read
//! together.) A dropped
//! acquisition deletes its node (found by its uuid, also after a connection
//! loss cut off the create).
//!
//! **The lease is the session.** The session timeout is the lock's ttl;
//! locks asking for the same timeout share a session. A ttl below the
//! server's `minSessionTimeout` is raised to it (with a warning; the grant's
//! validity stays the ttl, the node lives as long as the session); a ttl
//! above `maxSessionTimeout` is refused with `InvalidConfig` naming the
//! server's bound, since no session could keep it. The lost signal fires when the session expires, when it has
//! been disconnected for about its timeout (the server may have expired it
//! by then; expiry itself is only reported after a reconnect), or when the
//! node is deleted by someone else. A grant's validity is the send time of
//! the request that proved the session alive plus `min(ttl, session
//! timeout)`; renewal re-proves it with one read of the node. A lease lost
//! on the client's clock (renewal turned off and the ttl ran out) deletes
//! its node, so the next waiter proceeds.
//!
//! **Lock-delay.** With [`LockOptions::lock_delay`](lockcore::LockOptions::lock_delay)
//! the session's timeout is the ttl plus the delay while the holder counts
//! the ttl: the server deletes the nodes of a holder that died or was cut
//! off that long after it last heard from it, and every client of the
//! ensemble (kazoo's, Curator's) waits for that ([`LockDelay::Server`](lockcore::LockDelay::Server)).
//! A clean release deletes the node at once. The sum is bounded by the
//! server's `maxSessionTimeout`, like a ttl.
//!
//! **Fencing.** The token is the lock node's creation zxid (`czxid`): zxids
//! grow strictly across the whole ensemble and across leader elections, and
//! unlike sequence numbers they do not restart when a reaped parent is
//! created again ([`Fencing::Strict`](lockcore::Fencing)). A read-write
//! lock's writers' tokens rise strictly; a reader's is above every earlier
//! writer's and below every later one's.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let locker = lockcore_zk::connect("zk://127.0.0.1:2181,127.0.0.1:2182/app").await?;
//! // nodes /app/lockcore/jobs%2Fnightly/_c_<uuid>-lock-<seq>
//! let guard = locker.lock("jobs/nightly").await?;
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
pub mod config;
mod core;
mod error;
mod expire;
mod lease;
mod listing;
mod nodes;
mod recipe;
mod session;
mod signals;
mod wait;

pub use config::{AclMode, ZkConfig, NAME, SCHEMES};
pub use core::{ZkBackend, ZkCounters, ZkStats};

use lockcore::Locker;

/// Connects to the ensemble that `url` describes (see [`config`]) and
/// returns a [`Locker`] over it.
///
/// # Errors
///
/// As [`ZkConfig::parse`] and [`ZkBackend::connect`].
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect(url: &str) -> lockcore::Result<Locker> {
    let cfg = ZkConfig::parse(url)?;
    Ok(Locker::new(ZkBackend::connect(cfg).await?))
}

/// The parent node whose children queue for lock `name` under `cfg`
/// (chroot and prefix included).
///
/// ```
/// let cfg = lockcore_zk::ZkConfig::parse("zk://h:2181/app").unwrap();
/// assert_eq!(lockcore_zk::lock_parent(&cfg, "jobs/nightly"), "/app/lockcore/jobs%2Fnightly");
/// ```
pub fn lock_parent(cfg: &ZkConfig, name: &str) -> String {
    nodes::lock_parent(cfg, name)
}
