//! The RedLock backend: acquire on a majority, inspect by the majority's view.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lockcore::raw::prelude::*;
use lockcore::raw::retry::jitter_between;

use super::lease::RedLockLease;
use super::masters::{RedLockBackend, ATTEMPTS};
use super::quorum::*;
use crate::config::NAME;
use crate::conn::Conn;
use crate::managed::Managed;
use crate::renewals::KeyToken;
use crate::scripts::{ttl_ms, Keys, HOLDER};
use crate::wake::{wait_turn, Subscription};

#[async_trait]
impl Backend for RedLockBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::None, LeaseKind::Ttl)
            .push_wakeup(true)
            .inspect(true)
            .values(true)
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let keys = Keys::new(&self.cfg.prefix, req.name);
        let ttl = ttl_ms(req.ttl);
        let limit = self.instance_timeout(req.ttl);
        let mut subs: Vec<Subscription> = Vec::new();
        loop {
            // A token per attempt, never reused in this process (`migrate:`
            // acquires with one owner again after a cut-off pass): the undo
            // of one attempt, if it comes late to an instance, never deletes
            // another attempt's key.
            //
            // A candidate's value follows its token after a space (tokens
            // have none): the key's value is the whole, compared whole by
            // every script, so the value lives and dies with the lease on
            // each instance and inspection reads both in one.
            let attempt = ATTEMPTS.fetch_add(1, Ordering::Relaxed);
            let token = match req.value {
                Some(v) => format!("{}.{attempt} {v}", req.owner),
                None => format!("{}.{attempt}", req.owner),
            };
            let started = Instant::now();
            let cleanup = CleanupOnDrop::new(
                "release a cut-off RedLock attempt on every instance",
                self.undo(&keys, &token, Straggling::default()),
            );
            let conns: Vec<Arc<Managed>> = self.instances.iter().map(|i| i.conn.clone()).collect();
            let call = Call {
                key: keys.lock.clone(),
                ask: Ask::SetNx {
                    token: token.clone(),
                    ttl: ttl.clone(),
                },
                limit,
            };
            let quorum = self.quorum();
            // Granted on a majority settles it: the lease is valid from
            // `started`, and the grants still out are the lease's too
            // (renewed, released and undone like the others).
            let (replies, straggling) = on_each(
                &conns,
                call,
                |r| count(r, 1) >= quorum,
                Straggling::default(),
            )
            .await;
            let granted = count(&replies, 1);
            let answered = replies.iter().filter(|r| r.is_some()).count();
            let valid_until = validity_deadline(started, req.ttl);
            if granted >= self.quorum() && Instant::now() < valid_until {
                cleanup.disarm();
                return Ok(Some(Grant {
                    lease: Box::new(RedLockLease {
                        instances: self.instances.clone(),
                        response_timeout: self.cfg.response_timeout,
                        renewing: KeyToken::new(&keys.lock, &token),
                        channel: keys.channel,
                        quorum: self.quorum(),
                        limit,
                        acquiring: straggling,
                        retakes: Arc::default(),
                    }),
                    fence: None,
                    valid_until,
                }));
            }
            // Undo the partial grant everywhere before deciding anything:
            // on each instance after the attempt's call there, if that is
            // still out (also when this is dropped while undoing).
            cleanup.disarm();
            CleanupOnDrop::new(
                "release a failed RedLock attempt on every instance",
                self.undo(&keys, &token, straggling),
            )
            .run_now()
            .await;
            if answered < self.quorum() {
                return Err(self.too_few(answered, limit, ""));
            }
            if req.deadline.passed(Instant::now()) {
                return Ok(None);
            }
            waiting();
            if subs.is_empty() {
                for i in self.instances.iter() {
                    subs.push(i.wake.subscribe(&keys.channel).await);
                }
                continue;
            }
            // The holder's remaining ttl, as the instances that answer see it.
            let call = Call {
                key: keys.lock.clone(),
                ask: Ask::Pttl,
                limit,
            };
            let pttl = on_all(&self.instances, call)
                .await
                .iter()
                .flatten()
                .map(|(_, p)| *p)
                .max()
                .unwrap_or(-1);
            // A random delay keeps contending clients from colliding again.
            let jitter = jitter_between(Duration::ZERO, Duration::from_millis(20));
            tokio::time::sleep(jitter).await;
            wait_turn(&mut subs, pttl, req.deadline).await;
        }
    }

    /// Reads the key on every instance at once: the holder is the token a
    /// majority of instances hold (with the value a candidate campaigned
    /// with), alive for as long as a majority still holds it. A token on a
    /// minority (an attempt under way or being undone, a lease expiring) is
    /// no holder. No fencing token: RedLock has none.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when fewer than a majority of instances
    /// answer within the response timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let keys = Keys::new(&self.cfg.prefix, name);
        let limit = self.cfg.response_timeout;
        let views = join_all(self.instances.iter().map(|i| {
            let (conn, key) = (i.conn.clone(), keys.lock.clone());
            async move {
                let c = Conn::Single(conn.clone());
                let key = [key.as_str()];
                // Bytes: a key another client wrote need not be UTF-8.
                let read = c.script::<(Option<Vec<u8>>, i64)>(&HOLDER, &key, &[]);
                match tokio::time::timeout(limit, read).await {
                    Ok(Ok((token, pttl))) => Some((
                        token.map(|t| String::from_utf8_lossy(&t).into_owned()),
                        pttl,
                    )),
                    Ok(Err(_)) => None,
                    Err(_) => {
                        conn.suspect_current();
                        None
                    }
                }
            }
        }))
        .await;
        let answered = views.iter().flatten().count();
        if answered < self.quorum() {
            let why = format!(" to tell who holds {name:?}");
            return Err(self.too_few(answered, limit, &why));
        }
        Ok(Some(LockInfo::new(
            majority_holder(&views, self.quorum()),
            None,
        )))
    }

    /// The names whose lock key any instance that answers has (a majority
    /// must answer); [`inspect`](Backend::inspect) tells which a majority
    /// holds.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        let pattern = crate::scripts::scan_pattern(&self.cfg.prefix, prefix);
        let time = self.cfg.response_timeout * 4;
        let key_prefix = self.cfg.prefix.as_str();
        let lists = join_all(self.instances.iter().map(|i| {
            let c = Conn::Single(i.conn.clone());
            let pattern = pattern.as_str();
            async move {
                let keep = |k: &str| crate::scripts::name_of_key(key_prefix, k).is_some();
                tokio::time::timeout(time, c.scan(pattern, limit.saturating_add(1), keep))
                    .await
                    .ok()
                    .and_then(std::result::Result::ok)
            }
        }))
        .await;
        let answered = lists.iter().flatten().count();
        if answered < self.quorum() {
            return Err(self.too_few(answered, time, " to list the names held"));
        }
        let mut names: Vec<String> = lists
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|k| crate::scripts::name_of_key(key_prefix, &k))
            .filter(|n| n.starts_with(prefix))
            .collect();
        names.sort();
        names.dedup();
        Ok(Some(Listing::bounded(names, limit)))
    }
}

/// The holder the instances' views (`(token, pttl)`, `None` for one that did
/// not answer) agree on: a token held by at least `quorum` of them, alive
/// for as long as `quorum` of them keep it (the `quorum`-th longest pttl).
fn majority_holder(views: &[Option<(Option<String>, i64)>], quorum: usize) -> Option<HolderInfo> {
    let held: Vec<(&str, i64)> = views
        .iter()
        .flatten()
        .filter_map(|(token, pttl)| token.as_deref().map(|t| (t, *pttl)))
        .collect();
    let (token, _) = held
        .iter()
        .find(|(t, _)| held.iter().filter(|(u, _)| u == t).count() >= quorum)?;
    let mut pttls: Vec<i64> = held
        .iter()
        .filter(|(u, _)| u == token)
        .map(|(_, p)| *p)
        .collect();
    pttls.sort_unstable_by(|a, b| b.cmp(a));
    let ttl = pttls
        .get(quorum.saturating_sub(1))
        .and_then(|p| u64::try_from(*p).ok())
        .map(Duration::from_millis);
    let (owner, value) = match token.split_once(' ') {
        Some((owner, value)) => (owner, Some(value.to_owned())),
        None => (*token, None),
    };
    // `<owner token>.<attempt>`: the owner token alone, as every backend
    // reports it (the two halves of a migrating lock compare equal).
    let owner = owner.split_once('.').map_or(owner, |(o, _)| o);
    Some(HolderInfo::new(Some(owner.to_owned()), None, ttl).with_value(value))
}
