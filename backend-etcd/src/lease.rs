//! A held lock: its key, its lease and the key's create revision; renewal
//! by keepalive and a read of the key (the first one moves the key onto the
//! shared lease, `shared.rs`), release by a compare-guarded delete that
//! leaves a lease of its own spare for the next acquisition.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use lockcore::raw::prelude::*;
use lockcore::raw::retry::Backoff;
use lockcore::raw::sync::lock;

use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::error::{is_transient, On};
use crate::shared::{fresh, Moved};
use crate::spare::Spare;

/// One granted lock: its key, its lease and the key's create revision.
pub(crate) struct EtcdLease {
    backend: EtcdBackend,
    name: String,
    key: String,
    /// The key's hash, as the shared lease's key reads keep them.
    key_hash: u64,
    /// The lease it was granted with.
    lease: i64,
    rev: i64,
    ttl: Duration,
    /// Until when the lease is surely alive, as the last renewal showed.
    valid_until: Mutex<Instant>,
    /// Set by the first release: the lease may serve another lock since,
    /// so this handle neither renews nor releases (nor revokes) it again.
    finished: AtomicBool,
    /// The watchdog renews it: it may move onto the shared lease.
    movable: bool,
    /// How old a keepalive of the shared lease a renewal takes the answer
    /// of (`shared::fresh` of the holder's ttl).
    window: Duration,
    /// How old a read of the shared lease's keys a renewal takes (a third
    /// of the holder's ttl).
    check_window: Duration,
    /// The shared lease its key moved onto; 0 before.
    shared: AtomicI64,
    /// When it moved there (when the move's answer came).
    moved_at: OnceLock<Instant>,
    /// A move onto the shared lease was begun: it may have applied.
    move_sent: AtomicBool,
    /// Abandoned: no renewal moves it onto the shared lease any more.
    abandoned: AtomicBool,
}

impl EtcdLease {
    /// The lock `req` asked for, granted on `lease` with key `key` (create
    /// revision `rev`).
    pub(crate) fn new(
        backend: EtcdBackend,
        req: &AcquireRequest<'_>,
        key: String,
        lease: i64,
        rev: i64,
        valid_until: Instant,
    ) -> Self {
        let (name, ttl) = (req.name, req.ttl);
        let key_hash = backend.inner.keychecks.key_hash(key.as_bytes());
        EtcdLease {
            backend,
            name: name.to_owned(),
            key_hash,
            key,
            lease,
            rev,
            ttl,
            valid_until: Mutex::new(valid_until),
            finished: AtomicBool::new(false),
            movable: req.renew,
            window: fresh(ttl.saturating_sub(req.lock_delay)),
            check_window: ttl.saturating_sub(req.lock_delay) / 3,
            shared: AtomicI64::new(0),
            moved_at: OnceLock::new(),
            move_sent: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
        }
    }

    /// The lease the key is known to be on.
    fn on(&self) -> i64 {
        match self.shared.load(Ordering::Acquire) {
            0 => self.lease,
            shared => shared,
        }
    }

    /// Whether the server still has the lease the key is known to be on
    /// (time to live above zero).
    async fn lease_alive(&self, limit: Duration) -> Result<bool> {
        let mut lc = self.backend.inner.client.lease_client();
        let r = self
            .backend
            .request(
                limit,
                "reading the lease's time to live",
                false,
                lc.time_to_live(self.on(), None),
            )
            .await?;
        Ok(r.ttl() > 0)
    }
}

impl EtcdLease {
    /// Moves the key, wherever it is, onto a lease of its own that is
    /// never renewed, in the background.
    fn move_back(&self) {
        let b = &self.backend;
        spawn_cleanup(
            "move an abandoned etcd lock key off the shared lease",
            b.clone()
                .move_back(self.key.clone(), self.rev, self.ttl, b.op_timeout(self.ttl)),
        );
    }
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("key", &self.key)
            .field("lease", &format_args!("{:x}", self.on()))
            .field("revision", &self.rev)
            .finish()
    }
}

#[async_trait]
impl BackendLease for EtcdLease {
    /// One keepalive of the lease and one read of the key, in parallel:
    /// `Lost` when the lease is gone (ttl 0) or the key was deleted. The
    /// first renewal of a lock the watchdog renews moves its key onto the
    /// shared lease instead (`shared.rs`); later ones renew that lease,
    /// taking the answer of a keepalive sent within a twentieth of the ttl.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease, or moved
    /// the key onto the shared lease. The next renewal's move is answered
    /// with where the key is (and takes no validity until it is); a release
    /// or an abandon after it deals with the key wherever it is.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        self.check_ttl(ttl)?;
        if self.finished.load(Ordering::Acquire) {
            return Ok(Renewal::Lost);
        }
        let b = &self.backend;
        let limit = b.op_timeout(self.ttl);
        // Validity counts from no later than this (a move that may have
        // applied: the key may be on the shared lease).
        let mut cap = None;
        let shared = self.shared.load(Ordering::Acquire);
        if shared == 0 && self.movable && !self.abandoned.load(Ordering::SeqCst) {
            // An earlier move may have applied, its answer lost: until a
            // move is answered, the key may be on a shared lease this lock
            // does not renew, so no validity comes from its own.
            let unsettled = self.move_sent.load(Ordering::SeqCst);
            // Boxed: once per lock, and its requests' futures are large; in
            // line, every renewal would make room for them and copy it.
            let moving = b.move_to_shared(
                &self.key,
                self.rev,
                self.lease,
                self.ttl,
                self.window,
                limit,
                &self.move_sent,
            );
            let unsettled_error = || {
                Error::unavailable(
                    NAME,
                    format!(
                        "renewing the lock on {}: its key's move onto the shared lease is not settled",
                        b.inner.servers
                    ),
                )
            };
            let moved = match tokio::time::timeout(limit, Box::pin(moving)).await {
                Ok(moved) => moved,
                // Cut off before the move was sent: nothing changed.
                Err(_) if !self.move_sent.load(Ordering::SeqCst) => Moved::No { since: None },
                Err(_) => return Err(unsettled_error()),
            };
            match moved {
                Moved::Yes { to, since } => {
                    let _ = self.moved_at.set(Instant::now());
                    self.shared.store(to, Ordering::Release);
                    if self.abandoned.load(Ordering::SeqCst) {
                        // Abandoned meanwhile: off the shared lease again.
                        self.move_back();
                    }
                    let valid_until = validity_deadline(since, ttl);
                    *lock(&self.valid_until) = valid_until;
                    return Ok(Renewal::Renewed { valid_until });
                }
                Moved::Gone => return Ok(Renewal::Lost),
                Moved::No { .. } if unsettled => return Err(unsettled_error()),
                Moved::No { since } => cap = since,
            }
        }
        let (on, window) = match shared {
            0 => (self.lease, Duration::ZERO),
            s => (s, self.window),
        };
        let read = async {
            let checks = &b.inner.keychecks;
            let check = async {
                match self.moved_at.get() {
                    // One read of the shared lease's keys serves every lock
                    // on it: one sent after this lock moved, and within a
                    // third of its ttl.
                    Some(&moved) if shared != 0 => {
                        let recent = Instant::now().checked_sub(self.check_window);
                        let not_before = recent.map_or(moved, |r| r.max(moved));
                        checks.attached(shared, self.key_hash, not_before).await
                    }
                    _ => checks.still_there(&self.key, self.rev).await,
                }
            };
            let what = On("reading the lock key", &b.inner.servers);
            within(NAME, what, limit, false, check).await
        };
        let (alive, still) = tokio::join!(b.keep_alive_within(on, limit, window), read);
        let Some(sent) = alive? else {
            if shared != 0 {
                b.inner.shared.forget(whole_seconds(self.ttl), shared);
                b.inner.keychecks.forget(shared);
            }
            return Ok(Renewal::Lost);
        };
        if !still? {
            return Ok(Renewal::Lost);
        }
        let valid_until = validity_deadline(cap.map_or(sent, |c: Instant| c.min(sent)), ttl);
        *lock(&self.valid_until) = valid_until;
        Ok(Renewal::Renewed { valid_until })
    }

    /// A lock on the shared lease is renewed by that lease's latest
    /// keepalive and read of its keys when both are recent enough for
    /// [`renew`](BackendLease::renew) to take them, as it would. A
    /// keepalive answer three quarters through its window has the next
    /// keepalive sent in the background, once, so that the renewals due
    /// after it find a new answer instead of each waiting on one; a read
    /// of the keys fifteen sixteenths through its window, the next read.
    fn renew_known(&self, ttl: Duration) -> Option<Renewal> {
        let shared = self.shared.load(Ordering::Acquire);
        if ttl != self.ttl || shared == 0 || self.finished.load(Ordering::Acquire) {
            return None;
        }
        let moved = *self.moved_at.get()?;
        let inner = &self.backend.inner;
        // One reading of the clock for the renewal.
        let now = Instant::now();
        let sent = inner.keepalives.known(shared, self.window, now)??;
        let b = &self.backend;
        if inner.keepalives.ask_ahead(shared, sent, self.window, now) {
            // Within half the window: the answer taken now is not taken.
            b.keep_alive_ahead(shared, b.op_timeout(self.ttl), self.window / 2);
        }
        let recent = now.checked_sub(self.check_window);
        let not_before = recent.map_or(moved, |r| r.max(moved));
        // Fifteen sixteenths through the window (62 ms of a second, two
        // of the watchdog's grid steps): the next read is asked now, and
        // is in before the window ends when answered within the rest (or
        // the renewals after read, as `renew` does); about one read a
        // window.
        let ahead_after = now.checked_sub(self.check_window * 15 / 16);
        let (attached, ahead) =
            inner
                .keychecks
                .attached_known(shared, self.key_hash, not_before, ahead_after)?;
        if let Some(after) = ahead {
            b.read_keys_ahead(shared, after, b.op_timeout(self.ttl));
        }
        // A key found gone: `renew` reads the same, and says so.
        if !attached {
            return None;
        }
        let valid_until = validity_deadline(sent, ttl);
        *lock(&self.valid_until) = valid_until;
        Some(Renewal::Renewed { valid_until })
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
    /// it is revoked in the background. A key that may be on the shared
    /// lease leaves no lease spare, and when its delete fails it is deleted
    /// in the background, retried until the server answers.
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the key. A lease of
    /// its own then ends by its ttl as if the holder had died, and is never
    /// reused; a key that may be on the shared lease is deleted in the
    /// background.
    async fn release(&self) -> Result<Released> {
        if self.finished.swap(true, Ordering::AcqRel) {
            // Released before: the lease may be another lock's by now.
            return Ok(Released::NotHeld);
        }
        let b = &self.backend;
        let limit = b.op_timeout(self.ttl);
        let on_shared = self.move_sent.load(Ordering::Acquire);
        // The shared lease lives on with the other locks: a key left on it
        // must be deleted, whatever becomes of this call.
        let leftover = on_shared.then(|| {
            CleanupOnDrop::new(
                "delete a released etcd lock key on the shared lease",
                b.clone()
                    .delete_in_background(self.key.clone(), self.rev, limit),
            )
        });
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
                    // The key, if it is there, ends with the lease's ttl
                    // (or, on the shared lease, is deleted by `leftover`).
                    if !on_shared {
                        spawn_cleanup(
                            "revoke the lease of a released etcd lock",
                            b.clone().revoke(self.lease, limit),
                        );
                    }
                    return Err(Error::new(
                        ErrorKind::Indeterminate,
                        NAME,
                        format!("the lock key was gone when a retried delete came, and the lease could not be read to tell whether the first delete was ours: {e}"),
                    ));
                }
            };
        }
        if on_shared {
            // Answered: the key is gone (deleted now, or before).
            if let (Ok(_), Some(leftover)) = (&res, leftover) {
                leftover.disarm();
            }
            if self.shared.load(Ordering::Acquire) == 0 {
                // A move that may not have applied: its own lease, which
                // no lock may reuse, goes now that the delete is done.
                spawn_cleanup(
                    "revoke the lease of a released etcd lock",
                    b.clone().revoke(self.lease, limit),
                );
            }
        } else {
            let spare = Spare {
                id: self.lease,
                valid_until: *lock(&self.valid_until),
            };
            if !(deleted && b.inner.spares.put(whole_seconds(self.ttl), spare)) {
                spawn_cleanup(
                    "revoke the lease of a released etcd lock",
                    b.clone().revoke(self.lease, limit),
                );
            }
        }
        res?;
        Ok(if deleted {
            Released::Released
        } else {
            Released::NotHeld
        })
    }

    /// Nothing to stop: after the grant this lease is renewed only by the
    /// guard's watchdog, never in the background.
    /// The key stays on the server until the lease's ttl runs out, exactly
    /// as when the holding process dies. A key that may be on the shared
    /// lease, which the handle's other locks keep alive, is first moved in
    /// the background onto a lease of its own, granted then and never
    /// renewed.
    fn abandon(&self) {
        tracing::debug!(backend = NAME, key = %self.key, "lease abandoned; it ends by its ttl");
        // A renewal running now sees the flag after its move (SeqCst on
        // both sides: one of the two moves the key back).
        self.abandoned.store(true, Ordering::SeqCst);
        if self.move_sent.load(Ordering::SeqCst) && !self.finished.load(Ordering::Acquire) {
            self.move_back();
        }
    }
}
