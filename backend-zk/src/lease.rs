//! A held lock: our node on our session, watched so that the lost signal
//! fires when the node is deleted by someone else (the session raises it
//! when the session ends).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockcore::raw::prelude::*;
use zookeeper_client as zk;

use crate::error::{is_session_end, map_err};
use crate::nodes::{delete_node, delete_ours, watch_fired};
use crate::session::Session;

/// What a lease shares with its task, in one allocation: the task's
/// future keeps one pointer, not one for each.
struct Node {
    session: Arc<Session>,
    path: NodePath,
    lost: CancellationToken,
    flags: Flags,
}

/// Flags shared by a lease and its watch task.
#[derive(Debug, Default)]
struct Flags {
    released: AtomicBool,
    abandoned: AtomicBool,
    gone: AtomicBool,
    /// The node's watch is not set, or fired and is not yet set again:
    /// a renewal reads the node itself rather than trust the watch.
    unwatched: AtomicBool,
}

/// Our node's path, and where in it the lock's parent node and our nodes'
/// name prefix (our uuid) end: one string a lease, not three.
struct NodePath {
    path: Box<str>,
    parent_end: u32,
    prefix_end: u32,
}

impl NodePath {
    /// `path` is `parent/prefix` and the sequence ZooKeeper appended. Were
    /// it not, the parent is what comes before its last `/` and the prefix
    /// the whole node name (a sweep by it finds only this node).
    fn new(parent: &str, prefix: &str, path: String) -> Self {
        let parent_end = match path.strip_prefix(parent) {
            Some(rest) if rest.starts_with('/') => parent.len(),
            _ => path.rfind('/').unwrap_or(0),
        };
        let node = path.get(parent_end + 1..).unwrap_or("");
        let prefix_end = if node.starts_with(prefix) {
            parent_end + 1 + prefix.len()
        } else {
            path.len()
        };
        // Ends kept in 32 bits (a node path is under ZooKeeper's
        // `jute.maxbuffer`, 1 MiB by default): one that does not fit is
        // the whole path, as a parent or prefix not found is.
        let end = |at: usize| u32::try_from(at).unwrap_or(u32::MAX);
        NodePath {
            path: path.into(),
            parent_end: end(parent_end),
            prefix_end: end(prefix_end),
        }
    }

    fn parent(&self) -> String {
        let parent = self.path.get(..self.parent_end as usize);
        parent.unwrap_or("").to_owned()
    }

    fn prefix(&self) -> String {
        let prefix = self
            .path
            .get((self.parent_end as usize).saturating_add(1)..self.prefix_end as usize);
        prefix.unwrap_or(&self.path).to_owned()
    }
}

/// One held lock: our node on our session.
pub(crate) struct ZkLease {
    node: Arc<Node>,
    task: tokio::task::AbortHandle,
    /// The key of our lost signal among the session's
    /// ([`Session::on_end_raise`]); `usize::MAX` once taken out.
    signal: AtomicUsize,
    /// The lock-delay, counted in every renewal's ttl: the holder's own ttl
    /// is the rest.
    delay: Duration,
}

impl fmt::Debug for ZkLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLease")
            .field("path", &self.node.path.path)
            .field("session", &format_args!("{:#x}", self.node.session.id))
            .finish_non_exhaustive()
    }
}

impl ZkLease {
    pub(crate) fn new(
        session: Arc<Session>,
        parent: String,
        prefix: String,
        path: String,
        lost: CancellationToken,
        delay: Duration,
    ) -> Self {
        let signal = session.on_end_raise(&lost);
        let node = Arc::new(Node {
            session,
            path: NodePath::new(&parent, &prefix, path),
            lost,
            flags: Flags {
                unwatched: AtomicBool::new(true),
                ..Flags::default()
            },
        });
        let task = tokio::spawn(watch_lease(node.clone())).abort_handle();
        ZkLease {
            node,
            task,
            signal: AtomicUsize::new(signal),
            delay,
        }
    }
}

impl ZkLease {
    /// Takes our lost signal out of the session's (once).
    fn forget_signal(&self) {
        let key = self.signal.swap(usize::MAX, Ordering::SeqCst);
        if key != usize::MAX {
            self.node.session.forget_lost(key);
        }
    }

    /// A renewal that reads our node itself: it exists on our live session.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn read_node(&self, ttl: Duration) -> Result<Renewal> {
        let sent = std::time::Instant::now();
        let session = &self.node.session;
        let stat = session
            .call(|c| {
                let path = &*self.node.path.path;
                async move { c.check_stat(path).await }
            })
            .await;
        match stat {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id => Ok(Renewal::Renewed {
                valid_until: session.valid_until(sent, ttl),
            }),
            Ok(_) => Ok(Renewal::Lost),
            Err(e) if is_session_end(&e) => Ok(Renewal::Lost),
            Err(e) => Err(map_err(
                e,
                format!("checking the lock node {}", self.node.path.path),
                false,
            )),
        }
    }
}

/// Raises the lost signal when our node is deleted by someone else (the
/// session raises it when the session ends: [`Session::on_end_raise`]);
/// deletes our node when the lease is lost on the client side (validity
/// deadline passed), so the next waiter gets it.
///
/// A held lease's task waits here for the whole hold, one per lease: its
/// future keeps one pointer (an async block, not an async fn's argument
/// and its copy) and, while it waits, only the watch and the lost signal
/// (the setting of the watch is a future of its own).
#[allow(clippy::manual_async_fn)] // an async fn would keep its argument twice
fn watch_lease(node: Arc<Node>) -> impl Future<Output = ()> + Send + 'static {
    async move {
        // Fields read where used, not bound across the waits: the future
        // keeps the one pointer.
        loop {
            let set = set_watch(&node.session, &node.path.path, &node.lost, &node.flags);
            let Some(watcher) = Box::pin(set).await else {
                return;
            };
            tokio::select! {
                () = watch_fired(watcher) => {
                    node.flags.unwatched.store(true, Ordering::SeqCst);
                    continue;
                }
                _ = node.lost.cancelled() => {
                    let flags = &node.flags;
                    // Lost with its session (raised by its end): an ended
                    // session deletes nothing, the server deletes the node
                    // as it expires the session.
                    let ended = node.session.is_dead();
                    if !ended && !flags.abandoned.load(Ordering::SeqCst) && !flags.released.load(Ordering::SeqCst) {
                        // Lost on the client's clock: free the name on the server.
                        let path = &node.path.path;
                        if let Ok(true) = Box::pin(delete_node(&node.session, path)).await {
                            tracing::debug!(node = %path, "deleted the node of a lost lease");
                        }
                        node.flags.gone.store(true, Ordering::SeqCst);
                    }
                    return;
                }
            }
        }
    }
}

/// Sets the watch on our node: `None` when the lease ended (the node is
/// gone, or the session), with the lost signal raised where it is lost.
async fn set_watch(
    session: &Session,
    path: &str,
    lost: &CancellationToken,
    flags: &Flags,
) -> Option<zk::OneshotWatcher> {
    loop {
        let watched = session
            .call(|c| async move { c.check_and_watch_stat(path).await })
            .await;
        match watched {
            Ok((Some(_), w)) => {
                flags.unwatched.store(false, Ordering::SeqCst);
                return Some(w);
            }
            Ok((None, _)) => {
                flags.gone.store(true, Ordering::SeqCst);
                if !flags.released.load(Ordering::SeqCst) {
                    tracing::warn!(node = %path, "our lock node was deleted by someone else");
                    lost.cancel();
                }
                return None;
            }
            Err(e) if is_session_end(&e) || session.is_dead() => {
                lost.cancel();
                return None;
            }
            Err(_) => {
                // No answer within the request timeout, the session still
                // alive: look again (the monitor ends the session once it
                // has been disconnected for about its timeout).
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[async_trait]
impl BackendLease for ZkLease {
    /// A ttl above the session timeout cannot be kept (the session cannot
    /// be lengthened).
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        self.node.session.check_ttl(ttl)
    }

    /// Proves our session alive, with one request shared by every lease
    /// on the session renewing at the time ([`Session::prove_alive`]); our
    /// node's deletion by anyone else is seen by its watch, which raises
    /// lost. While the watch is not set (before it is first set, or after
    /// it fired and until it is set again), the renewal reads our node
    /// itself. A `ttl` above the session timeout is refused with
    /// `InvalidConfig` (the session cannot be lengthened).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        if self.node.session.is_dead() || self.node.flags.gone.load(Ordering::SeqCst) {
            return Ok(Renewal::Lost);
        }
        BackendLease::check_ttl(self, ttl)?;
        if self.node.flags.unwatched.load(Ordering::SeqCst) {
            return self.read_node(ttl).await;
        }
        // A proof sent up to a twentieth of the holder's ttl ago will do.
        let max_age = ttl.saturating_sub(self.delay) / 20;
        match self.node.session.prove_alive(max_age).await {
            Ok(_) if self.node.flags.gone.load(Ordering::SeqCst) || self.node.session.is_dead() => {
                Ok(Renewal::Lost)
            }
            // The watch fired meanwhile: read the node.
            Ok(_) if self.node.flags.unwatched.load(Ordering::SeqCst) => self.read_node(ttl).await,
            Ok(sent) => Ok(Renewal::Renewed {
                valid_until: self.node.session.valid_until(sent, ttl),
            }),
            Err(e) if is_session_end(&e) => Ok(Renewal::Lost),
            Err(e) => Err(map_err(
                e,
                format!(
                    "checking the session of the lock node {}",
                    self.node.path.path
                ),
                false,
            )),
        }
    }

    /// Renewed by the session's latest proof of life while the node is
    /// watched, when [`renew`](BackendLease::renew) would take that proof.
    fn renew_known(&self, ttl: Duration) -> Option<Renewal> {
        let flags = &self.node.flags;
        let ok = |f: &std::sync::atomic::AtomicBool| !f.load(Ordering::SeqCst);
        if !ok(&flags.gone) || !ok(&flags.unwatched) || BackendLease::check_ttl(self, ttl).is_err()
        {
            return None;
        }
        let sent = self
            .node
            .session
            .known_proof(ttl.saturating_sub(self.delay) / 20)?;
        // Looked at after the proof, as `renew` does.
        if !ok(&flags.gone) || !ok(&flags.unwatched) || self.node.session.is_dead() {
            return None;
        }
        Some(Renewal::Renewed {
            valid_until: self.node.session.valid_until(sent, ttl),
        })
    }

    /// Deletes our node (never another owner's: the path carries our uuid).
    ///
    /// # Cancel safety
    ///
    /// A dropped release may or may not have deleted the node; dropping the
    /// lease then deletes it in the background.
    async fn release(&self) -> Result<Released> {
        self.node.flags.released.store(true, Ordering::SeqCst);
        self.task.abort();
        // A released lease is not lost by its session's end.
        self.forget_signal();
        if self.node.flags.gone.load(Ordering::SeqCst) {
            return Ok(Released::NotHeld);
        }
        let res = delete_node(&self.node.session, &self.node.path.path).await;
        if !self.node.session.is_dead() {
            // A creation cut off by a connection loss may have applied late,
            // leaving a second node of ours in the queue: sweep our uuid's
            // nodes (in the background: the release is done).
            spawn_cleanup(
                "delete late twins of a released lock node",
                delete_ours(
                    self.node.session.clone(),
                    self.node.path.parent(),
                    self.node.path.prefix(),
                ),
            );
        }
        match res {
            Ok(true) => {
                self.node.flags.gone.store(true, Ordering::SeqCst);
                Ok(Released::Released)
            }
            Ok(false) => {
                self.node.flags.gone.store(true, Ordering::SeqCst);
                Ok(Released::NotHeld)
            }
            Err(_) if self.node.session.is_dead() => {
                // The session ended: its ephemeral node went with it.
                self.node.flags.gone.store(true, Ordering::SeqCst);
                Ok(Released::NotHeld)
            }
            Err(e) => Err(e),
        }
    }

    /// Ends this lease's whole session without a goodbye, as a crash would:
    /// the server expires it after the session timeout and deletes the node
    /// then. Other leases of this backend on the same session (same ttl)
    /// are lost with it, as they would be in a crash.
    fn abandon(&self) {
        self.node.flags.abandoned.store(true, Ordering::SeqCst);
        self.task.abort();
        // Lost by its holder's abandon, which says why, not by the end of
        // the session it takes down.
        self.forget_signal();
        self.node.session.kill("abandoned (as if the process died)");
    }
}

impl Drop for ZkLease {
    fn drop(&mut self) {
        self.task.abort();
        self.forget_signal();
        if self.node.flags.gone.load(Ordering::SeqCst)
            || self.node.flags.abandoned.load(Ordering::SeqCst)
            || self.node.session.is_dead()
        {
            return;
        }
        spawn_cleanup(
            "delete the node of a dropped lease",
            delete_ours(
                self.node.session.clone(),
                self.node.path.parent(),
                self.node.path.prefix(),
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::NodePath;

    #[test]
    fn a_node_path_gives_back_its_parent_and_prefix() {
        let p = NodePath::new(
            "/app/locks/a",
            "_c_u1-lock-",
            "/app/locks/a/_c_u1-lock-0000000007".into(),
        );
        assert_eq!(
            (p.parent().as_str(), p.prefix().as_str()),
            ("/app/locks/a", "_c_u1-lock-")
        );
        // Not laid out as expected: the parent by the last `/`, the prefix
        // the whole node name.
        let q = NodePath::new(
            "/other",
            "_c_u2-",
            "/app/locks/a/_c_u1-lock-0000000007".into(),
        );
        assert_eq!(
            (q.parent().as_str(), q.prefix().as_str()),
            ("/app/locks/a", "_c_u1-lock-0000000007")
        );
        let r = NodePath::new(
            "/app/locks/a",
            "_c_u2-",
            "/app/locks/a/_c_u1-lock-0000000007".into(),
        );
        assert_eq!(r.prefix(), "_c_u1-lock-0000000007");
    }
}
