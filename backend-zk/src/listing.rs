//! Listing: the names held under a prefix (the lock parents with a
//! contender), and the holders of a read-write lock's or a semaphore's
//! roles in Curator's layouts.
//!
//! Every listing is preceded by a `sync` with the leader, as
//! [`inspect`](lockcore::raw::Backend::inspect) is, so it sees every
//! acquisition and release acknowledged before the call. What follows is
//! read node by node: a report is not one snapshot.

use lockcore::name::{decode_segment, encode_segment};
use lockcore::{Error, Layout, Result};
use lockcore::{HolderInfo, Role};
use zookeeper_client as zk;

use crate::config::{ZkConfig, NAME};
use crate::nodes::{data_of, list, lock_parent, since_of, sync_with_leader};
use crate::recipe;
use crate::session::Session;

/// How often the writer is looked for again when the one listed went
/// before it was read.
const WRITER_ROUNDS: usize = 8;

/// The names under `cfg`'s base path that start with `prefix` and have a
/// contender (a lock, election, reader or writer node, or a semaphore's
/// lease or a waiter on its mutex), at most `limit`, in name order.
///
/// Every name is one child of the base path (its encoded segment, see
/// [`encode_segment`]: a `/` in a name is `%2F`, so there is no nesting),
/// decoded back. A child that is not the encoding of a name (created by
/// another client, as `%61` or a lowercase escape) is not a lock parent of
/// this library and is left out. Each candidate costs one listing of its
/// children (up to two more for a semaphore's `leases` and `locks`); a
/// parent left empty lingers until the server reaps it (a container node)
/// and is skipped.
///
/// # Cancel safety
///
/// Cancel safe: it only reads (a `sync` changes nothing).
pub(crate) async fn held_names(
    session: &Session,
    cfg: &ZkConfig,
    prefix: &str,
    limit: usize,
) -> Result<Vec<String>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let base = cfg.base();
    sync_with_leader(session, &base).await?;
    let mut candidates: Vec<(String, String)> = list(session, &base)
        .await?
        .into_iter()
        .filter_map(|segment| {
            let name = decode_segment(&segment)?;
            let canonical = encode_segment(&name) == segment.as_str();
            (canonical && name.starts_with(prefix)).then_some((name, segment))
        })
        .collect();
    candidates.sort();
    let mut names = Vec::new();
    for (name, segment) in candidates {
        if names.len() >= limit {
            break;
        }
        if occupied(session, &format!("{base}/{segment}")).await? {
            names.push(name);
        }
    }
    tracing::trace!(prefix, found = names.len(), "listed the held names");
    Ok(names)
}

/// Whether lock parent `parent` has a contender: a node of the lock
/// recipe, a lease of a semaphore, or a waiter on a semaphore's mutex.
async fn occupied(session: &Session, parent: &str) -> Result<bool> {
    let children = list(session, parent).await?;
    let (leases, locks) = (
        children.iter().any(|c| c == "leases"),
        children.iter().any(|c| c == "locks"),
    );
    if !recipe::contenders(children).is_empty() {
        return Ok(true);
    }
    if leases && !recipe::leases(list(session, &format!("{parent}/leases")).await?).is_empty() {
        return Ok(true);
    }
    Ok(locks && !recipe::contenders(list(session, &format!("{parent}/locks")).await?).is_empty())
}

/// Whether `role` is in a layout `cfg` lays out natively (Curator's).
pub(crate) fn is_native(cfg: &ZkConfig, role: Role) -> bool {
    match role {
        Role::Permit => cfg.semaphore == Layout::Native,
        Role::Reader | Role::Writer => cfg.rwlock == Layout::Native,
        _ => false,
    }
}

/// The holders of `name` in `role` of Curator's layouts, in queue order,
/// or `None` when `cfg` does not lay that primitive out natively.
///
/// - [`Role::Reader`]: the `__READ__` (and kazoo `__rlock__`) nodes with
///   no writer (nor kazoo `__lock__`) queued before them: the readers
///   holding now, not those queued behind a writer.
/// - [`Role::Writer`]: the first node of the read-write lock, when it is a
///   `__WRIT__` node (a writer holds when nothing of the read-write lock is
///   queued before it); none while readers hold or it waits.
/// - [`Role::Permit`]: the semaphore's lease nodes (`<name>/leases`) that
///   hold (see [`permit_holders`]).
///
/// Each holder's owner is its node's protection id (the owner token of a
/// client of ours) or the node's name, its token the node's `czxid`, its
/// `since` the node's `ctime`, and its value what the node holds where
/// that is not our owner token or our count of permits (Curator writes
/// the host address). No ttl: the node lives by its session. A node gone
/// between the listing and its read was released, and is left out.
///
/// # Cancel safety
///
/// Cancel safe: it only reads (a `sync` changes nothing).
pub(crate) async fn role_holders(
    session: &Session,
    cfg: &ZkConfig,
    name: &str,
    role: Role,
) -> Result<Option<Vec<HolderInfo>>> {
    if !is_native(cfg, role) {
        return Ok(None);
    }
    let parent = lock_parent(cfg, name);
    sync_with_leader(session, &parent).await?;
    let holders: Vec<HolderInfo> = match role {
        Role::Permit => permit_holders(session, &parent).await?,
        Role::Writer => writer(session, &parent).await?.into_iter().collect(),
        _ => readers(session, &parent).await?,
    };
    Ok(Some(holders))
}

/// The readers of the read-write lock under `parent` that hold now.
async fn readers(session: &Session, parent: &str) -> Result<Vec<HolderInfo>> {
    let queue = recipe::contenders(list(session, parent).await?);
    let mut out = Vec::new();
    for pos in recipe::rw_holders(&queue, false) {
        let node = &queue[pos].name;
        if let Some(h) = holder(session, parent, node).await? {
            out.push(h);
        }
    }
    Ok(out)
}

/// The writer of the read-write lock under `parent` holding now. A listed
/// writer gone before it was read released: the queue is listed again,
/// since the next one may hold by now.
async fn writer(session: &Session, parent: &str) -> Result<Option<HolderInfo>> {
    for _ in 0..WRITER_ROUNDS {
        let queue = recipe::contenders(list(session, parent).await?);
        let Some(pos) = recipe::rw_holders(&queue, true).into_iter().next() else {
            return Ok(None);
        };
        if let Some(h) = holder(session, parent, &queue[pos].name).await? {
            return Ok(Some(h));
        }
    }
    Err(Error::backend_error(
        NAME,
        format!(
            "the writer of {parent} was gone by the time it was read, {WRITER_ROUNDS} times over"
        ),
    ))
}

/// The holder of node `node` under `parent`, `None` when it is gone.
async fn holder(session: &Session, parent: &str, node: &str) -> Result<Option<HolderInfo>> {
    let Some((data, stat)) = data_of(session, &format!("{parent}/{node}")).await? else {
        return Ok(None);
    };
    let value = Some(String::from_utf8_lossy(&data).into_owned())
        .filter(|v| !recipe::is_own_token(node, v));
    Ok(Some(info(node, &stat, value)))
}

/// A holder by its node: owner from the node's name, token from its
/// `czxid`, `since` from its `ctime`, no ttl (it lives by its session).
fn info(node: &str, stat: &zk::Stat, value: Option<String>) -> HolderInfo {
    let fence = u64::try_from(stat.czxid).ok();
    HolderInfo::new(Some(recipe::owner_of(node)), fence, None)
        .with_value(value)
        .with_since(since_of(stat))
}

/// The permits of the semaphore under `parent` held now: its lease nodes,
/// in creation order.
///
/// A lease node is created before its client counts the leases, and goes
/// again when the count is over (a try), or stays while its client waits
/// for one to go (a waiter, holding the semaphore's mutex). A holder
/// counted at most the permits with every older lease still there, so the
/// holders are among the first `N` leases, `N` the count the clients admit
/// by: ours write it in their nodes (`lockcore permits=N`), and the first
/// `N` are shown. With only Curator's nodes there is no count to read, and
/// every lease is shown, the one of a client still counting (at most one
/// waiter, and any try in the moment it looks) included. Either way a
/// lease whose client has not yet counted may show in a holder's place for
/// that moment.
async fn permit_holders(session: &Session, parent: &str) -> Result<Vec<HolderInfo>> {
    let leases_path = format!("{parent}/leases");
    let nodes = recipe::leases(list(session, &leases_path).await?);
    let mut held = Vec::new();
    let mut count: Option<u32> = None;
    for node in nodes {
        let Some((data, stat)) = data_of(session, &format!("{leases_path}/{node}")).await? else {
            continue;
        };
        let permits = recipe::permits_of(&data);
        if let Some(n) = permits {
            count = Some(count.map_or(n, |c| c.max(n)));
        }
        // Our nodes hold the count, not a value.
        let value = Some(String::from_utf8_lossy(&data).into_owned())
            .filter(|v| permits.is_none() && !recipe::is_own_token(&node, v));
        held.push(info(&node, &stat, value));
    }
    if let Some(n) = count {
        held.truncate(usize::try_from(n).unwrap_or(usize::MAX));
    }
    Ok(held)
}
