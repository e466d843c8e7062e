//! The key layout: a lock's key range, the lease id of an owner, and
//! reading keys and revisions out of responses.

use etcd_client::{TxnOpResponse, TxnResponse};
use lockcore::name::encode_segment;
use lockcore::raw::OwnerToken;

/// The key range of lock `name` under `prefix`: every key of the lock
/// (holder and waiters) starts with it.
pub(crate) fn range_of(prefix: &str, name: &str) -> String {
    let seg = encode_segment(name);
    if prefix.is_empty() {
        format!("{seg}/")
    } else {
        format!("{prefix}/{seg}/")
    }
}

/// A positive, non-zero lease id from a random owner token.
pub(crate) fn lease_id_of(owner: OwnerToken) -> i64 {
    let id = (owner.as_u128() as u64 >> 1) as i64;
    id.max(1)
}

pub(crate) fn header_rev(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// The first key of a range response in a transaction, with its create
/// revision.
pub(crate) fn first_kv(op: Option<&TxnOpResponse>) -> Option<(Vec<u8>, i64)> {
    match op {
        Some(TxnOpResponse::Get(g)) => g
            .kvs()
            .first()
            .map(|kv| (kv.key().to_vec(), kv.create_revision())),
        _ => None,
    }
}

/// What a plain lock's key holds before its owner token: a control
/// character and a word, which no candidate's value (`etcdctl elect`
/// writes a line of text) starts with. `concurrency.Mutex` writes and reads
/// nothing there.
pub(crate) const OWNER_MARK: &str = "\u{1f}lockcore-owner ";
