//! The backend of a migrating pair: every acquire on both sides.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::lease::{keep_alive, relay_lost, undo_half, Halves, LostSignals, MigratingLease};
use super::migrating::{Migrating, NAME};
use super::offset::offset_fence;
use crate::capabilities::{Capabilities, Fencing, Layout, LeaseKind};
use crate::error::Result;
use crate::info::{HolderInfo, Listing, LockInfo, Role};
use crate::raw::sync::lock;
use crate::raw::{now, AcquireRequest, Backend, BackendLease, Grant};

/// The weaker of two fencing promises.
pub(super) fn weaker_fencing(a: Fencing, b: Fencing) -> Fencing {
    match (a, b) {
        (Fencing::None, _) | (_, Fencing::None) => Fencing::None,
        (Fencing::StrictWhileDataKept, _) | (_, Fencing::StrictWhileDataKept) => {
            Fencing::StrictWhileDataKept
        }
        _ => Fencing::Strict,
    }
}

/// The lease kind of a pair: a session's where either half is one (it
/// outlives a broken connection for its timeout), else a ttl's where
/// either half is one; a connection's only where both are. A dead holder's
/// name stays held as long as the half that keeps it longest: a
/// connection-kept half ends at once, the other half's ttl or session does
/// not (while the connection-kept half's server may free its half at once:
/// a new-only client of that backend can then take the name in that
/// window, see [`LeaseKind::Connection`]).
pub(super) fn pair_lease(a: LeaseKind, b: LeaseKind) -> LeaseKind {
    match (a, b) {
        (LeaseKind::Session, _) | (_, LeaseKind::Session) => LeaseKind::Session,
        (LeaseKind::Ttl, _) | (_, LeaseKind::Ttl) => LeaseKind::Ttl,
        _ => LeaseKind::Connection,
    }
}

/// The layout of a primitive on both backends, or
/// [`Layout::Unsupported`] when they differ.
fn same_layout(a: Layout, b: Layout) -> Layout {
    if a == b {
        a
    } else {
        Layout::Unsupported
    }
}

#[async_trait]
impl Backend for Migrating {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let (a, b) = (self.old.capabilities(), self.new.capabilities());
        Capabilities::new(
            weaker_fencing(a.fencing, b.fencing),
            pair_lease(a.lease, b.lease),
        )
        .fair(a.fair && b.fair)
        .push_wakeup(a.push_wakeup && b.push_wakeup)
        .inspect(a.inspect && b.inspect)
        .cross_process(a.cross_process && b.cross_process)
        .values(a.values && b.values)
        .rw_layout(same_layout(a.rw_layout, b.rw_layout))
        .semaphore_layout(same_layout(a.semaphore_layout, b.semaphore_layout))
        // A lost half releases the other at once (`relay_lost`), which
        // would end the delay early on that side.
        .lock_delay(crate::capabilities::LockDelay::Unsupported)
    }

    /// Takes `req.name` on the old backend, then on the new one, both by
    /// `req.deadline`. While it waits for the new backend, the old half is
    /// renewed; if the old half is lost meanwhile, it starts again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a drop after the old backend granted the name releases
    /// it there in the background; each backend undoes its own half-done
    /// step.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let mut owner = req.owner;
        let mut again = false;
        loop {
            // Each pass is a new attempt with an owner token of its own: a
            // backend's cleanup of the previous one (a ZooKeeper sweep of
            // its nodes, an etcd revoke of its lease) must not reach it.
            if again {
                owner = crate::raw::OwnerToken::random();
            }
            again = true;
            let old_lost = CancellationToken::new();
            let Some(old) = self
                .old
                .acquire(AcquireRequest {
                    name: req.name,
                    owner,
                    ttl: req.ttl,
                    lock_delay: req.lock_delay,
                    deadline: req.deadline,
                    lost: &old_lost,
                    value: req.value,
                    mode: req.mode,
                    renew: req.renew,
                })
                .await?
            else {
                return Ok(None);
            };
            let old_lease: Arc<dyn BackendLease> = Arc::from(old.lease);
            let undo_old = undo_half(&old_lease);
            let old_valid = Mutex::new(old.valid_until);
            let new_lost = CancellationToken::new();
            let acquiring = self.new.acquire(AcquireRequest {
                name: req.name,
                owner,
                ttl: req.ttl,
                lock_delay: req.lock_delay,
                deadline: req.deadline,
                lost: &new_lost,
                value: req.value,
                mode: req.mode,
                renew: req.renew,
            });
            let keeping = keep_alive(&*old_lease, req.ttl, &old_lost, &old_valid);
            let new = tokio::select! {
                biased;
                new = acquiring => Some(new),
                () = keeping => None,
            };
            let Some(new) = new else {
                // The old half was lost while we waited: start again (the
                // new backend's wait, dropped, undid itself).
                undo_old.run_now().await;
                continue;
            };
            let new = match new {
                Ok(Some(g)) => g,
                Ok(None) => {
                    undo_old.run_now().await;
                    return Ok(None);
                }
                Err(e) => {
                    undo_old.run_now().await;
                    return Err(e);
                }
            };
            let new_lease: Arc<dyn BackendLease> = Arc::from(new.lease);
            let undo_new = undo_half(&new_lease);
            let old_valid = *lock(&old_valid);
            if old_lost.is_cancelled() || now() >= old_valid {
                undo_new.run_now().await;
                undo_old.run_now().await;
                continue;
            }
            let fence = match offset_fence(new.fence, self.offset, self.capabilities().fencing) {
                Ok(f) => f,
                Err(e) => {
                    undo_new.run_now().await;
                    undo_old.run_now().await;
                    return Err(e);
                }
            };
            undo_new.disarm();
            undo_old.disarm();
            let done = CancellationToken::new();
            let halves = Arc::new(Halves {
                old: old_lease,
                new: new_lease,
                turn: tokio::sync::Mutex::new(()),
            });
            relay_lost(
                LostSignals {
                    old: old_lost,
                    new: new_lost,
                    guard: req.lost.clone(),
                },
                halves.clone(),
                done.clone(),
            );
            return Ok(Some(Grant {
                lease: Box::new(MigratingLease { halves, done }),
                fence,
                valid_until: old_valid.min(new.valid_until),
            }));
        }
    }

    /// The holder as the new backend sees it (with the offset applied to
    /// its token), else as the old backend does (an old-only client, or a
    /// migrating one between its two steps) but without a token: an old
    /// token is not comparable with the migrating ones, and reporting it
    /// would show terms going back around every hand-over. The waiters
    /// queued on either backend, where both can count them.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let (old, new) = tokio::join!(self.old.inspect(name), self.new.inspect(name));
        let (old, new) = (old?, new?);
        let fencing = self.capabilities().fencing;
        let new_holder = match new.as_ref().and_then(|i| i.holder.clone()) {
            Some(mut h) => {
                h.fence = offset_fence(h.fence, self.offset, fencing)?;
                Some(h)
            }
            None => None,
        };
        let old_holder = old.as_ref().and_then(|i| i.holder.clone()).map(|mut h| {
            h.fence = None;
            h
        });
        // Counted only where both backends can count.
        let waiters = match (
            old.as_ref().and_then(|i| i.waiters),
            new.as_ref().and_then(|i| i.waiters),
        ) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        if old.is_none() && new.is_none() {
            return Ok(None);
        }
        Ok(Some(LockInfo::new(new_holder.or(old_holder), waiters)))
    }

    /// The names either backend lists (once each); `None` when neither can
    /// list.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let (old, new) = tokio::join!(self.old.list(prefix, limit), self.new.list(prefix, limit));
        let (old, new) = (old?, new?);
        if old.is_none() && new.is_none() {
            return Ok(None);
        }
        let complete = [&old, &new]
            .iter()
            .all(|l| l.as_ref().is_none_or(|l| l.complete));
        let mut names: Vec<String> = new.into_iter().chain(old).flat_map(|l| l.names).collect();
        names.sort();
        names.dedup();
        let mut listing = Listing::bounded(names, limit);
        listing.complete &= complete;
        Ok(Some(listing))
    }

    /// The new backend's holders (tokens offset), else the old one's
    /// (without tokens, as [`inspect`](Backend::inspect) reports them).
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        let fencing = self.capabilities().fencing;
        if let Some(mut holders) = self.new.inspect_role(name, role).await? {
            if !holders.is_empty() {
                for h in &mut holders {
                    h.fence = offset_fence(h.fence, self.offset, fencing)?;
                }
                return Ok(Some(holders));
            }
        }
        Ok(self.old.inspect_role(name, role).await?.map(|mut holders| {
            for h in &mut holders {
                h.fence = None;
            }
            holders
        }))
    }
}
