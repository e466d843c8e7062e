//! Renewals on one server, many to a script call.
//!
//! With thousands of held locks, a script call per renewal is thousands of
//! calls a second, each parsed, looked up and run on its own by the server.
//! Renewals asked within [`WINDOW`] of each other go to the server together
//! instead, as one [`RENEW_MANY`] call over up to [`PER_CALL`] keys, and
//! each renewal gets its own key's answer. A renewal's validity still
//! counts from when it asked (before the window), so the window only ever
//! makes the holder's count shorter than the server's.
//!
//! On one instance (or Sentinel's master) and on each RedLock master; not
//! on a cluster, whose keys of one call must share a slot, and not with
//! the replica-sync guard or for a lease that carries a value, whose
//! renewals go one to a call as before. A server that refuses keys of
//! several slots in one call with `CROSSSLOT` (a `redis://` URL that names
//! a cluster node, or a proxy that answers so) gets each renewal in a call
//! of its own from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lockcore::raw::batch::{Batches, Waiting};
use lockcore::raw::{validity_deadline, Answers, Renewal, Renewing};
use redis::RedisResult;
use tokio::sync::oneshot;

use crate::config::NAME;
use crate::conn::{evalsha_sized, Conn};
use crate::error::map_err;
use crate::managed::Managed;
use crate::scripts::RENEW_MANY;

/// How long the first renewal of a batch waits for others to join it.
pub(crate) const WINDOW: Duration = Duration::from_millis(2);
/// Keys per call.
pub(crate) const PER_CALL: usize = 256;
/// Calls in flight at once: one, so that on one connection the calls reach
/// the server in the order their renewals were asked. A renewal whose
/// asker gave up after its call was put together is still sent; were a
/// later call (with the same lease's next renewal) to overtake it (a script
/// reloaded after `NOSCRIPT`), a shorter ttl in it would land last and cut
/// the lease short behind its holder's back. (A call the client gave up on
/// at its response timeout may still run on the server after the next call
/// went on a new connection, as a single call could before.)
///
/// The cost: one server takes at most [`PER_CALL`] renewals per round trip
/// (plus the script's time), and a renewal may wait for the call before
/// its own: on a link of tens of milliseconds, with tens of thousands of
/// short-ttl leases, renewals fall behind. Keeping several calls in flight
/// with each lease's renewals in order is the way past that.
const IN_FLIGHT: usize = 1;

/// A lease's key and owner token, made once and shared by its renewals
/// (on every RedLock master).
#[derive(Debug)]
pub(crate) struct KeyToken {
    key: String,
    token: String,
}

impl KeyToken {
    /// The renewals' view of the lease on `key` held with `token`.
    pub(crate) fn new(key: &str, token: &str) -> Arc<KeyToken> {
        Arc::new(KeyToken {
            key: key.to_owned(),
            token: token.to_owned(),
        })
    }

    /// The lease's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The lease's owner token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}

/// One lease's renewal: its key and token, its ttl in milliseconds, and
/// where the answer goes.
struct Renew {
    lease: Arc<KeyToken>,
    ttl_ms: u64,
    reply: Reply,
}

/// Where a renewal's answer goes.
enum Reply {
    /// To the future of [`Renewals::renew`].
    Wait(oneshot::Sender<RedisResult<i64>>),
    /// To the watchdog ([`Renewals::renew_then`]), as a lease's renewal
    /// with `ttl` (counted from when `done` was asked).
    Lease { done: Renewing, ttl: Duration },
    /// To a renewal on several servers ([`Renewals::renew_part`]).
    Part(PartOf),
}

/// A renewal on several servers at once (RedLock's, on every master),
/// told each server's reply by the server's place in its list.
pub(crate) trait Round: Send + Sync {
    /// Server `at` replied; `Err` also for a renewal never sent there, or
    /// not answered by [`until`](Round::until). Among `answers`, the
    /// other renewals its reply answered.
    fn answer(&self, at: usize, reply: RedisResult<i64>, answers: &mut Answers);
    /// The round no longer needs the servers' replies (as seen at `now`):
    /// renewals not yet sent are left out.
    fn gave_up(&self, now: Instant) -> bool;
    /// Past this instant the round takes no reply: its part in a call
    /// still out is answered then as none (and the connection checked),
    /// while the call goes on for the rest.
    fn until(&self) -> Instant;
}

/// One server's part in a [`Round`]: dropped unanswered (left out of a
/// call, or its task ended), it answers with an error.
pub(crate) struct PartOf {
    round: Option<Arc<dyn Round>>,
    at: usize,
}

impl PartOf {
    fn answer(mut self, reply: RedisResult<i64>, answers: &mut Answers) {
        self.answer_now(reply, answers);
    }

    /// Answers the round, if not yet; later answers are dropped.
    fn answer_now(&mut self, reply: RedisResult<i64>, answers: &mut Answers) {
        if let Some(round) = self.round.take() {
            round.answer(self.at, reply, answers);
        }
    }
}

/// The earliest limit of the rounds whose parts in `batch` are still
/// unanswered.
fn next_limit(batch: &[Renew]) -> Option<Instant> {
    batch
        .iter()
        .filter_map(|r| match &r.reply {
            Reply::Part(part) => part.round.as_ref().map(|round| round.until()),
            _ => None,
        })
        .min()
}

/// Answers the parts in `batch` whose round's limit passed by `now` as
/// no reply; the rest wait for the call.
fn expire_parts(batch: &mut [Renew], now: Instant) {
    let mut answers = Answers::new();
    for r in batch {
        if let Reply::Part(part) = &mut r.reply {
            if part
                .round
                .as_ref()
                .is_some_and(|round| round.until() <= now)
            {
                part.answer_now(
                    Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "no reply within the per-server limit",
                    ))),
                    &mut answers,
                );
            }
        }
    }
}

impl Drop for PartOf {
    fn drop(&mut self) {
        if let Some(round) = self.round.take() {
            round.answer(
                self.at,
                Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the renewal was not sent",
                ))),
                &mut Answers::new(),
            );
        }
    }
}

impl Waiting for Renew {
    fn gave_up(&self) -> bool {
        self.gave_up_at(lockcore::raw::now())
    }

    fn gave_up_at(&self, now: Instant) -> bool {
        match &self.reply {
            Reply::Wait(tx) => tx.is_closed(),
            Reply::Lease { done, .. } => done.is_stale_at(now),
            Reply::Part(part) => part.round.as_ref().is_none_or(|r| r.gave_up(now)),
        }
    }
}

impl Renew {
    /// Answers the renewal with the server's `answer` on `server`, among
    /// `answers` (the other renewals of its call).
    fn answer(self, answer: RedisResult<i64>, server: &str, answers: &mut Answers) {
        match self.reply {
            Reply::Wait(tx) => {
                let _ = tx.send(answer);
            }
            Reply::Lease { done, ttl } => {
                let outcome = match answer {
                    Ok(1) => Ok(Renewal::Renewed {
                        valid_until: validity_deadline(done.sent(), ttl),
                    }),
                    // Gone (-1) and another owner's (0) are both lost here.
                    Ok(_) => Ok(Renewal::Lost),
                    Err(e) => Err(map_err(e, RENEWING, server, true)),
                };
                done.answer_with(outcome, answers);
            }
            Reply::Part(part) => part.answer(answer, answers),
        }
    }
}

/// What a failed renewal was doing, in its error.
pub(crate) const RENEWING: &str = "renew (PEXPIRE if owner)";

/// The renewals of one server's connection.
pub(crate) struct Renewals {
    conn: Arc<Managed>,
    /// The server, as errors name it.
    server: Arc<str>,
    batches: Batches<Renew>,
    /// The server refused keys of several slots in one call: each renewal
    /// goes in a call of its own.
    one_each: Arc<AtomicBool>,
}

impl std::fmt::Debug for Renewals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals")
            .field("batches", &self.batches)
            .finish_non_exhaustive()
    }
}

impl Renewals {
    /// The renewals of `conn` to `server`; their task starts on the
    /// first renewal.
    pub(crate) fn new(conn: Arc<Managed>, server: &str) -> Arc<Renewals> {
        Arc::new(Renewals {
            conn,
            server: server.into(),
            batches: Batches::new(WINDOW, PER_CALL, IN_FLIGHT),
            one_each: Arc::default(),
        })
    }

    /// `PEXPIRE key ttl` if the key holds `token`: 1 when renewed, 0 when
    /// another owner's value (or another type) is there, -1 when the key
    /// is gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal dropped before its call was put together is
    /// left out of it; one dropped after that is still sent, and may set
    /// the lease's expiry to its ttl from then. The calls go one after
    /// another, so any later renewal of the lease lands after it.
    pub(crate) async fn renew(&self, lease: &Arc<KeyToken>, ttl_ms: u64) -> RedisResult<i64> {
        let (reply, answer) = oneshot::channel();
        self.send(Renew {
            lease: lease.clone(),
            ttl_ms,
            reply: Reply::Wait(reply),
        });
        answer.await.unwrap_or_else(|_| {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the renewing task ended",
            )))
        })
    }

    /// The renewal of [`renew`](Renewals::renew) with `ttl`, answered to
    /// `done` as a lease's renewal sent now: renewed when the key held
    /// the token, lost when it did not. Left out of its call (and
    /// answered with an error) when the lease's validity deadline passed
    /// before the call was put together.
    pub(crate) fn renew_then(&self, lease: &Arc<KeyToken>, ttl: Duration, done: Renewing) {
        self.send(Renew {
            lease: lease.clone(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            reply: Reply::Lease { done, ttl },
        });
    }

    /// The renewal of [`renew`](Renewals::renew), answered to `round` as
    /// the reply of its server `at`. Sent unless the round gave up first.
    pub(crate) fn renew_part(
        &self,
        lease: &Arc<KeyToken>,
        ttl_ms: u64,
        round: Arc<dyn Round>,
        at: usize,
    ) {
        self.send(Renew {
            lease: lease.clone(),
            ttl_ms,
            reply: Reply::Part(PartOf {
                round: Some(round),
                at,
            }),
        });
    }

    /// Queues `ask` for the next call, starting the task if none runs.
    fn send(&self, ask: Renew) {
        self.batches.send(ask, || {
            let conn = Conn::Single(self.conn.clone());
            let (one_each, server) = (self.one_each.clone(), self.server.clone());
            move |batch| {
                let (conn, one_each, server) = (conn.clone(), one_each.clone(), server.clone());
                async move { renew_batch(&conn, batch, &one_each, &server).await }
            }
        });
    }
}

/// One [`RENEW_MANY`] call for `batch` (a call per renewal, from then on,
/// once the server refused keys of several slots in one); answers each
/// renewal.
///
/// The renewals of one batch are of distinct leases (a lease's next
/// renewal is asked after its last one was answered, or dropped, and a
/// dropped one is left out until its batch is put together), so their calls
/// of one key each may go at once; the next batch waits for them all.
async fn renew_batch(conn: &Conn, batch: Vec<Renew>, one_each: &AtomicBool, server: &str) {
    let batch = if one_each.load(Ordering::Relaxed) {
        batch
    } else {
        match renew_call(conn, batch, server).await {
            None => return,
            Some(refused) => {
                one_each.store(true, Ordering::Relaxed);
                tracing::warn!(
                    backend = NAME,
                    "the server refused the renewals of several keys in one script call (CROSSSLOT: a cluster node, or a proxy); renewing each in a call of its own"
                );
                // Nothing of the refused call applied: leave out the
                // renewals given up meanwhile.
                refused.into_iter().filter(|r| !r.gave_up()).collect()
            }
        }
    };
    join_all(batch.into_iter().map(|r| renew_call(conn, vec![r], server))).await;
}

/// One [`RENEW_MANY`] call for `batch`; answers each renewal, or gives the
/// batch back when the server refused its keys of several slots.
async fn renew_call(conn: &Conn, batch: Vec<Renew>, server: &str) -> Option<Vec<Renew>> {
    // Each key, its token and its ttl (at most 20 digits).
    let bytes = batch
        .iter()
        .map(|r| r.lease.key.len() + r.lease.token.len() + 20)
        .sum();
    let mut call = evalsha_sized(&RENEW_MANY, batch.len(), 3 * batch.len(), bytes);
    for r in &batch {
        call.arg(r.lease.key.as_str());
    }
    for r in &batch {
        call.arg(r.lease.token.as_str()).arg(r.ttl_ms);
    }
    let calling = conn.eval::<Vec<i64>>(&RENEW_MANY, &call);
    tokio::pin!(calling);
    let mut batch = batch;
    let mut suspected = false;
    // A round (RedLock's) takes no reply past its limit: its part is
    // answered there as none (and the connection checked), while the
    // call goes on for the rest and holds its place in the order.
    let result: RedisResult<Vec<i64>> = loop {
        let Some(until) = next_limit(&batch) else {
            break calling.await;
        };
        tokio::select! {
            result = &mut calling => break result,
            () = tokio::time::sleep_until(until.into()) => {
                expire_parts(&mut batch, Instant::now());
                if !std::mem::replace(&mut suspected, true) {
                    if let Conn::Single(m) = conn {
                        m.suspect_current();
                    }
                }
            }
        }
    };
    let mut given = Answers::new();
    match result {
        Ok(answers) if answers.len() == batch.len() => {
            for (r, n) in batch.into_iter().zip(answers) {
                r.answer(Ok(n), server, &mut given);
            }
        }
        Ok(answers) => {
            let e = redis::RedisError::from((
                redis::ErrorKind::Parse,
                "renewals",
                format!("{} answers to {} renewals", answers.len(), batch.len()),
            ));
            for r in batch {
                r.answer(Err(e.clone()), server, &mut given);
            }
        }
        Err(e)
            if batch.len() > 1
                && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot) =>
        {
            return Some(batch);
        }
        Err(e) => {
            for r in batch {
                r.answer(Err(e.clone()), server, &mut given);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
