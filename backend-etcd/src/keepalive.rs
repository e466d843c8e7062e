//! A few long-lived keep-alive streams for every lease of a backend.
//!
//! etcd's `LeaseKeepAlive` is a bidirectional stream that accepts any lease
//! id in each request and answers each request, in order, with the id and
//! its remaining ttl (0 when the lease is gone). A stream per renewal costs
//! a stream set-up and a reset each; with thousands of held leases the
//! client's HTTP/2 layer gives up the connection for too many resets
//! (`GOAWAY too_many_internal_resets`), failing every request on it. So a backend keeps
//! [`STREAMS`] streams, each owned by a task that sends the ids of its
//! leases (a lease always goes to the same one) and routes each answer to
//! the renewal that asked (Go's `clientv3.Lease` keeps one stream). Not one:
//! the server handles a stream's requests one after another, and under a
//! heavy write load each waits on the lessor, so one stream falls behind
//! thousands of renewals a second.
//!
//! Renewals of one lease close together share a keepalive: a renewal that
//! allows it (a shared lease's, see `shared.rs`) takes the answer of a
//! keepalive of its lease sent at most its `fresh` window before (read
//! where it asks, without a trip to the task), or joins one in flight that
//! recent, and counts its validity from that keepalive's send time. So ten
//! thousand locks on one lease cost a few keepalives a second, not ten
//! thousand.
//!
//! At most [`IN_FLIGHT`] keepalives wait on a stream; the rest wait in the
//! task, and those whose renewal gave up are dropped unsent. A stream that
//! ends, fails, or leaves any keepalive unanswered past its renewal's own
//! deadline (counted from when the renewal asked) is dropped (one reset) and every renewal waiting on it fails with `Unavailable`; the
//! next renewal opens a new stream (perhaps to another member).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use futures_util::FutureExt;
use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use tokio::sync::{mpsc, oneshot};

use crate::config::NAME;
use crate::error::map_err;
use lockcore::raw::batch::Worker;

use sent::{Answer, Ask, Recent, Sent};

/// Keep-alive streams per backend.
pub(crate) const STREAMS: usize = 16;

/// Keepalives in flight on one stream at most; the rest wait in the task,
/// where those whose renewal gave up are dropped unsent.
const IN_FLIGHT: usize = 256;

/// How often a stream with renewals in flight is checked for lag.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The handle on a backend's keep-alive tasks, each started on first use
/// (and again if the runtime that ran it has ended).
pub(crate) struct KeepAlives {
    client: Client,
    servers: String,
    tasks: [Worker<Ask>; STREAMS],
    /// The last answer for each lease renewed with a `fresh` window.
    recent: Recent,
}

impl KeepAlives {
    /// A handle for `client`; its tasks run on the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it is called from `connect`, inside one).
    pub(crate) fn new(client: Client, servers: String) -> Self {
        KeepAlives {
            client,
            servers,
            tasks: std::array::from_fn(|_| Worker::new()),
            recent: Recent::default(),
        }
    }

    /// Renews `id` on its lease's stream and waits for the answer: a
    /// keepalive of its own, or, within `fresh`, one of the same lease sent
    /// that recently (answered or in flight). `Some(sent)`: renewed by a
    /// keepalive sent at `sent`; `None`: the lease is gone. A stream that
    /// leaves a renewal unanswered for its `limit` is replaced.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped renewal at most extended the lease; its
    /// answer is discarded.
    pub(crate) async fn renew(
        &self,
        id: i64,
        limit: Duration,
        fresh: Duration,
    ) -> Result<Option<Instant>> {
        let now = Instant::now();
        if let Some(known) = self.known(id, fresh, now) {
            return Ok(known);
        }
        let (reply, answer) = oneshot::channel();
        let deadline = now + limit;
        self.send(Ask {
            id,
            limit,
            deadline,
            fresh,
            reply,
        });
        match answer.await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(
                NAME,
                format!(
                    "renewing the lease on {}: the keep-alive task ended",
                    self.servers
                ),
            )),
        }
    }

    /// The answer of a keepalive of `id` sent within `fresh` and answered,
    /// as [`renew`](Self::renew) takes it at `now`; `None` when there is
    /// none.
    pub(crate) fn known(&self, id: i64, fresh: Duration, now: Instant) -> Option<Option<Instant>> {
        let since = now.checked_sub(fresh)?;
        let a = *lock(&self.recent).get(&id)?;
        (!fresh.is_zero() && a.sent >= since).then_some(a.alive.then_some(a.sent))
    }

    /// Whether a renewal that took the answer of `id`'s keepalive sent at
    /// `sent` ([`known`](Self::known), within `fresh`) should ask for the
    /// next one now: true once per answer, when it is older than three
    /// quarters of `fresh`. A keepalive sent then is answered before the
    /// window ends, so that the renewals coming due after it still find an
    /// answer they may take, instead of each waiting on a keepalive of
    /// their own. `now` is the time read for the renewal.
    pub(crate) fn ask_ahead(&self, id: i64, sent: Instant, fresh: Duration, now: Instant) -> bool {
        sent::ask_ahead(&self.recent, id, sent, fresh, now)
    }

    /// Hands `ask` to its lease's task, starting one if none runs.
    fn send(&self, ask: Ask) {
        // Lease ids are spread evenly: so are the leases over the streams.
        let slot = (ask.id.unsigned_abs() % STREAMS as u64) as usize;
        self.tasks[slot].send(ask, |rx| {
            Task {
                client: self.client.clone(),
                servers: self.servers.clone(),
                recent: self.recent.clone(),
                rx,
            }
            .run()
        });
    }
}

/// The open stream and the renewals waiting on it.
struct Open {
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
    /// Asked, not yet sent (the stream's send buffer was full).
    outbox: VecDeque<Ask>,
    sent: Sent,
}

impl Open {
    /// Fails every renewal waiting on this stream or to be sent on it.
    fn fail_all(self, e: &Error) {
        let copy = || Error::new(e.kind(), NAME, e.message());
        for p in self.sent.waiting.into_values().flatten() {
            for reply in p.replies {
                let _ = reply.send(Err(copy()));
            }
        }
        for ask in self.outbox {
            let _ = ask.reply.send(Err(copy()));
        }
    }
}

/// The task that owns the stream.
struct Task {
    client: Client,
    servers: String,
    recent: Recent,
    rx: mpsc::UnboundedReceiver<Ask>,
}

impl Task {
    async fn run(mut self) {
        let mut open: Option<Open> = None;
        // How often a stream with renewals in flight is checked for lag.
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let Some(o) = open.as_mut() else {
                // No stream: the next renewal opens one.
                let Some(ask) = self.rx.recv().await else {
                    return;
                };
                open = self.open(ask).await;
                continue;
            };
            // Each branch handles everything ready of its kind at once, so
            // thousands of renewals a second cost few turns of this loop.
            // Set by a branch that ends the stream.
            let broken: Option<Error> = tokio::select! {
                msg = o.answers.message() => {
                    let mut msg = Some(msg);
                    loop {
                        match msg {
                            Some(Ok(Some(resp))) => o.sent.answer(resp.id(), resp.ttl()),
                            Some(Ok(None)) => break Some(self.gone("the server ended the keep-alive stream")),
                            Some(Err(e)) => break Some(map_err(e, "renewing the lease", &self.servers, false)),
                            None => break None,
                        }
                        msg = o.answers.message().now_or_never();
                    }
                }
                ask = self.rx.recv() => {
                    let Some(ask) = ask else { return };
                    let mut next = Some(ask);
                    while let Some(ask) = next {
                        if !ask.reply.is_closed() {
                            if let Some(ask) = o.sent.join(ask) {
                                o.outbox.push_back(ask);
                            }
                        }
                        next = self.rx.try_recv().ok();
                    }
                    None
                }
                permit = o.keeper.sender.reserve(),
                    if !o.outbox.is_empty() && o.sent.in_flight() < IN_FLIGHT =>
                {
                    match permit {
                        Ok(permit) => {
                            let mut permit = Some(permit);
                            while let Some(p) = permit.take() {
                                let Some(ask) = o.outbox.pop_front() else { break };
                                if ask.reply.is_closed() {
                                    // Its renewal gave up: renew nothing for it.
                                    permit = Some(p);
                                    continue;
                                }
                                // One sent since it was queued may answer it.
                                let Some(ask) = o.sent.join(ask) else {
                                    permit = Some(p);
                                    continue;
                                };
                                let mut req = blank(&o.keeper.sender);
                                req.id = ask.id;
                                let sent = Instant::now();
                                p.send(req);
                                o.sent.push(ask, sent);
                                if !o.outbox.is_empty() && o.sent.in_flight() < IN_FLIGHT {
                                    permit = o.keeper.sender.try_reserve().ok();
                                }
                            }
                            None
                        }
                        Err(_) => Some(self.gone("the stream's sender closed")),
                    }
                }
                _ = check.tick() => {
                    o.sent.prune();
                    o.sent.behind().then(|| {
                        self.gone("a keepalive was not answered within its request's time")
                    })
                }
            };
            if let Some(e) = broken {
                tracing::debug!(backend = NAME, error = %e, "the keep-alive stream ended; the next renewal opens another");
                if let Some(o) = open.take() {
                    o.fail_all(&e);
                }
            }
        }
    }

    /// Opens a stream with `ask`'s lease as its first keepalive and answers
    /// it. On failure, fails `ask` and every renewal already queued behind
    /// it (they would meet the same server), and returns `None`.
    async fn open(&mut self, ask: Ask) -> Option<Open> {
        if ask.reply.is_closed() {
            return None;
        }
        let mut lc = self.client.lease_client();
        let sent = Instant::now();
        let err = match tokio::time::timeout(ask.limit, lc.keep_alive(ask.id)).await {
            Ok(Ok((keeper, answers))) => {
                if !ask.fresh.is_zero() {
                    lock(&self.recent).insert(ask.id, Answer::new(sent, true));
                }
                let _ = ask.reply.send(Ok(Some(sent)));
                return Some(Open {
                    keeper,
                    answers,
                    outbox: VecDeque::new(),
                    sent: Sent::new(self.recent.clone()),
                });
            }
            // The first answer said ttl 0: that lease is gone; the next
            // renewal opens a stream with its own.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                let _ = ask.reply.send(Ok(None));
                return None;
            }
            Ok(Err(e)) => map_err(e, "renewing the lease", &self.servers, false),
            Err(_) => self.gone(&format!("no keepalive answered within {:?}", ask.limit)),
        };
        let copy = || Error::new(err.kind(), NAME, err.message());
        let _ = ask.reply.send(Err(copy()));
        while let Ok(queued) = self.rx.try_recv() {
            let _ = queued.reply.send(Err(copy()));
        }
        None
    }

    fn gone(&self, why: &str) -> Error {
        Error::unavailable(
            NAME,
            format!("renewing the lease on {}: {why}", self.servers),
        )
    }
}

/// A blank request of the stream's own message type (the client library
/// exposes the sender but does not name the type).
fn blank<T: Default>(_: &mpsc::Sender<T>) -> T {
    T::default()
}

mod sent;
