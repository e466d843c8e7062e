//! The backend: acquire by the ephemeral-sequential recipe, the lease, inspection.

use std::time::Instant;

use lockcore::raw::prelude::*;
use lockcore::Role;

use crate::config::NAME;
use crate::lease::ZkLease;
use crate::nodes::{data_of, list, since_of, sync_with_leader};
use crate::recipe;

use crate::core::ZkBackend;

#[async_trait]
impl Backend for ZkBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        // A lock-delay lengthens the session's timeout: the server ends a
        // session, and deletes its nodes, `ttl + delay` after it last heard
        // from it, while the holder counts `ttl`.
        Capabilities::new(Fencing::Strict, LeaseKind::Session)
            .lock_delay(LockDelay::Server)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
            .rw_layout(self.cfg.rwlock)
            .semaphore_layout(self.cfg.semaphore)
    }

    /// Creates `_c_<uuid>-lock-<seq>` (`-latch-` with a value, `-__READ__`
    /// and `-__WRIT__` for a reader and a writer) under the name's parent,
    /// then waits for the node it queues behind to go, watching only it:
    /// its predecessor of its own kind, or for a reader the last writer
    /// before it (see the crate docs for the kinds).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped acquisition deletes its node in the background
    /// (found by its uuid, also when the create was cut off by a connection
    /// loss).
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        // The validity of a lease granted at the first look is measured from
        // here: before the session and the node existed, so conservative.
        let started = Instant::now();
        let session = self.session(req.ttl).await?;
        session.check_ttl(req.ttl)?;
        if let Mode::Permit { permits } = req.mode {
            return self.acquire_permit(&session, &req, permits, started).await;
        }
        let parent = self.lock_parent(req.name);
        let prefix = recipe::node_prefix(req.owner, req.value.is_some(), req.mode);
        let Some(ours) = self
            .queue(&session, &parent, &prefix, &req, started)
            .await?
        else {
            return Ok(None);
        };
        ours.cleanup.disarm();
        let lease = ZkLease::new(
            session.clone(),
            parent,
            prefix,
            ours.path,
            req.lost.clone(),
            req.lock_delay,
        );
        Ok(Some(Grant {
            lease: Box::new(lease),
            fence: u64::try_from(ours.czxid).ok(),
            valid_until: session.valid_until(ours.sent, req.ttl),
        }))
    }

    /// The name's lock: its first contender is the holder, the others
    /// wait. A read-write lock's readers and writers on the name are not
    /// the lock's, and are not shown.
    ///
    /// The reads are preceded by a `sync` on the name's parent, so they see
    /// every acquisition and release acknowledged before the call, also
    /// those made on another session, through another server of the
    /// ensemble (a follower answers reads from what it has applied so far;
    /// barring a change of leader in between, as `sync` is not itself a
    /// quorum operation). That is one more round trip per call.
    /// [`Election::leader`] and its observer read through here.
    ///
    /// [`Election::leader`]: lockcore::Election::leader
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (a `sync` changes nothing).
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        let parent = self.lock_parent(name);
        // Our session's server may lag behind the server of the session
        // that acquired or released: catch it up with the leader first.
        // Later listings on this session (the rounds below) never see an
        // older state than this one.
        sync_with_leader(&session, &parent).await?;
        // A listed node may go before it is read (a release): the first
        // listed node that still exists is the holder, since every node
        // created after the listing sorts after it. Only when all are gone
        // is the name listed again.
        for _ in 0..INSPECT_ROUNDS {
            let mut queue = recipe::contenders(list(&session, &parent).await?);
            queue.retain(|c| c.kind.is_lock());
            if queue.is_empty() {
                return Ok(Some(LockInfo::new(None, Some(0))));
            }
            for (i, node) in queue.iter().enumerate() {
                let Some((data, stat)) =
                    data_of(&session, &format!("{parent}/{}", node.name)).await?
                else {
                    continue;
                };
                // The node's data is a candidate's value, or the owner token
                // of a plain lock of ours (not a value), or what another
                // client wrote (Curator writes the host address).
                let value = Some(String::from_utf8_lossy(&data).into_owned())
                    .filter(|v| !recipe::is_own_token(&node.name, v));
                let holder = HolderInfo::new(
                    Some(recipe::owner_of(&node.name)),
                    u64::try_from(stat.czxid).ok(),
                    None,
                )
                .with_value(value)
                .with_since(since_of(&stat));
                return Ok(Some(LockInfo::new(Some(holder), Some(queue.len() - i - 1))));
            }
        }
        Err(Error::backend_error(
            NAME,
            format!("every contender of {parent} was gone by the time it was read, {INSPECT_ROUNDS} times over"),
        ))
    }

    /// The names whose parent node, a child of the base path
    /// (`<chroot><prefix>`), has a contender: a holder or a waiter of a
    /// lock, an election, a read-write lock, or a semaphore (a lease or a
    /// waiter on its mutex). Parent nodes are flat (a name's `/` is
    /// encoded), so every name is one child, decoded back; children that
    /// are not the encoding of a name are left out. After a `sync`, as
    /// `inspect`; one listing per candidate name, in name order, until
    /// `limit` are found.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        let names =
            crate::listing::held_names(&session, &self.cfg, prefix, limit.saturating_add(1))
                .await?;
        Ok(Some(Listing::bounded(names, limit)))
    }

    /// The readers holding now (`__READ__` nodes before the first writer),
    /// the writer holding now (a `__WRIT__` node first in the read-write
    /// lock's queue), or the permits held (the semaphore's lease nodes, see
    /// the crate docs), with owner, token (`czxid`) and `since` (`ctime`)
    /// read from each node; `None` for a primitive laid out from locks
    /// (`rwlock=built`, `semaphore=built`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        if !crate::listing::is_native(&self.cfg, role) {
            return Ok(None);
        }
        let session = self.session(lockcore::DEFAULT_TTL).await?;
        crate::listing::role_holders(&session, &self.cfg, name, role).await
    }
}

/// How often `inspect` lists again when every listed node went before it
/// was read.
const INSPECT_ROUNDS: usize = 8;
