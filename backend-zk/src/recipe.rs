//! Node names of the lock recipe: Curator's `InterProcessMutex` layout, with
//! kazoo's `Lock` nodes recognised as contenders, Curator's `LeaderLatch`
//! layout for a lease that carries a value (an election), and Curator's
//! `InterProcessReadWriteLock` layout for a read-write lock, with kazoo's
//! `ReadLock` and `WriteLock` nodes recognised.
//!
//! - ours (and Curator's): `_c_<uuid>-lock-<seq>`
//! - ours with a value (and Curator's `LeaderLatch`): `_c_<uuid>-latch-<seq>`
//! - a reader and a writer of ours (and Curator's): `_c_<uuid>-__READ__<seq>`
//!   and `_c_<uuid>-__WRIT__<seq>`
//! - kazoo's `Lock` and `WriteLock`: `<uuid hex>__lock__<seq>`; its
//!   `ReadLock`: `<uuid hex>__rlock__<seq>`
//!
//! `<seq>` is the 10-digit sequence suffix ZooKeeper appends (`-` and 10
//! digits once the parent's counter overflowed). Every contender is ordered
//! by it; children that match no form are not contenders. A name's lock
//! (mutex and latch nodes) and its read-write lock (reader and writer
//! nodes) are two things, as Curator's are: each waits only for its own
//! kind, and kazoo's `__lock__`, both its `Lock` and its `WriteLock`, is
//! in both. A reader waits for the writers queued before it.

use lockcore::raw::{Mode, OwnerToken};

/// Curator's lock name for `InterProcessMutex`.
const CURATOR_MARK: &str = "-lock-";
/// Curator's name for `LeaderLatch` participants.
const LATCH_MARK: &str = "-latch-";
/// kazoo's `Lock` node marker.
const KAZOO_MARK: &str = "__lock__";
/// Curator's lock name for `InterProcessReadWriteLock`'s readers.
const READ_MARK: &str = "__READ__";
/// Curator's lock name for `InterProcessReadWriteLock`'s writers.
const WRITE_MARK: &str = "__WRIT__";
/// kazoo's `ReadLock` node marker.
const KAZOO_READ_MARK: &str = "__rlock__";
/// Curator's lease name for `InterProcessSemaphoreV2`'s permits.
const LEASE_MARK: &str = "-lease-";

/// What a contender node is, by its marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A mutex contender or an election candidate (`-lock-`, `-latch-`).
    Mutex,
    /// kazoo's `__lock__`: its `Lock` and its `WriteLock` alike.
    Kazoo,
    /// A read-write lock's reader (`__READ__`, kazoo's `__rlock__`).
    Read,
    /// A read-write lock's writer (`__WRIT__`).
    Write,
}

impl Kind {
    /// Whether a contender of this kind waits for an earlier one of `kind`.
    /// A name's lock and its read-write lock are two things, as on every
    /// backend (and as Curator's mutex and read-write lock on one path):
    /// only kazoo's `__lock__`, which is both its `Lock` and its
    /// `WriteLock`, is in both.
    fn waits_for(self, kind: Kind) -> bool {
        match self {
            Kind::Mutex | Kind::Kazoo => matches!(kind, Kind::Mutex | Kind::Kazoo),
            Kind::Write => matches!(kind, Kind::Kazoo | Kind::Read | Kind::Write),
            Kind::Read => matches!(kind, Kind::Kazoo | Kind::Write),
        }
    }

    /// Whether a holder of this kind holds the name's lock (what
    /// `inspect` reports), rather than its read-write lock.
    pub(crate) fn is_lock(self) -> bool {
        matches!(self, Kind::Mutex | Kind::Kazoo)
    }

    /// Whether a contender of this kind queues in the name's read-write
    /// lock: a reader, a writer, or kazoo's `__lock__` (in both).
    pub(crate) fn is_rw(self) -> bool {
        matches!(self, Kind::Read | Kind::Write | Kind::Kazoo)
    }
}

/// Every marker, with the kind of node it marks.
const MARKS: [(&str, Kind); 6] = [
    (CURATOR_MARK, Kind::Mutex),
    (LATCH_MARK, Kind::Mutex),
    (KAZOO_MARK, Kind::Kazoo),
    (WRITE_MARK, Kind::Write),
    (READ_MARK, Kind::Read),
    (KAZOO_READ_MARK, Kind::Read),
];

/// The owner token written as a UUID (8-4-4-4-12 lowercase hex), as Curator
/// writes its protection id.
pub(crate) fn uuid_of(owner: OwnerToken) -> String {
    let h = format!("{:032x}", owner.as_u128());
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Who holds node `node`, as `inspect` reports it: the owner token (32
/// lowercase hex digits) of a node of ours or of any client that writes a
/// Curator protection id (`_c_<uuid>-...`), else the node's name.
pub(crate) fn owner_of(node: &str) -> String {
    let uuid = node.strip_prefix("_c_").and_then(|rest| rest.get(..36));
    let token = uuid.filter(|u| {
        u.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
    });
    token.map_or_else(|| node.to_owned(), |u| u.replace('-', ""))
}

/// The prefix of our node for `owner` (ZooKeeper appends the sequence):
/// an `InterProcessReadWriteLock` reader's or writer's for those modes, a
/// `LeaderLatch` participant's for a lease with a value (a candidate of an
/// election), else an `InterProcessMutex` contender's. Curator writes the
/// read-write lock's as `_c_<uuid>-` then its lock name.
pub(crate) fn node_prefix(owner: OwnerToken, with_value: bool, mode: Mode) -> String {
    let uuid = uuid_of(owner);
    match mode {
        Mode::Read => format!("_c_{uuid}-{READ_MARK}"),
        Mode::Write => format!("_c_{uuid}-{WRITE_MARK}"),
        _ if with_value => format!("_c_{uuid}{LATCH_MARK}"),
        _ => format!("_c_{uuid}{CURATOR_MARK}"),
    }
}

/// The prefix of our lease node of a semaphore, in Curator's
/// `InterProcessSemaphoreV2` layout (ZooKeeper appends the sequence).
pub(crate) fn lease_prefix(owner: OwnerToken) -> String {
    format!("_c_{}{LEASE_MARK}", uuid_of(owner))
}

/// What our lease node holds: the count of permits this client admits by,
/// so that a client counting differently can tell.
pub(crate) fn lease_data(permits: u32) -> String {
    format!("{PERMITS_DATA}{permits}")
}

/// The count a lease node's data says its client admits by, where it is
/// one of ours (Curator writes its host address, or what it was given).
pub(crate) fn permits_of(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix(PERMITS_DATA)?
        .parse()
        .ok()
}

/// How our lease node's data starts.
const PERMITS_DATA: &str = "lockcore permits=";

/// The sequence number of a contender node and its kind, or `None` when
/// `child` is not a contender. ZooKeeper writes the sequence as `%010d`: 10
/// digits, or once the parent's counter passed `i32::MAX`, `-` and 9 or 10.
pub(crate) fn sequence_of(child: &str) -> Option<(i64, Kind)> {
    let (suffix, kind) = MARKS
        .iter()
        .filter_map(|(m, kind)| child.rfind(m).map(|i| (&child[i + m.len()..], *kind)))
        .min_by_key(|(s, _)| s.len())?;
    Some((parse_sequence(suffix)?, kind))
}

/// The sequence number ZooKeeper appended, from the `suffix` after a
/// node's marker: 10 digits, or `-` and 9 or 10.
fn parse_sequence(suffix: &str) -> Option<i64> {
    let (digits, widths) = match suffix.strip_prefix('-') {
        Some(d) => (d, 9..=10),
        None => (suffix, 10..=10),
    };
    if !widths.contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seq: i32 = suffix.parse().ok()?;
    Some(i64::from(seq))
}

/// The lease nodes among a semaphore's `leases` children (Curator's
/// `_c_<uuid>-lease-<seq>`, ours alike), in sequence order: the order
/// they were created in. Children of no such form are left out.
pub(crate) fn leases(children: Vec<String>) -> Vec<String> {
    let mut v: Vec<(String, i64)> = children
        .into_iter()
        .filter_map(|name| {
            let at = name.rfind(LEASE_MARK)?;
            let seq = parse_sequence(&name[at + LEASE_MARK.len()..])?;
            Some((name, seq))
        })
        .collect();
    v.sort_by(|a, b| {
        queue_order(a.1)
            .cmp(&queue_order(b.1))
            .then_with(|| a.0.cmp(&b.0))
    });
    v.into_iter().map(|(name, _)| name).collect()
}

/// A contender node: its name, sequence number, and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    pub(crate) name: String,
    pub(crate) seq: i64,
    pub(crate) kind: Kind,
}

/// Where a sequence number sorts: the counter is a 32-bit signed integer
/// that goes on from `i32::MAX` to `i32::MIN`, so it is ordered as the
/// unsigned number of the same bits (right across the first wrap, 2³¹
/// creations under one parent).
fn queue_order(seq: i64) -> u32 {
    // The low 32 bits: a sequence number is an i32.
    (seq & 0xffff_ffff) as u32
}

/// The contenders among `children`, in queue order (by sequence number).
pub(crate) fn contenders(children: Vec<String>) -> Vec<Contender> {
    let mut v: Vec<Contender> = children
        .into_iter()
        .filter_map(|name| sequence_of(&name).map(|(seq, kind)| Contender { name, seq, kind }))
        .collect();
    v.sort_by(|a, b| {
        queue_order(a.seq)
            .cmp(&queue_order(b.seq))
            .then_with(|| a.name.cmp(&b.name))
    });
    v
}

/// The contender that the one at `pos` of `queue` waits for, or `None`
/// when it holds: the last one before it of a kind it waits for (for a
/// reader the last writer; for a writer or a lock its predecessor among
/// its own).
pub(crate) fn blocker(queue: &[Contender], pos: usize) -> Option<&Contender> {
    let kind = queue.get(pos)?.kind;
    queue
        .get(..pos)?
        .iter()
        .rev()
        .find(|c| kind.waits_for(c.kind))
}

/// The positions in `queue` of the read-write lock's holders: its readers
/// holding now (no writer, nor kazoo's `__lock__`, queued before them),
/// or, for `writer`, the writer holding now: the first contender of the
/// read-write lock when it is a writer (`__WRIT__`). kazoo's `__lock__`
/// at the head holds the name's lock, as `inspect` shows, and is not
/// repeated as a writer; readers behind it do not hold.
pub(crate) fn rw_holders(queue: &[Contender], writer: bool) -> Vec<usize> {
    if writer {
        return queue
            .iter()
            .position(|c| c.kind.is_rw())
            .filter(|pos| queue[*pos].kind == Kind::Write)
            .into_iter()
            .collect();
    }
    (0..queue.len())
        .filter(|pos| queue[*pos].kind == Kind::Read && blocker(queue, *pos).is_none())
        .collect()
}

/// Whether `data` is the owner token our plain lock writes into node
/// `node` (`_c_<the token as a uuid>-lock-<seq>`; a reader's and a
/// writer's alike).
pub(crate) fn is_own_token(node: &str, data: &str) -> bool {
    data.len() == 32
        && node
            .strip_prefix("_c_")
            .and_then(|rest| rest.get(..36))
            .is_some_and(|uuid| uuid.replace('-', "") == data)
}

#[cfg(test)]
mod tests;
