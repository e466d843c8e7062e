//! RedLock over N independent masters.
//!
//! Acquire sends `SET NX PX` to every instance in parallel, each bounded by a
//! per-instance timeout much smaller than the ttl, and succeeds only when a
//! majority (N/2+1) granted it, with validity = ttl − elapsed − drift
//! (drift = ttl·1% + 2 ms). It returns as soon as a majority granted: the
//! calls still out finish in the background, and a grant among them is the
//! lease's like the others (renewed, released). A release likewise returns
//! once a majority released; its calls still out finish as a counted
//! cleanup step ([`lockcore::cleanup::flush`] waits for them). A call still
//! out may be waiting for its connection (being made again, or reloading a
//! script), where a later call could overtake it; so, on an instance where
//! the acquire's call was still out, the lease's release (like the undo of
//! a failed attempt) is sent only once that call finished (answered or
//! timed out), on the others at once. A call that timed out and still
//! reaches the server later can leave a key on its instance (a minority)
//! until its ttl, as with any RedLock client. Each attempt writes a token
//! of its own, never reused in the process, so a late undo never deletes
//! another attempt's key. Each cycle is one plain `SET NX PX` and one
//! compare-and-delete script per instance. A failed attempt is undone on
//! every instance, also those that errored or timed out; when fewer than a
//! majority answered it is [`ErrorKind::Unavailable`], otherwise it is
//! retried (at once after subscribing to release wake-ups, then after a
//! random delay and a wake-up or the holder's pttl). A renewal counts only when a majority renewed;
//! then an instance that lost the key (restarted without persistence) gets
//! it back by `SET NX`, so restarts one after another never leave the
//! holder on a minority.
//!
//! **Inspection and elections.** [`Backend::inspect`] reads the key and its
//! pttl on every instance at once: the holder is the token held by a
//! majority, for as long as a majority keeps it (the majority's shortest
//! pttl); a token on a minority (an attempt under way or being undone, a
//! lease expiring) is no holder, and fewer than a majority answering is
//! [`ErrorKind::Unavailable`], never "free". A [`lockcore::Election`]
//! candidate's value follows its attempt token after a space, in the key's
//! own value, so it is set, renewed, compared and deleted with the key on
//! each instance. A leader has no term (no fencing, below). With
//! inspection, a semaphore built from locks also finds counts that
//! disagree.
//!
//! **No fencing.** The instances are independent: no counter rises
//! monotonically across them, and a token from one instance's counter can go
//! backwards when another majority grants the next lease. The capability is
//! [`Fencing::None`] and guards carry no token. Where fencing matters, use one
//! instance or a cluster (fencing while data is kept), ZooKeeper or etcd.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::future::{FutureExt, Shared};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lockcore::cleanup::spawn_cleanup;
use lockcore::raw::prelude::*;
use lockcore::raw::retry::jitter_between;
use tokio::sync::oneshot;

use crate::backend::wait_turn;
use crate::config::{Node, RedisConfig, Topology, NAME};
use crate::conn::{Conn, Managed};
use crate::scripts::{ttl_ms, Keys, HOLDER, RELEASE, RENEW_OR_MISSING};
use crate::wake::{Subscription, Wakeups};

/// One master: its connection (made in the background, replaced when it
/// stops answering) and its wake-ups.
#[derive(Debug)]
struct Instance {
    conn: Arc<Managed>,
    wake: Wakeups,
}

/// Refuses credentials that a master that answers refuses (they are the
/// same for every master): `Unauthorized` at connect, rather than a
/// majority that never answers.
async fn refuse_refused_credentials(
    nodes: &[Node],
    instances: &[Instance],
    within: Duration,
) -> Result<()> {
    let answers = join_all(instances.iter().map(|i| {
        let (_, mut c) = i.conn.get();
        async move {
            tokio::time::timeout(within, redis::cmd("PING").query_async::<String>(&mut c)).await
        }
    }))
    .await;
    for (node, answer) in nodes.iter().zip(answers) {
        if let Ok(Err(e)) = answer {
            if crate::error::refused_credentials(&e) {
                return Err(crate::error::map_err(
                    e,
                    "connect",
                    &node.to_string(),
                    false,
                ));
            }
        }
    }
    Ok(())
}

/// Refuses a master listed twice, by address (`by_address`: not over TLS,
/// where one endpoint may route to several servers by host name) and,
/// among those that answer within `within`, by `run_id`; warns once of
/// each that does not answer.
async fn refuse_one_master_twice(
    nodes: &[crate::config::Node],
    instances: &[Instance],
    within: Duration,
    by_address: bool,
) -> Result<()> {
    let twice = |a: &crate::config::Node, b: &crate::config::Node, how: String| {
        Error::invalid_config(
            NAME,
            format!(
                "RedLock: the master {a} is listed twice (as {a} and {b}: {how}); each master must count once toward the majority"
            ),
        )
    };
    let resolving = nodes.iter().map(|n| async move {
        let at = tokio::net::lookup_host((n.host.as_str(), n.port));
        match tokio::time::timeout(within, at).await {
            Ok(Ok(addrs)) => addrs.collect::<Vec<_>>(),
            _ => Vec::new(),
        }
    });
    let addrs = if by_address {
        join_all(resolving).await
    } else {
        Vec::new()
    };
    for (i, a) in addrs.iter().enumerate() {
        for (j, b) in addrs.iter().enumerate().skip(i + 1) {
            if let Some(shared) = a.iter().find(|x| b.contains(x)) {
                return Err(twice(&nodes[i], &nodes[j], format!("both reach {shared}")));
            }
        }
    }
    let ready = join_all(instances.iter().map(|i| i.conn.ready(within))).await;
    let ids = join_all(instances.iter().zip(&ready).map(|(i, ok)| async move {
        if *ok {
            i.conn.run_id(within).await
        } else {
            None
        }
    }))
    .await;
    for (i, node) in nodes.iter().enumerate() {
        if !ready[i] {
            tracing::warn!(
                backend = NAME,
                master = %node,
                "a RedLock master did not answer at connect; locks work while a majority answers, and it joins when it does"
            );
            continue;
        }
        for j in i + 1..nodes.len() {
            if ids[i].is_some() && ids[i] == ids[j] {
                return Err(twice(node, &nodes[j], "one server answers on both".into()));
            }
        }
    }
    Ok(())
}

/// Attempts made in this process: each writes a token of its own.
static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

/// Locks by RedLock over independent Redis masters. Each attempt writes
/// `<owner token>.<attempt number>` as the key's value (followed by a space
/// and the value an election's candidate campaigns with): a token of its
/// own, never reused in the process.
#[derive(Debug)]
pub struct RedLockBackend {
    instances: std::sync::Arc<Vec<Instance>>,
    cfg: RedisConfig,
}

impl RedLockBackend {
    /// Sets up the instances of a `redlock://` configuration and connects to
    /// them in parallel, waiting up to the connect timeout; an instance that
    /// is down now keeps being connected in the background and joins later.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a topology that is not RedLock, TLS
    /// without the `tls` feature, or one master listed twice (two names
    /// that resolve to one address, or two that answer with one `run_id`):
    /// it would count twice toward the majority. Instances that are down are
    /// no error here; each is reported once as a warning through `tracing`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state.
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        let Topology::RedLock(nodes) = &cfg.topology else {
            return Err(Error::invalid_config(
                NAME,
                "RedLockBackend needs a redlock:// topology",
            ));
        };
        let mut instances = Vec::new();
        for node in nodes {
            let client = crate::conn::client(node, &cfg)?;
            instances.push(Instance {
                conn: Managed::lazy(node, &cfg)?,
                wake: Wakeups::new(client, cfg.response_timeout),
            });
        }
        let (credentials, twice) = tokio::join!(
            refuse_refused_credentials(nodes, &instances, cfg.connect_timeout),
            refuse_one_master_twice(nodes, &instances, cfg.connect_timeout, !cfg.tls)
        );
        credentials?;
        twice?;
        Ok(RedLockBackend {
            instances: Arc::new(instances),
            cfg,
        })
    }

    fn quorum(&self) -> usize {
        self.instances.len() / 2 + 1
    }

    /// Fewer than a majority answered within `limit`: unavailable (`to`
    /// says for what, after the majority needed).
    fn too_few(&self, answered: usize, limit: Duration, to: &str) -> Error {
        Error::unavailable(
            NAME,
            format!(
                "RedLock: only {answered} of {} instances answered within {limit:?} (a majority of {} is needed{to})",
                self.instances.len(),
                self.quorum()
            ),
        )
    }

    /// Releases an attempt's key (token `token`) on every instance, each
    /// after the attempt's call there if that is still out (`after`).
    fn undo(
        &self,
        keys: &Keys,
        token: &str,
        after: Straggling,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        release_all(
            self.instances.clone(),
            self.cfg.response_timeout,
            keys.clone(),
            token.to_owned(),
            after,
        )
        .map(|_| ())
    }

    /// The per-instance timeout: a tenth of the ttl, at most the response
    /// timeout, at least 5 ms.
    fn instance_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10)
            .min(self.cfg.response_timeout)
            .max(Duration::from_millis(5))
    }
}

/// What each instance is asked, about one lock key.
#[derive(Debug)]
enum Ask {
    /// `SET key token NX PX ttl`: `(1, 0)` when set, `(0, -1)` when not
    /// (the holder's pttl is not read here; [`Ask::Pttl`] does that).
    SetNx { token: String, ttl: String },
    /// A script over the key: its reply, as `(n, 0)` or `(n, detail)`.
    Script(&'static redis::Script, Vec<String>),
    /// `PTTL key`: `(0, pttl)`.
    Pttl,
}

/// One request for every instance it is sent to.
#[derive(Debug)]
struct Call {
    key: String,
    ask: Ask,
    limit: Duration,
}

/// Sends `call` to one instance within its limit. `Some(reply)` if it
/// answered in time.
async fn call_one(conn: Arc<Managed>, call: Arc<Call>) -> Option<(i64, i64)> {
    let c = Conn::Single(conn.clone());
    let reply = async {
        match &call.ask {
            Ask::SetNx { token, ttl } => {
                let mut cmd = redis::cmd("SET");
                cmd.arg(&call.key).arg(token).arg("NX").arg("PX").arg(ttl);
                let set: Option<String> = c.cmd(&cmd).await.ok()?;
                Some(if set.is_some() { (1, 0) } else { (0, -1) })
            }
            Ask::Script(script, args) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let r: redis::Value = c.script(script, &[&call.key], &args).await.ok()?;
                match r {
                    redis::Value::Int(n) => Some((n, 0)),
                    v => redis::from_redis_value::<(i64, i64)>(v).ok(),
                }
            }
            Ask::Pttl => {
                let mut cmd = redis::cmd("PTTL");
                cmd.arg(&call.key);
                let pttl: i64 = c.cmd(&cmd).await.ok()?;
                Some((0, pttl))
            }
        }
    };
    match tokio::time::timeout(call.limit, reply).await {
        Ok(reply) => reply,
        Err(_) => {
            // Slow or silent: have the connection checked.
            conn.suspect_current();
            None
        }
    }
}

/// Replies of the instances a call went to, in their order: `None` for one
/// that did not answer in time.
type Replies = Vec<Option<(i64, i64)>>;

/// The calls of an [`on_each`] still out when it returned, by instance:
/// they finish in the background, as a counted cleanup step (so
/// [`lockcore::cleanup::flush`] waits for them), and each says when it did.
/// Shared, so that a release dropped halfway and sent again still waits.
#[derive(Debug, Default, Clone)]
struct Straggling(Vec<Option<Shared<oneshot::Receiver<()>>>>);

impl Straggling {
    /// The call still out on instance `at`, if any.
    fn on(&self, at: usize) -> Option<Shared<oneshot::Receiver<()>>> {
        self.0.get(at).cloned().flatten()
    }
}

/// Sends `call` to every instance at once and waits for all of them.
async fn on_all(instances: &[Instance], call: Call) -> Replies {
    let conns: Vec<Arc<Managed>> = instances.iter().map(|i| i.conn.clone()).collect();
    on_each(&conns, call, |_| false, Straggling::default())
        .await
        .0
}

/// Sends `call` to each of `conns` at once, and returns once all answered
/// (or timed out) or once `decided` says the replies in so far settle the
/// outcome. Replies still out then count as `None` here, and the calls
/// finish in the background ([`Straggling`]).
///
/// `after` holds the calls of an earlier `on_each` on the same key still
/// out (an acquire's, for its release): on each instance, this call is sent
/// only once the earlier one there finished, since a call waiting for its
/// connection (being made again, or reloading a script) is not yet in the
/// connection's order. Instances with nothing out are sent it at once.
async fn on_each(
    conns: &[Arc<Managed>],
    call: Call,
    decided: impl Fn(&Replies) -> bool,
    after: Straggling,
) -> (Replies, Straggling) {
    let call = Arc::new(call);
    let mut out: FuturesUnordered<_> = conns
        .iter()
        .enumerate()
        .map(|(at, conn)| {
            let earlier = after.on(at);
            let (conn, call) = (conn.clone(), call.clone());
            async move {
                if let Some(earlier) = earlier {
                    let _ = earlier.await;
                }
                (at, call_one(conn, call).await)
            }
        })
        .collect();
    let mut replies: Replies = vec![None; conns.len()];
    let mut answered = vec![false; conns.len()];
    while let Some((at, reply)) = out.next().await {
        if let Some(slot) = replies.get_mut(at) {
            *slot = reply;
        }
        if let Some(a) = answered.get_mut(at) {
            *a = true;
        }
        if !out.is_empty() && decided(&replies) {
            let mut done: Vec<Option<oneshot::Sender<()>>> = Vec::new();
            let mut straggling = Vec::new();
            for a in &answered {
                if *a {
                    done.push(None);
                    straggling.push(None);
                } else {
                    let (tx, rx) = oneshot::channel();
                    done.push(Some(tx));
                    straggling.push(Some(rx.shared()));
                }
            }
            spawn_cleanup(
                "finish a RedLock call on the instances that had not answered",
                async move {
                    while let Some((at, _)) = out.next().await {
                        if let Some(tx) = done.get_mut(at).and_then(Option::take) {
                            let _ = tx.send(());
                        }
                    }
                },
            );
            return (replies, Straggling(straggling));
        }
    }
    (replies, Straggling::default())
}

/// How many replies were `n`.
fn count(replies: &Replies, n: i64) -> usize {
    replies
        .iter()
        .filter(|r| matches!(r, Some((m, _)) if *m == n))
        .count()
}

/// How a release went on the instances.
#[derive(Debug, Clone, Copy)]
struct ReleaseCount {
    released: usize,
    refused: usize,
}

/// Compare-and-delete on every instance, each after the call of `after`
/// still out there; returns once a majority released (the rest go on in
/// the background) or all answered.
async fn release_all(
    instances: Arc<Vec<Instance>>,
    limit: Duration,
    keys: Keys,
    token: String,
    after: Straggling,
) -> ReleaseCount {
    let quorum = instances.len() / 2 + 1;
    let conns: Vec<Arc<Managed>> = instances.iter().map(|i| i.conn.clone()).collect();
    let call = Call {
        key: keys.lock,
        ask: Ask::Script(&RELEASE, vec![token, keys.channel]),
        limit,
    };
    let (replies, _) = on_each(&conns, call, |r| count(r, 1) >= quorum, after).await;
    ReleaseCount {
        released: count(&replies, 1),
        refused: count(&replies, 0),
    }
}

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
                        keys,
                        token,
                        quorum: self.quorum(),
                        limit,
                        acquiring: straggling,
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

#[derive(Debug)]
struct RedLockLease {
    instances: Arc<Vec<Instance>>,
    response_timeout: Duration,
    keys: Keys,
    token: String,
    quorum: usize,
    limit: Duration,
    /// The acquire's calls still out when it returned: the release is sent
    /// on each of their instances once the call there finished.
    acquiring: Straggling,
}

#[async_trait]
impl BackendLease for RedLockLease {
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let sent = Instant::now();
        let ttl_arg = ttl_ms(ttl);
        let call = Call {
            key: self.keys.lock.clone(),
            ask: Ask::Script(&RENEW_OR_MISSING, vec![self.token.clone(), ttl_arg.clone()]),
            limit: self.limit,
        };
        let replies = on_all(&self.instances, call).await;
        let mut renewed = count(&replies, 1);
        let refused = count(&replies, 0);
        // Renewed on a majority: take the key back where an instance lost it
        // (restarted without persistence), with NX, so that restarts one
        // after another never leave the holder on a minority (redsync #149).
        // Without a majority nothing is taken back: a lease an operator
        // deleted everywhere stays deleted.
        if renewed >= self.quorum {
            let missing: Vec<Arc<Managed>> = self
                .instances
                .iter()
                .zip(&replies)
                .filter(|(_, r)| matches!(r, Some((-1, _))))
                .map(|(i, _)| i.conn.clone())
                .collect();
            if !missing.is_empty() {
                let call = Call {
                    key: self.keys.lock.clone(),
                    ask: Ask::SetNx {
                        token: self.token.clone(),
                        ttl: ttl_arg,
                    },
                    limit: self.limit,
                };
                let (retaken, _) = on_each(&missing, call, |_| false, Straggling::default()).await;
                renewed += count(&retaken, 1);
            }
        }
        let valid_until = validity_deadline(sent, ttl);
        if renewed >= self.quorum && Instant::now() < valid_until {
            return Ok(Renewal::Renewed { valid_until });
        }
        if refused > self.instances.len() - self.quorum {
            return Ok(Renewal::Lost);
        }
        Err(Error::unavailable(
            NAME,
            format!(
                "RedLock renewal: {renewed} of {} instances renewed, {} needed",
                self.instances.len(),
                self.quorum
            ),
        ))
    }

    /// Compare-and-delete on every instance, returning once a majority
    /// released it or all answered (the rest finish in the background):
    /// `NotHeld` when too many answered that it was not this owner's for a
    /// majority to have held it (the lease was lost, even if a minority
    /// still had it), `Released` when a majority released it; otherwise
    /// `Indeterminate`, and the keys that remain end by their ttl.
    async fn release(&self) -> Result<Released> {
        // Sent on each instance after the acquire's call there, if that
        // was still out.
        let acquiring = self.acquiring.clone();
        let n = release_all(
            self.instances.clone(),
            self.response_timeout,
            self.keys.clone(),
            self.token.clone(),
            acquiring,
        )
        .await;
        // As a renewal counts: lost once too many refused for a majority
        // to have held it, whatever a minority still held; released once
        // a majority released it; otherwise nobody can tell.
        if n.refused > self.instances.len() - self.quorum {
            return Ok(Released::NotHeld);
        }
        if n.released >= self.quorum {
            return Ok(Released::Released);
        }
        Err(Error::new(
            ErrorKind::Indeterminate,
            NAME,
            format!(
                "RedLock release: {} of {} instances answered, {} released the lease and {} refused, so whether a majority held it until now is unknown; the keys that remain end by their ttl",
                n.released + n.refused,
                self.instances.len(),
                n.released,
                n.refused
            ),
        ))
    }
}
