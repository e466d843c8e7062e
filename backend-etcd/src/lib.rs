//! etcd backend for [`lockcore`]: leases, locks ordered by create revision,
//! interoperable with `etcdctl lock` and Go's `concurrency.Mutex`.
//!
//! **Keys.** A lock name `N` maps to the key range `<prefix>/<seg>/`, where
//! `<seg>` is [`encode_segment`](lockcore::name::encode_segment)`(N)` (ASCII
//! letters, digits and `-_~.` stay, every other byte becomes `%XX`, so `a/b`
//! is `a%2Fb`) and `<prefix>` is `lockcore` by default (`?prefix=` sets it;
//! empty is allowed). Each acquisition puts the key
//! `<prefix>/<seg>/<lease id in lowercase hex>`, attached to its lease, in a
//! transaction only if its create revision is 0. The holder is the key with
//! the smallest create revision in the range; a waiter watches only the
//! deletion of the key just before its own (read; watch from the server's
//! current revision; then look once whether that key is still there with
//! the create revision read, so a delete that came before the watch, even
//! one followed by a put of the same key, is not missed; a compacted watch
//! is read again). Since the encoded name
//! never contains `/`, the ranges of `a` and `a/b` (`lockcore/a/` and
//! `lockcore/a%2Fb/`) never overlap.
//!
//! This is the layout of etcd's own `concurrency.Mutex`, which `etcdctl lock
//! <pfx>` uses with `<pfx>` as its prefix. So `etcdctl lock lockcore/<seg>`
//! (for a plain name, `etcdctl lock lockcore/N`), or a Go service calling
//! `concurrency.NewMutex(session, "lockcore/<seg>")`, excludes and is
//! excluded by this backend; with `?prefix=` empty, `etcdctl lock N` does.
//! [`lock_range`] gives the string to pass.
//!
//! **Elections.** etcd's `concurrency.Election` uses the same layout, with
//! the candidate's value as the key's value (a plain lock puts its owner
//! token there, behind U+001F and `lockcore-owner `, so that `inspect`
//! names it; `concurrency.Mutex` neither writes nor reads the value).
//! A [`lockcore::Election`] puts its value there, and
//! [`inspect`](lockcore::raw::Backend::inspect) reads the holder key's value
//! back. So `etcdctl elect lockcore/<seg> <value>` campaigns beside this
//! backend's candidates (one leader among both), and `etcdctl elect -l
//! lockcore/<seg>` prints this backend's leader's value.
//!
//! **Leases.** Every acquisition puts its key on an etcd lease of its own,
//! granted with the lock's ttl (rounded up to whole seconds; the server may
//! raise it to its minimum, about 1.5 × the election timeout, which only
//! lengthens how long a dead holder's key lives). While the acquisition
//! waits, the waiting future renews its lease at ttl/3; once granted, the
//! guard's watchdog renews it at ttl/3 with one keepalive and one read of
//! the key, until the key moves onto the shared lease (below).
//!
//! **The shared lease.** At its first renewal, a lock the watchdog renews
//! moves its key onto a lease the backend shares among such locks of the
//! same ttl (in whole seconds), as `concurrency.Session` holds all its
//! mutexes on one lease: one transaction, compared on the key's create
//! revision, puts the key again with its value on the shared lease (the
//! create revision, the fencing token, stays), and the lease it leaves,
//! attached to nothing, is revoked (its id is in the key's name, so no
//! other lock may take it). A shared lease takes at most 2,048 moves; the
//! next get a new one. A renewal then takes the answer of a keepalive of
//! the shared lease sent within a twentieth of the holder's ttl (at most a
//! second), counting its validity from that keepalive, and checks its key
//! in one read of the shared lease's attached keys (`LeaseTimeToLive` with
//! keys) sent after the lock moved and at most a third of the ttl before.
//! So ten thousand held locks cost a few keepalives and reads a second, not
//! ten thousand of each. Each lock keeps its own validity and lost signal;
//! the shared lease's end (expired, revoked) loses every lock on it. A lock
//! renewed only by hand ([`LockOptions::renew`](lockcore::LockOptions::renew)
//! off, [`extend`](lockcore::LockGuard::extend)) never moves: it ends by its
//! own ttl when its holder stops. A release deletes the key (compared on its
//! create revision) and leaves the shared lease to the others; if that
//! delete fails or is cut off, it is retried in the background until the
//! server answers. An [`abandon`](lockcore::LockGuard::abandon)ed lock is
//! moved in the background onto a lease of its own, granted then and never
//! renewed, so it ends by its ttl, alone, as if its holder had died. A move
//! is compared on the lease the key is on, so one that reaches the server
//! late changes nothing; until a move is answered, the lock takes no
//! validity from its own lease (its renewals fail, and are retried). A lost
//! lock whose guard is kept, unreleased, stays on the shared lease until the
//! guard is released or dropped.
//!
//! The keepalives of a backend go on 16 long-lived `LeaseKeepAlive` streams
//! (a lease always on the same one), which carry any lease's id and answer
//! each in order (Go's `clientv3.Lease` keeps one; the server handles a
//! stream's requests one after another, so under a heavy write load one
//! stream falls behind thousands of renewals a second). The key reads
//! asked within 25 ms go to the server together, up to 64 in one read-only
//! transaction (fewer, found by halving, on a server whose `--max-txn-ops`
//! is lower). So holding thousands of locks costs 16 streams, a small
//! message per lease and renewal, and tens of requests a second, not a
//! stream set-up and reset per renewal. A stream that fails, or leaves any
//! keepalive unanswered past its renewal's request timeout, is
//! dropped and its waiting renewals fail (and are retried, as any failed
//! renewal, while the validity lasts). The lost
//! signal fires when a keepalive answers ttl 0, when the key is gone, or when
//! the validity deadline (send time of the keepalive whose answer the last
//! successful renewal took + ttl,
//! less the drift allowance of `lockcore::raw::validity_deadline`)
//! passes because the server could not be reached.
//!
//! **Recycling.** A lock released cleanly while its key is still on its own
//! lease (before its first renewal, or renewed only by hand; its key
//! deleted by the release) leaves that lease granted, attached to nothing, for the handle's next
//! acquisition with the same ttl (in whole seconds), of any name. The next
//! acquisition puts its key on that lease, renewing it beside the put unless
//! it was renewed within the drift allowance of a fresh grant. So a lock
//! cycle costs two durable writes (the key's put and its delete), as with
//! `concurrency.Mutex` on a session, instead of four (grant, put, delete,
//! revoke); keepalives are not durable writes. A spare lease is not kept
//! alive: one not taken while it has a request's time left ends by its ttl
//! on the server, with no key, and the spares left when the backend is
//! dropped are revoked. A lease is reused only after a release that deleted
//! its key (or whose retried delete found the key gone while the lease
//! still lived: only its holder deletes a key while its lease lives), and
//! only while its last successful renewal vouches for it; an
//! abandoned lease, one whose key is gone (lost), one whose release failed
//! or was dropped, and a second release through the same handle never give
//! a lease to another lock. At most 64 spare leases are kept per ttl. A
//! `try` that finds the name held, and a waiter that gives up, delete their
//! key (compared on its create revision) and keep their lease spare, as
//! `concurrency.Mutex`'s `TryLock` keeps its session; the lease is revoked
//! instead when that delete fails or is dropped halfway. A spare lease
//! whose renewal fails beside the put is revoked, and
//! the acquisition starts again on a new one.
//!
//! A lease of its own first, and the shared one only from the first
//! renewal: lockcore's ttl is chosen per acquisition; a lock cancelled
//! while its key's put is in flight must not leave that key on a lease the
//! other locks keep alive (its own lease is revoked instead, and the key
//! goes with it, whatever the server applied); two owners on one handle get
//! distinct keys (the key holds its own lease id); and a lock released
//! before its first renewal, the common short hold, costs no move.
//!
//! **Promises.** Strict fencing: the token is the key's create revision,
//! which rises with every write to the cluster, so successive holders of a
//! name get strictly larger tokens. Fair: waiters are served in arrival
//! order (create revision), and each watches only its predecessor (no
//! herd). A `try` on a held name returns `Ok(None)` after one transaction and
//! removes its key (one delete; the lease stays spare). A dropped acquisition revokes its
//! lease, so nothing stays queued or held even if the grant had already
//! happened on the server. A cut-off key creation is
//! [`Indeterminate`](lockcore::ErrorKind::Indeterminate) (its lease is being
//! revoked).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! let locker = lockcore_etcd::connect("etcd://127.0.0.1:2379,127.0.0.1:22379").await?;
//! // key "lockcore/jobs%2Fnightly/<lease hex>"; etcdctl: `etcdctl lock lockcore/jobs%2Fnightly`
//! let guard = locker.lock("jobs/nightly").await?;
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod acquire;
mod backend;
pub mod config;
mod core;
mod error;
mod grant;
mod keepalive;
mod keycheck;
mod keys;
mod lease;
mod moves;
mod multi;
mod shared;
mod spare;
mod wait;

pub use config::{EtcdConfig, DEFAULT_PREFIX, NAME, SCHEMES};
pub use core::{EtcdBackend, EtcdCounters, EtcdStats};

use lockcore::Locker;

/// Connects to the etcd members that `url` names (see [`config`]) and
/// returns a [`Locker`] over them.
///
/// # Errors
///
/// As [`EtcdConfig::parse`] and [`EtcdBackend::connect`].
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect(url: &str) -> lockcore::Result<Locker> {
    connect_config(EtcdConfig::parse(url)?).await
}

/// Like [`connect`], from parsed settings.
///
/// # Errors
///
/// As [`EtcdBackend::connect`].
///
/// # Cancel safety
///
/// Cancel safe: it creates no lock state.
pub async fn connect_config(cfg: EtcdConfig) -> lockcore::Result<Locker> {
    Ok(Locker::new(EtcdBackend::connect(cfg).await?))
}

/// The key range of lock `name` under `prefix`, ending in `/`: the lock's
/// keys are this plus a lease id in hex. Without the trailing `/` it is the
/// argument that `etcdctl lock` (or `concurrency.NewMutex`) needs to take the
/// same lock.
///
/// ```
/// assert_eq!(lockcore_etcd::lock_range("lockcore", "jobs/nightly"), "lockcore/jobs%2Fnightly/");
/// assert_eq!(lockcore_etcd::lock_range("", "plain"), "plain/");
/// ```
pub fn lock_range(prefix: &str, name: &str) -> String {
    keys::range_of(prefix.trim_end_matches('/'), name)
}
