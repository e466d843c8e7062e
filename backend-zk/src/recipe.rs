//! Node names of the lock recipe: Curator's `InterProcessMutex` layout, with
//! kazoo's `Lock` nodes recognised as contenders, and Curator's
//! `LeaderLatch` layout for a lease that carries a value (an election).
//!
//! - ours (and Curator's): `_c_<uuid>-lock-<seq>`
//! - ours with a value (and Curator's `LeaderLatch`): `_c_<uuid>-latch-<seq>`
//! - kazoo's: `<uuid hex>__lock__<seq>`
//!
//! `<seq>` is the 10-digit sequence suffix ZooKeeper appends (`-` and 10
//! digits once the parent's counter overflowed). Every contender is ordered
//! by it; children that match neither form are not contenders.

use lockcore::OwnerToken;

/// Curator's lock name for `InterProcessMutex`.
const CURATOR_MARK: &str = "-lock-";
/// Curator's name for `LeaderLatch` participants.
const LATCH_MARK: &str = "-latch-";
/// kazoo's `Lock` node marker.
const KAZOO_MARK: &str = "__lock__";

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

/// The prefix of our node for `owner` (ZooKeeper appends the sequence):
/// a `LeaderLatch` participant's for a lease with a value (a candidate of
/// an election), else an `InterProcessMutex` contender's.
pub(crate) fn node_prefix(owner: OwnerToken, with_value: bool) -> String {
    let mark = if with_value { LATCH_MARK } else { CURATOR_MARK };
    format!("_c_{}{mark}", uuid_of(owner))
}

/// The sequence number of a contender node, or `None` when `child` is not one.
pub(crate) fn sequence_of(child: &str) -> Option<i64> {
    let suffix = [CURATOR_MARK, LATCH_MARK, KAZOO_MARK]
        .iter()
        .filter_map(|m| child.rfind(m).map(|i| &child[i + m.len()..]))
        .min_by_key(|s| s.len())?;
    let digits = suffix.strip_prefix('-').unwrap_or(suffix);
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    suffix.parse().ok()
}

/// A contender node: its name and sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Contender {
    pub(crate) name: String,
    pub(crate) seq: i64,
}

/// The contenders among `children`, in queue order (by sequence number).
pub(crate) fn contenders(children: Vec<String>) -> Vec<Contender> {
    let mut v: Vec<Contender> = children
        .into_iter()
        .filter_map(|name| sequence_of(&name).map(|seq| Contender { name, seq }))
        .collect();
    v.sort_by(|a, b| a.seq.cmp(&b.seq).then_with(|| a.name.cmp(&b.name)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_form() {
        let o = OwnerToken::from_u128(0x0123456789abcdef_fedcba9876543210);
        assert_eq!(uuid_of(o), "01234567-89ab-cdef-fedc-ba9876543210");
        assert_eq!(
            node_prefix(o, false),
            "_c_01234567-89ab-cdef-fedc-ba9876543210-lock-"
        );
        assert_eq!(
            node_prefix(o, true),
            "_c_01234567-89ab-cdef-fedc-ba9876543210-latch-"
        );
    }

    #[test]
    fn recognises_curator_latch_and_kazoo_nodes() {
        assert_eq!(
            sequence_of("_c_01234567-89ab-cdef-fedc-ba9876543210-lock-0000000042"),
            Some(42)
        );
        assert_eq!(
            sequence_of("0123456789abcdef0123456789abcdef__lock__0000000007"),
            Some(7)
        );
        assert_eq!(
            sequence_of("_c_01234567-89ab-cdef-fedc-ba9876543210-latch-0000000009"),
            Some(9)
        );
        assert_eq!(sequence_of("x-lock--2147483648"), Some(-2147483648));
        for not in [
            "leader",
            "_c_x-latch-000000001",
            "x__rlock__0000000001",
            "x-lock-123",
            "x-lock-00000000001",
            "x-lock-000000000a",
        ] {
            assert_eq!(sequence_of(not), None, "{not}");
        }
    }

    #[test]
    fn orders_by_sequence_across_layouts() {
        let c = contenders(vec![
            "_c_b-lock-0000000003".into(),
            "ffff__lock__0000000001".into(),
            "garbage".into(),
            "_c_a-lock-0000000002".into(),
        ]);
        let seqs: Vec<i64> = c.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(c[0].name, "ffff__lock__0000000001");
    }
}
