//! The recipe's node operations on a session: create our node (found
//! again by our uuid after a cut-off creation), list the contenders, delete
//! our nodes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockcore::name::encode_segment;
use lockcore::raw::OwnerToken;
use lockcore::{Error, ErrorKind, Result};
use zookeeper_client as zk;

use crate::config::{ZkConfig, NAME};
use crate::error::{is_connection_error, map_err};
use crate::session::Session;

/// How often a create is retried when a container parent is reaped under it.
const MAX_PARENT_RETRIES: usize = 8;

/// Creates our ephemeral sequential node; returns its name and czxid.
/// A creation cut off by a lost connection may have applied: it is
/// looked for by our uuid before it is sent again.
pub(crate) async fn create_node(
    session: &Session,
    acls: &[zk::Acl],
    parent: &str,
    prefix: &str,
    owner: OwnerToken,
    value: Option<&str>,
) -> Result<(String, i64)> {
    let full = format!("{parent}/{prefix}");
    // The node's data: a candidate's value, else the owner token.
    let data = value.map_or_else(|| owner.to_string(), str::to_owned);
    let acls = zk::Acls::new(acls);
    let opts = zk::CreateMode::EphemeralSequential.with_acls(acls);
    let creating = || format!("creating a lock node under {parent}");
    let mut parent_retries = 0;
    let mut cut_off = 0;
    loop {
        let created = session
            .once(|c| {
                let (full, data, opts) = (&full, data.as_bytes(), &opts);
                async move { c.create(full, data, opts).await }
            })
            .await;
        match created {
            Ok((stat, seq)) => {
                let name = format!("{prefix}{seq}");
                let czxid = if stat.czxid > 0 {
                    stat.czxid
                } else {
                    // Servers before 3.5 give no stat on create.
                    czxid_of(session, &format!("{parent}/{name}"))
                        .await?
                        .ok_or_else(|| vanished(parent))?
                };
                return Ok((name, czxid));
            }
            Err(zk::Error::NoNode) if parent_retries < MAX_PARENT_RETRIES => {
                parent_retries += 1;
                let dir = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
                let made = session
                    .call(|c| {
                        let dir = &dir;
                        async move { c.mkdir(parent, dir).await }
                    })
                    .await;
                match made {
                    Ok(()) | Err(zk::Error::NodeExists) => {}
                    Err(e) => {
                        return Err(map_err(
                            e,
                            format!("creating the lock parent {parent}"),
                            false,
                        ))
                    }
                }
            }
            Err(e) if is_connection_error(&e) && cut_off < MAX_CUT_OFF => {
                cut_off += 1;
                session
                    .reconnected()
                    .await
                    .map_err(|e| map_err(e, creating(), true))?;
                let children = list(session, parent)
                    .await
                    .map_err(|e| map_err_kind(e, ErrorKind::Indeterminate))?;
                if let Some(name) = children.into_iter().find(|c| c.starts_with(prefix)) {
                    if let Some(czxid) = czxid_of(session, &format!("{parent}/{name}")).await? {
                        return Ok((name, czxid));
                    }
                }
            }
            Err(e) => return Err(map_err(e, creating(), true)),
        }
    }
}

/// How often a cut-off creation is looked for and sent again.
const MAX_CUT_OFF: usize = 3;

/// `e` with its kind replaced (a failed read after a cut-off creation leaves
/// the creation's outcome unknown).
fn map_err_kind(e: Error, kind: ErrorKind) -> Error {
    if matches!(e.kind(), ErrorKind::Unavailable) {
        Error::new(kind, NAME, e.message().to_owned())
    } else {
        e
    }
}

/// The czxid of `path`, or `None` when it does not exist.
pub(crate) async fn czxid_of(session: &Session, path: &str) -> Result<Option<i64>> {
    session
        .call(|c| async move { c.check_stat(path).await })
        .await
        .map(|stat| stat.map(|s| s.czxid))
        .map_err(|e| map_err(e, format!("reading {path}"), false))
}

/// The data and stat of `path`, or `None` when it does not exist.
pub(crate) async fn data_of(session: &Session, path: &str) -> Result<Option<(Vec<u8>, zk::Stat)>> {
    match session
        .call(|c| async move { c.get_data(path).await })
        .await
    {
        Ok((data, stat)) => Ok(Some((data, stat))),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(map_err(e, format!("reading {path}"), false)),
    }
}

/// When a node was created, by the server's clock: its stat's `ctime`
/// (milliseconds since the Unix epoch), `None` for a stat without one.
pub(crate) fn since_of(stat: &zk::Stat) -> Option<SystemTime> {
    u64::try_from(stat.ctime)
        .ok()
        .filter(|ms| *ms > 0)
        .and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
}

/// The parent node of lock `name` under `cfg`.
pub(crate) fn lock_parent(cfg: &ZkConfig, name: &str) -> String {
    format!("{}/{}", cfg.base(), encode_segment(name))
}

pub(crate) fn vanished(parent: &str) -> Error {
    Error::unavailable(
        NAME,
        format!("our lock node under {parent} vanished while acquiring (session expired, or deleted by an operator)"),
    )
}

/// Brings the server this session is connected to up to date with the
/// leader (ZooKeeper's `sync` on `path`), so that the reads sent after it
/// see every write acknowledged before it, whichever session or server made
/// it. A follower answers reads from what it has applied, which may lag
/// behind a write another session's server already acknowledged. One round
/// trip; `path` need not exist (a missing node is not an error).
///
/// # Cancel safety
///
/// Cancel safe: it changes nothing on the server.
pub(crate) async fn sync_with_leader(session: &Session, path: &str) -> Result<()> {
    match session.call(|c| async move { c.sync(path).await }).await {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(e) => Err(map_err(e, format!("syncing {path} with the leader"), false)),
    }
}

/// Children of `parent`; `NoNode` is empty.
pub(crate) async fn list(session: &Session, parent: &str) -> Result<Vec<String>> {
    match session
        .call(|c| async move { c.list_children(parent).await })
        .await
    {
        Ok(c) => Ok(c),
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(map_err(e, format!("listing {parent}"), false)),
    }
}

/// Deletes `path` (ours by its uuid), retried across connection losses.
/// Returns whether it was there (a deletion cut off by a connection loss,
/// then found gone, counts as done by us).
pub(crate) async fn delete_node(session: &Session, path: &str) -> Result<bool> {
    let mut tries = 0u32;
    let r = session
        .call(|c| {
            tries += 1;
            async move { c.delete(path, None).await }
        })
        .await;
    match r {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode) => Ok(tries > 1),
        Err(e) => Err(map_err(e, format!("deleting {path}"), true)),
    }
}

/// Deletes every child of `parent` that starts with `prefix` (our uuid),
/// tried again while the session lives (as Curator's guaranteed delete):
/// a node of ours left on a live session would hold its queue for as long
/// as the session lasts, which other leases on it may keep open for good.
pub(crate) async fn delete_ours(session: Arc<Session>, parent: String, prefix: String) {
    for_good(&session, &parent, || sweep(&session, &parent, &prefix)).await;
}

/// Deletes our node `path`, tried again while the session lives (see
/// [`delete_ours`]).
pub(crate) async fn delete_for_good(session: Arc<Session>, path: String) {
    for_good(&session, &path, || async {
        delete_node(&session, &path).await.map(drop)
    })
    .await;
}

/// Runs `attempt` until it succeeds or the session ends, pausing longer
/// after each failure.
async fn for_good<F, Fut>(session: &Session, what: &str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut pause = Duration::from_millis(100);
    loop {
        let e = match attempt().await {
            Ok(()) => return,
            Err(e) => e,
        };
        if session.is_dead() {
            tracing::debug!(error = %e, what, "cleanup could not finish; the node ended with the session");
            return;
        }
        tracing::debug!(error = %e, what, ?pause, "cleanup could not finish; trying again");
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = session.dead() => {}
        }
        pause = (pause * 2).min(MAX_CLEANUP_PAUSE);
    }
}

/// The longest pause between two attempts of a cleanup.
const MAX_CLEANUP_PAUSE: Duration = Duration::from_secs(2);

/// One attempt of [`delete_ours`].
async fn sweep(session: &Session, parent: &str, prefix: &str) -> Result<()> {
    for c in list(session, parent)
        .await?
        .into_iter()
        .filter(|c| c.starts_with(prefix))
    {
        delete_node(session, &format!("{parent}/{c}")).await?;
    }
    Ok(())
}

/// Waits for a node watch to fire, in the caller's task: a panic inside
/// the client (its watch's sender dropped with a closed client) is caught
/// and reported as the watch having fired, so the caller looks at the node
/// again, as after any event. The client's own future, not wrapped in
/// another (which would keep the watcher twice: a held lease waits on one).
pub(crate) fn watch_fired(
    watcher: zk::OneshotWatcher,
) -> impl std::future::Future<Output = ()> + Send {
    use futures_util::FutureExt;
    std::panic::AssertUnwindSafe(watcher.changed())
        .catch_unwind()
        .map(|fired| {
            if fired.is_err() {
                tracing::debug!("a node watch ended without an event (its client closed)");
            }
        })
}

/// Runs `fut` in a task that is aborted when the handle is dropped (so a
/// panic or a dropped sender inside the client cannot reach the caller).
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
