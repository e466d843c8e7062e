//! The backend: acquire a row lock on a connection of its own (a pooled
//! one when free), the fencing counter set in that transaction (or
//! committed on its own); inspect, list.

use std::time::{Duration, Instant};

use lockcore::raw::held_conn::HeldConn;
use lockcore::raw::prelude::*;
use lockcore::Role;

use crate::config::NAME;
use crate::core::{rw_row, MysqlBackend};
use crate::counter::Autocommit;
use crate::delay::Delayed;
use crate::lease::MysqlLease;
use crate::publish::publish;
use crate::slots::counter_row;
use crate::sql::FOREVER_CHUNK_SECS;

#[async_trait]
impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        // Waiting is the server's own row-lock wait: a commit or rollback
        // hands the row to a waiter at once (push), in no promised order.
        // The lease is the holding connection: each held lock keeps one.
        let fencing = if self.shared.cfg.fencing {
            Fencing::Strict
        } else {
            Fencing::None
        };
        // A lock-delay: a record beside the lock (see `acquire`), which
        // needs fencing and the table of lock-delays.
        let lock_delay = if self.shared.delays {
            LockDelay::Recorded
        } else {
            LockDelay::Unsupported
        };
        Capabilities::new(fencing, LeaseKind::Connection)
            .lock_delay(lock_delay)
            .push_wakeup(true)
            .inspect(self.shared.cfg.fencing)
            .values(self.shared.cfg.fencing && self.shared.values)
            .rw_layout(self.shared.cfg.rwlock)
            .semaphore_layout(self.shared.cfg.semaphore)
    }

    /// On a connection of its own, a transaction that locks the name's row
    /// (`NOWAIT` for a try, the server's lock wait otherwise; a read-write
    /// lock's row shared for a reader), then the fencing counter: set to
    /// the server's clock in that transaction for a lock's holder or a
    /// writer, else advanced and committed on another connection and
    /// followed by a round trip proving the transaction outlived the
    /// increment (see `counter.rs`).
    ///
    /// A lock-delay (locks and elections) is a record in the table of
    /// lock-delays: read in that last round trip, an unreleased
    /// predecessor's deadline is waited out while holding the row, then a
    /// holder with a lock-delay writes its own (see `delay.rs`), a
    /// holder without one deletes the predecessor's.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped acquisition closes its connection without a
    /// goodbye and `KILL`s its server thread in the background, which rolls
    /// the transaction back whatever it had locked, and deletes the
    /// lock-delay record it may have written.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let sh = self.shared.clone();
        let delayed = !req.lock_delay.is_zero();
        if delayed && !matches!(req.mode, Mode::Exclusive) {
            return Err(Error::invalid_config(
                NAME,
                "a lock-delay applies to locks and elections here, not to read-write locks or semaphores",
            ));
        }
        let ttl = whole_seconds(req.ttl);
        let first_wait = match req.deadline {
            Deadline::Now => 1,
            Deadline::At(t) => t.saturating_duration_since(Instant::now()).as_secs().max(1),
            Deadline::Never => FOREVER_CHUNK_SECS,
        };
        // From here, dropping `h` (an error, or this future dropped) closes
        // the connection and KILLs its thread: nothing stays locked.
        let h = self.open_transaction(ttl, first_wait).await?;
        let owner = req.owner.to_string();
        // A read-write lock's row is its own, beside the lock's of the same
        // name: readers lock it shared, writers for update. A permit is one
        // of the semaphore's slot rows, its counter one for all of them.
        let (mut h, taken) = match req.mode {
            Mode::Permit { permits } => {
                let wait = (ttl, first_wait);
                let (h, taken) = self
                    .take_slot(h, req.name, permits, req.deadline, wait)
                    .await?;
                (h, taken.map(|(row, at)| (row, counter_row(req.name), at)))
            }
            mode => {
                let mut h = h;
                let (row, shared) = match mode {
                    Mode::Read => (rw_row(req.name), true),
                    Mode::Write => (rw_row(req.name), false),
                    _ => (req.name.to_owned(), false),
                };
                // A holder alone sets its token with its locking read.
                let fence_for = (sh.cfg.fencing && !shared).then_some(owner.as_str());
                let at = self
                    .wait_for_row(&mut h, &row, req.deadline, first_wait, shared, fence_for)
                    .await?;
                (h, at.map(|at| (row.clone(), row, at)))
            }
        };
        let Some((row, counter, locked_at)) = taken else {
            self.give_back(h).await?;
            return Ok(None);
        };
        let conn_id = h.id.unwrap_or_default();
        let mut record_armed = None;
        let (fence, sent) = if sh.cfg.fencing {
            // The fencing counter, while the row is locked: set to the
            // clock in the holding transaction for a holder alone, else
            // advanced in its own committed statement (see `counter.rs`).
            let exclusive = matches!(req.mode, Mode::Exclusive);
            let held = h.fence.take();
            let fence = match held {
                Some(f) => f,
                None => self.next_fence(&counter, conn_id, owner.clone()).await?,
            };
            if let (true, Some(value)) = (exclusive, req.value) {
                self.record_value(&row, fence, value).await?;
            }
            // Prove the holding transaction outlived the increment: only
            // then is every later holder's increment after this one. A
            // lock's holder proves it by publishing itself, after its
            // fencing row and value are written, so that inspection finds
            // them written. A token set in the transaction needs no proof.
            // The validity counts from the sending of the next round trip
            // on the holding connection, which restarts its idle clock.
            let mut sent = Instant::now();
            if exclusive {
                // A second for a dying previous holder's user lock, unless
                // that would reach past the deadline (a renewal takes it
                // then).
                let wait = match req.deadline {
                    Deadline::Now => 0,
                    Deadline::At(t) if t <= Instant::now() + Duration::from_secs(1) => 0,
                    _ => 1,
                };
                let record = publish(&sh, &mut h, &row, wait, Some(fence), &owner).await?;
                match self
                    .honour_delay(&mut h, &row, fence, record, &owner, &req)
                    .await?
                {
                    Delayed::Refused => {
                        self.give_back(h).await?;
                        return Ok(None);
                    }
                    Delayed::Waited(at) => sent = at,
                    Delayed::No => {}
                }
                if delayed {
                    // Undone if this acquisition is dropped from here on.
                    record_armed = Some(self.arm_delay_clear(&row, &owner));
                    sh.autocommit(
                        Autocommit::DelaySet {
                            name: &row,
                            lease: req.ttl,
                            owner: &owner,
                        },
                        "recording the lock-delay",
                    )
                    .await?;
                    // The row still held once the record is written: a
                    // holding connection lost before that grants nothing.
                    self.prove_alive(&mut h).await?;
                }
            } else if held.is_some() && locked_at.elapsed() <= req.ttl / 10 {
                // A writer whose locking read, which set its token, was
                // quick: as without fencing, from that read's sending.
                sent = locked_at;
            } else {
                self.prove_alive(&mut h).await?;
            }
            (Some(fence), sent)
        } else if locked_at.elapsed() <= req.ttl / 10 {
            // The session's idle clock started with the locking read, which
            // was quick: count the validity from its sending.
            (None, locked_at)
        } else {
            // It waited: one round trip so that the validity counts from
            // now, not from when the wait began.
            let sent = Instant::now();
            self.prove_alive(&mut h).await?;
            (None, sent)
        };
        tracing::debug!(name = req.name, row, ?fence, conn_id, "row lock taken");
        let publishes = sh.cfg.fencing && matches!(req.mode, Mode::Exclusive);
        if let Some(armed) = record_armed {
            armed.disarm();
        }
        Ok(Some(Grant {
            lease: Box::new(MysqlLease {
                shared: sh,
                name: row,
                conn_id,
                delay_owner: delayed.then_some(owner),
                publish: publishes,
                lost: req.lost.clone(),
                conn: HeldConn::new(NAME, h),
            }),
            fence,
            valid_until: validity_deadline(sent, req.ttl),
        }))
    }

    /// The holder of a lock, with its token and value (`fencing=strict`
    /// only: the holder is found by the user lock it takes beside its
    /// fencing row). Waiters are not counted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        if !self.shared.cfg.fencing {
            return Ok(None);
        }
        self.inspect_row(name).await.map(Some)
    }

    /// The names whose rows are locked now: a lock's, an election's or a
    /// part's row, a read-write lock's (by a writer or readers), a
    /// semaphore's slot. The lock table is read in name order a page at a
    /// time, each page probed in one request that never waits; rows are
    /// never deleted, so the listing stops after a bounded number of rows
    /// (see `listing.rs`). Waiters are not seen. `None` on a server
    /// without `SKIP LOCKED` (MariaDB before 10.6, MySQL before 8.0).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        self.held_names(prefix, limit).await
    }

    /// What a probe that never waits can tell of a semaphore's slots and
    /// a read-write lock's row: one holder per slot held, one holder
    /// standing for every reader while readers hold, one for the writer
    /// while the row is held for update, none with an owner, token or
    /// ttl (the server names who holds a row only in its lock tables, for
    /// `PROCESS`). Readers with a writer waiting behind them show as a
    /// writer. `None` for a layout built from locks.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        self.role_holders(name, role).await
    }
}
