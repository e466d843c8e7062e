//! What a backend can tell about a name: its holder, its waiters, the
//! names held under a prefix.

use std::time::Duration;

/// What a backend can tell about a name's holder and waiters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The current holder, if the name is held.
    pub holder: Option<HolderInfo>,
    /// The number of waiters, where the backend can tell.
    pub waiters: Option<usize>,
}

/// The holder of a name, as far as the backend can tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's owner token: for a holder of this library, its
    /// [`OwnerToken`](crate::raw::OwnerToken) (32 lowercase hex digits) on every backend, the same
    /// for the two halves of a migrating lock; for another client (Curator,
    /// kazoo, `etcdctl`), the node or key as the backend stores it.
    pub owner: Option<String>,
    /// The holder's fencing token.
    pub fence: Option<u64>,
    /// How long the lease lives without renewal.
    pub ttl_remaining: Option<Duration>,
    /// The value stored beside the lease ([`AcquireRequest::value`](crate::raw::AcquireRequest::value)), where
    /// the backend keeps one.
    pub value: Option<String>,
    /// When the holder was granted the name, by the server's clock, where
    /// the backend can tell (ZooKeeper: the node's creation time; Redis:
    /// the time in the fencing token; memory: the grant).
    pub since: Option<std::time::SystemTime>,
}

impl HolderInfo {
    /// Holder information from its parts.
    pub fn new(owner: Option<String>, fence: Option<u64>, ttl_remaining: Option<Duration>) -> Self {
        HolderInfo {
            owner,
            fence,
            ttl_remaining,
            value: None,
            since: None,
        }
    }

    /// Sets [`since`](HolderInfo::since).
    #[must_use]
    pub fn with_since(mut self, since: Option<std::time::SystemTime>) -> Self {
        self.since = since;
        self
    }

    /// Sets [`value`](HolderInfo::value).
    #[must_use]
    pub fn with_value(mut self, value: Option<String>) -> Self {
        self.value = value;
        self
    }
}

impl LockInfo {
    /// Lock information from its parts.
    pub fn new(holder: Option<HolderInfo>, waiters: Option<usize>) -> Self {
        LockInfo { holder, waiters }
    }
}

/// What [`Backend::list`](crate::raw::Backend::list) found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// The names held (at most the limit asked for).
    pub names: Vec<String>,
    /// Whether every name held under the prefix is in
    /// [`names`](Listing::names): false when the limit, or a bound of the
    /// backend's own, ended the listing first.
    pub complete: bool,
}

impl Listing {
    /// A listing from its parts.
    pub fn new(names: Vec<String>, complete: bool) -> Self {
        Listing { names, complete }
    }

    /// `names` (at most `limit` of them, the rest cut), complete unless
    /// there were more.
    pub fn bounded(mut names: Vec<String>, limit: usize) -> Self {
        let complete = names.len() <= limit;
        names.truncate(limit);
        Listing { names, complete }
    }
}

/// A holder's place in a semaphore or read-write lock in a backend's own
/// layout, for [`Backend::inspect_role`](crate::raw::Backend::inspect_role).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Role {
    /// A permit of a semaphore ([`Mode::Permit`](crate::raw::Mode::Permit)).
    Permit,
    /// A reader of a read-write lock ([`Mode::Read`](crate::raw::Mode::Read)).
    Reader,
    /// The writer of a read-write lock ([`Mode::Write`](crate::raw::Mode::Write)).
    Writer,
}

/// An owner token as logs, spans and error texts show it: the first 8
/// characters of a token (an owner token is what a release compares, so
/// a text that travels further than the server does not carry it whole);
/// a node or key path (another client's, on ZooKeeper or etcd) whole.
pub(crate) fn short_owner(owner: &str) -> std::borrow::Cow<'_, str> {
    match owner.get(..8) {
        Some(head) if owner.len() > 16 && !owner.contains('/') => format!("{head}…").into(),
        _ => owner.into(),
    }
}
