//! The backend: acquire (a lease per acquisition, recycled through
//! `spare.rs`, and a key per acquisition, then the wait of `wait.rs`),
//! inspect, list.

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp};
use lockcore::raw::prelude::*;

use crate::acquire::Retry;
use crate::config::NAME;
use crate::core::EtcdBackend;
use crate::keys::{lease_id_of, range_of, OWNER_MARK};

#[async_trait]
impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, LeaseKind::Ttl)
            .fair(true)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
    }

    /// # Cancel safety
    ///
    /// Cancel safe: the lease id (a spare one, or a new one) is chosen
    /// before the first request is sent, and a dropped acquisition revokes
    /// that lease in the background, which deletes its key whether it was
    /// waiting or had just been granted.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let ttl_secs = whole_seconds(req.ttl);
        let margin = self.op_timeout(req.ttl);
        let mut spare = self.inner.spares.take(ttl_secs, Instant::now(), margin);
        let mut lease = spare.map_or_else(|| lease_id_of(req.owner), |s| s.id);
        loop {
            match self.attempt(&req, lease, spare).await? {
                Ok(grant) => return Ok(grant),
                Err(Retry::LostPlace(why)) => tracing::warn!(
                    backend = NAME,
                    name = req.name,
                    reason = why,
                    "a waiting acquisition lost its place; queueing again with a new lease"
                ),
                Err(Retry::SpareEnded) => tracing::debug!(
                    backend = NAME,
                    name = req.name,
                    "a spare lease had ended; granting a new one"
                ),
            }
            spare = None;
            lease = lease_id_of(OwnerToken::random());
        }
    }

    /// Every name in one transaction, each on a lease of its own: see
    /// `multi.rs`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call revokes the leases it chose (and the
    /// keys go with them), in the background.
    async fn try_acquire_all(&self, reqs: &[AcquireRequest<'_>]) -> Result<AllOrNone> {
        self.take_all(reqs).await
    }

    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let range = range_of(&self.inner.prefix, name);
        let mut kv = self.inner.client.kv_client();
        // The holder's key with its value, and the number of keys: one
        // read, which fetches no waiter's value.
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let count = GetOptions::new().with_prefix().with_count_only();
        let txn = Txn::new().and_then([
            TxnOp::get(range.clone(), Some(first)),
            TxnOp::get(range.clone(), Some(count)),
        ]);
        let resp = self
            .request(
                self.inner.request_timeout,
                "reading the lock keys",
                false,
                kv.txn(txn),
            )
            .await?;
        let (mut holder, mut keys, mut lease) = (None, 0usize, None);
        for (i, op) in resp.op_responses().iter().enumerate() {
            let etcd_client::TxnOpResponse::Get(g) = op else {
                continue;
            };
            if i == 0 {
                holder = g.kvs().first().map(|kv| {
                    let stored = String::from_utf8_lossy(kv.value()).into_owned();
                    // Our plain lock's value is its owner token behind the
                    // mark; another client's key (etcdctl lock) is named by
                    // its key, and a candidate's value is its value.
                    let (owner, value) = match stored.strip_prefix(OWNER_MARK) {
                        Some(token) => (Some(token.to_owned()), None),
                        None => (
                            String::from_utf8_lossy(kv.key())
                                .strip_prefix(range.as_str())
                                .map(str::to_owned),
                            Some(stored).filter(|v| !v.is_empty()),
                        ),
                    };
                    HolderInfo::new(owner, u64::try_from(kv.create_revision()).ok(), None)
                        .with_value(value)
                });
                lease = g.kvs().first().map(etcd_client::KeyValue::lease);
            } else {
                keys = usize::try_from(g.count()).unwrap_or(usize::MAX);
            }
        }
        // The holder's lease tells how long it lives without renewal.
        if let (Some(h), Some(id)) = (holder.as_mut(), lease.filter(|id| *id != 0)) {
            let mut leases = self.inner.client.lease_client();
            let ttl = self
                .request(
                    self.inner.request_timeout,
                    "reading the holder's lease",
                    false,
                    leases.time_to_live(id, None),
                )
                .await?;
            h.ttl_remaining = u64::try_from(ttl.ttl()).ok().map(Duration::from_secs);
        }
        Ok(Some(LockInfo::new(holder, Some(keys.saturating_sub(1)))))
    }

    /// The names with a key under the prefix (holders and waiters), read in
    /// one range request of keys only (two for the prefixes `.` and `..`,
    /// whose own segment is escaped while their longer names' are not).
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let root = if self.inner.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.inner.prefix)
        };
        // Character by character, as in a longer name; and the name's own
        // segment where it differs (`.`, `..`).
        let longer = lockcore::name::encode_segment(&format!("{prefix}x")).into_owned();
        let by_chars = longer.strip_suffix('x').unwrap_or(&longer).to_owned();
        let whole = lockcore::name::encode_segment(prefix).into_owned();
        let mut starts = vec![format!("{root}{by_chars}")];
        if whole != by_chars {
            starts.push(format!("{root}{whole}/"));
        }
        let asked = limit.saturating_add(1).saturating_mul(8);
        let mut names = Vec::new();
        let mut complete = true;
        for start in starts {
            let mut kv = self.inner.client.kv_client();
            let opts = GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_sort(SortTarget::Key, SortOrder::Ascend)
                .with_limit(i64::try_from(asked).unwrap_or(i64::MAX));
            let resp = self
                .request(
                    self.inner.request_timeout,
                    "listing the lock keys",
                    false,
                    kv.get(start, Some(opts)),
                )
                .await?;
            complete &= !resp.more();
            names.extend(resp.kvs().iter().filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key());
                let seg = key.strip_prefix(root.as_str())?.split_once('/')?.0;
                lockcore::name::decode_segment(seg).filter(|n| n.starts_with(prefix))
            }));
        }
        names.sort();
        names.dedup();
        let mut listing = Listing::bounded(names, limit);
        listing.complete &= complete;
        Ok(Some(listing))
    }
}
