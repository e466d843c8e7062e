//! Waiting in a name's queue: the watch on the node before ours, the
//! permits of a semaphore, the nodes of other clients.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use lockcore::raw::prelude::*;
use zookeeper_client as zk;

use crate::config::NAME;
use crate::error::map_err;
use crate::lease::ZkLease;
use crate::nodes::{
    create_node, data_of, delete_for_good, delete_node, delete_ours, list, vanished, AbortOnDrop,
};
use crate::recipe;
use crate::session::Session;

use crate::core::ZkBackend;

impl ZkBackend {
    /// Waits until `pred` changes (it went, or a session event came: the
    /// caller looks again); false when `deadline` passed first.
    pub(crate) async fn watch_predecessor(
        &self,
        session: &Session,
        pred: &str,
        deadline: Deadline,
    ) -> Result<bool> {
        let watched = session
            .call(|c| async move { c.check_and_watch_stat(pred).await })
            .await;
        let watcher = match watched {
            Ok((Some(_), w)) => w,
            // Gone already: look again.
            Ok((None, _)) => return Ok(true),
            Err(e) => return Err(map_err(e, format!("watching {pred}"), false)),
        };
        let mut event = AbortOnDrop(tokio::spawn(watcher.changed()));
        tokio::select! {
            ev = &mut event.0 => {
                self.counters.predecessor_events.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(event = ?ev.ok().map(|e| e.event_type), %pred, "predecessor watch fired");
                Ok(true)
            }
            _ = session.dead() => Err(Error::unavailable(NAME, format!(
                "the ZooKeeper session ended while waiting: {}",
                session.reason().unwrap_or("closed")
            ))),
            () = deadline.sleep() => Ok(false),
        }
    }
}

/// A node of ours that reached the head of its queue.
pub(crate) struct Queued {
    pub(crate) path: String,
    pub(crate) czxid: i64,
    /// When the request that proved the session alive was sent.
    pub(crate) sent: Instant,
    /// Deletes the node unless disarmed.
    pub(crate) cleanup: CleanupOnDrop,
}

impl ZkBackend {
    /// Creates our node `<parent>/<prefix><seq>` and waits until it holds
    /// (see [`recipe::blocker`]), watching only the node it queues behind;
    /// `None` when `req.deadline` passed first (the node deleted).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call deletes its node in the background.
    pub(crate) async fn queue(
        &self,
        session: &Arc<Session>,
        parent: &str,
        prefix: &str,
        req: &AcquireRequest<'_>,
        started: Instant,
    ) -> Result<Option<Queued>> {
        let cleanup = CleanupOnDrop::new(
            "delete the lock node of a dropped acquisition",
            delete_ours(session.clone(), parent.to_owned(), prefix.to_owned()),
        );
        let creating = create_node(session, &self.acls, parent, prefix, req.owner, req.value);
        let (node, czxid) = within(
            NAME,
            format!("creating a lock node under {parent}"),
            session.request_timeout() * 2,
            true,
            creating,
        )
        .await?;
        let path = format!("{parent}/{node}");
        let mut first_look = true;
        loop {
            let sent = if std::mem::take(&mut first_look) {
                started
            } else {
                Instant::now()
            };
            let children = list(session, parent).await?;
            self.delete_twins(session, parent, prefix, &node, &children);
            let queue = recipe::contenders(children);
            let Some(pos) = queue.iter().position(|c| c.name == node) else {
                return Err(vanished(parent));
            };
            let Some(blocker) = recipe::blocker(&queue, pos) else {
                return Ok(Some(Queued {
                    path,
                    czxid,
                    sent,
                    cleanup,
                }));
            };
            if req.deadline.passed(Instant::now()) {
                cleanup.run_now().await;
                return Ok(None);
            }
            waiting();
            let pred = format!("{parent}/{}", blocker.name);
            if !self.watch_predecessor(session, &pred, req.deadline).await? {
                cleanup.run_now().await;
                return Ok(None);
            }
        }
    }

    /// Deletes, in the background, nodes of ours other than `node` (a
    /// create sent again after a connection loss may have left a twin).
    pub(crate) fn delete_twins(
        &self,
        session: &Arc<Session>,
        parent: &str,
        prefix: &str,
        node: &str,
        children: &[String],
    ) {
        for twin in children
            .iter()
            .filter(|c| c.starts_with(prefix) && *c != node)
        {
            let (s, p) = (session.clone(), format!("{parent}/{twin}"));
            spawn_cleanup("delete a twin lock node", async move {
                let _ = delete_node(&s, &p).await;
            });
        }
    }

    /// A permit of a semaphore of `permits`, in Curator's
    /// `InterProcessSemaphoreV2` layout: under the semaphore's mutex
    /// (`<name>/locks`), create `<name>/leases/_c_<uuid>-lease-<seq>`, and
    /// wait until `leases` has at most `permits` children; then let the
    /// mutex go. Waiters queue on the mutex, in arrival order; a try skips
    /// it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call deletes its lease node and its mutex
    /// node in the background.
    pub(crate) async fn acquire_permit(
        &self,
        session: &Arc<Session>,
        req: &AcquireRequest<'_>,
        permits: u32,
        started: Instant,
    ) -> Result<Option<Grant>> {
        let base = self.lock_parent(req.name);
        let (locks, leases) = (format!("{base}/locks"), format!("{base}/leases"));
        // A try does not queue on the mutex, which a waiter holds while it
        // waits: it counts the leases with its own among them, which is as
        // safe (a grant sees every lease created before its listing) and
        // only barges ahead of the waiters, as a try may.
        let mutex = if req.deadline == Deadline::Now {
            None
        } else {
            let Some(mutex) = self
                .queue(session, &locks, &mutex_prefix(req.owner), req, started)
                .await?
            else {
                return Ok(None);
            };
            Some(mutex)
        };
        let prefix = recipe::lease_prefix(req.owner);
        let cleanup = CleanupOnDrop::new(
            "delete the lease node of a dropped permit acquisition",
            delete_ours(session.clone(), leases.clone(), prefix.clone()),
        );
        let data = recipe::lease_data(permits);
        let creating = create_node(
            session,
            &self.acls,
            &leases,
            &prefix,
            req.owner,
            Some(&data),
        );
        let (node, czxid) = within(
            NAME,
            format!("creating a lease node under {leases}"),
            session.request_timeout() * 2,
            true,
            creating,
        )
        .await?;
        let path = format!("{leases}/{node}");
        let mut unchecked = true;
        loop {
            let sent = Instant::now();
            let listed = session
                .call(|c| {
                    let leases = &leases;
                    async move { c.list_and_watch_children(leases).await }
                })
                .await;
            let (children, watcher) = match listed {
                Ok(l) => l,
                Err(zk::Error::NoNode) => return Err(vanished(&leases)),
                Err(e) => return Err(map_err(e, format!("listing {leases}"), false)),
            };
            self.delete_twins(session, &leases, &prefix, &node, &children);
            if !children.contains(&node) {
                return Err(vanished(&leases));
            }
            // A twin of ours about to go counts once.
            let held = children
                .iter()
                .filter(|c| !c.starts_with(&prefix) || **c == node)
                .count();
            if held <= permits as usize {
                // The mutex goes in the background (sent at once, tried
                // again until done): admission is over, the permit holds.
                if let Some(mutex) = mutex {
                    mutex.cleanup.disarm();
                    let (s, prefix) = (session.clone(), mutex_prefix(req.owner));
                    spawn_cleanup("let a semaphore's mutex go", async move {
                        delete_for_good(s.clone(), mutex.path).await;
                        // A late twin of a create cut off by a connection loss.
                        delete_ours(s, locks, prefix).await;
                    });
                }
                cleanup.disarm();
                let lease = ZkLease::new(
                    session.clone(),
                    leases,
                    prefix,
                    path,
                    req.lost.clone(),
                    req.lock_delay,
                );
                return Ok(Some(Grant {
                    lease: Box::new(lease),
                    fence: u64::try_from(czxid).ok(),
                    valid_until: session.valid_until(sent, req.ttl),
                }));
            }
            // Full by our count: a client of ours counting otherwise is an
            // error, not a wait (looked at once per acquisition).
            let mismatch = if std::mem::take(&mut unchecked) {
                self.other_count(session, &leases, &children, &prefix, permits)
                    .await?
            } else {
                None
            };
            if let Some(other) = mismatch {
                cleanup.run_now().await;
                if let Some(mutex) = mutex {
                    mutex.cleanup.run_now().await;
                }
                return Err(Error::invalid_config(
                    NAME,
                    format!(
                        "semaphore {:?} is in use by a client that counts {other} permits, and this one counts {permits}: every client of a semaphore must count the same",
                        req.name
                    ),
                ));
            }
            if req.deadline.passed(Instant::now()) {
                cleanup.run_now().await;
                if let Some(mutex) = mutex {
                    mutex.cleanup.run_now().await;
                }
                return Ok(None);
            }
            let mut event = AbortOnDrop(tokio::spawn(watcher.changed()));
            tokio::select! {
                _ = &mut event.0 => {}
                _ = session.dead() => return Err(Error::unavailable(NAME, format!(
                    "the ZooKeeper session ended while waiting: {}",
                    session.reason().unwrap_or("closed")
                ))),
                () = req.deadline.sleep() => {
                    cleanup.run_now().await;
                    if let Some(mutex) = mutex {
                        mutex.cleanup.run_now().await;
                    }
                    return Ok(None);
                }
            }
        }
    }
}

impl ZkBackend {
    /// The count of permits another client of ours admits by, among the
    /// holders of `leases`, where it differs from `permits` (Curator's
    /// nodes say none, and are taken to agree).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub(crate) async fn other_count(
        &self,
        session: &Session,
        leases: &str,
        children: &[String],
        prefix: &str,
        permits: u32,
    ) -> Result<Option<u32>> {
        for c in children.iter().filter(|c| !c.starts_with(prefix)) {
            let Some((data, _)) = data_of(session, &format!("{leases}/{c}")).await? else {
                continue;
            };
            if let Some(n) = recipe::permits_of(&data).filter(|n| *n != permits) {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }
}

/// The prefix of our node on a semaphore's mutex.
pub(crate) fn mutex_prefix(owner: OwnerToken) -> String {
    recipe::node_prefix(owner, false, Mode::Exclusive)
}
