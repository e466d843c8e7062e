//! A renewal on every master, answered as the masters' batches reply.
//!
//! The renewal of [`renew_then`](lockcore::raw::BackendLease::renew_then)
//! goes in each master's next batch of renewals, and the round counts the
//! replies as they come: renewed once a majority renewed (within the
//! validity counted from the send), lost once too many refused for a
//! majority to hold it, and otherwise unavailable once every master
//! replied. A reply later than the per-master limit counts as none, as
//! in [`renew`](lockcore::raw::BackendLease::renew). Once renewed, a
//! master that lost the key (restarted without persistence) gets it back
//! by `SET NX`, also when its reply comes after the majority's: in a task
//! of its own, never after the lease's release began ([`Retakes`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use lockcore::raw::{Answers, Renewing};
use redis::RedisResult;

use super::quorum::{on_each, Ask, Call, Instance, Straggling};
use crate::config::NAME;
use crate::managed::Managed;
use crate::renewals::{KeyToken, Round};
use crate::scripts::ttl_ms;

/// A lease's keys set again on masters that lost them (by its renewals
/// answered at the majority): none once the lease's release or abandon
/// began, and a release (or a renewal by `renew`, which may change the
/// ttl) waits for those under way, so that no `SET NX` lands after it.
#[derive(Debug, Default)]
pub(super) struct Retakes {
    /// Held (read) by each while it runs.
    under_way: tokio::sync::RwLock<()>,
    ended: AtomicBool,
}

impl Retakes {
    /// No key is set again from now.
    pub(super) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    /// Waits for those under way.
    pub(super) async fn wait(&self) {
        drop(self.under_way.write().await);
    }
}

/// One renewal of a lease on every master.
pub(super) struct QuorumRound {
    sent: Instant,
    /// The lease's validity deadline when the round began: past it, the
    /// lease is lost, and renewals not yet sent are left out.
    valid_until: Instant,
    /// How many masters are asked.
    masters: usize,
    ttl: Duration,
    quorum: usize,
    limit: Duration,
    instances: Arc<Vec<Instance>>,
    lease: Arc<KeyToken>,
    /// The lease's keys set again (see [`Retakes`]).
    retakes: Arc<Retakes>,
    counts: Mutex<Counts>,
}

/// The replies so far.
#[derive(Default)]
struct Counts {
    renewed: usize,
    refused: usize,
    replied: usize,
    /// The masters that replied that the key is missing.
    missing: Vec<usize>,
    /// Where the outcome goes; taken once it is known.
    done: Option<Renewing>,
    /// The outcome was renewed: missing keys are set again.
    renewed_all: bool,
}

impl QuorumRound {
    /// A round for the renewal with `ttl` sent now, answered to `done`.
    pub(super) fn new(
        done: Renewing,
        ttl: Duration,
        quorum: usize,
        limit: Duration,
        instances: Arc<Vec<Instance>>,
        lease: Arc<KeyToken>,
        retakes: Arc<Retakes>,
    ) -> Arc<QuorumRound> {
        Arc::new(QuorumRound {
            sent: done.sent(),
            valid_until: done.valid_until(),
            masters: instances.len(),
            ttl,
            quorum,
            limit,
            instances,
            lease,
            retakes,
            counts: Mutex::new(Counts {
                done: Some(done),
                ..Counts::default()
            }),
        })
    }

    /// The outcome the replies in `c` settle at `now`, if they do.
    fn outcome(&self, c: &Counts, now: Instant) -> Option<Result<Renewal>> {
        let n = self.masters;
        if c.renewed >= self.quorum {
            let valid_until = validity_deadline(self.sent, self.ttl);
            return Some(if now < valid_until {
                Ok(Renewal::Renewed { valid_until })
            } else {
                Err(Error::unavailable(
                    NAME,
                    "RedLock renewal: a majority renewed only after the validity it gives had passed",
                ))
            });
        }
        if c.refused > n - self.quorum {
            return Some(Ok(Renewal::Lost));
        }
        (c.replied >= n).then(|| {
            Err(Error::unavailable(
                NAME,
                format!(
                    "RedLock renewal: {} of {n} instances renewed, {} needed",
                    c.renewed, self.quorum
                ),
            ))
        })
    }

    /// Sets the key again (`SET NX`) on the masters `at` that lost it.
    fn retake(&self, at: &[usize]) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let conns: Vec<Arc<Managed>> = at
            .iter()
            .filter_map(|i| self.instances.get(*i))
            .map(|i| i.conn.clone())
            .collect();
        let call = Call {
            key: self.lease.key().to_owned(),
            ask: Ask::SetNx {
                token: self.lease.token().to_owned(),
                ttl: ttl_ms(self.ttl),
            },
            limit: self.limit,
        };
        let retakes = self.retakes.clone();
        let _in = rt.enter();
        spawn_cleanup(
            "set a RedLock key again where a master lost it",
            async move {
                let _under_way = retakes.under_way.read().await;
                if !retakes.ended.load(Ordering::SeqCst) {
                    let _ = on_each(&conns, call, |_| false, Straggling::default()).await;
                }
            },
        );
    }
}

impl Round for QuorumRound {
    fn answer(&self, at: usize, reply: RedisResult<i64>, answers: &mut Answers) {
        let now = answers.now();
        let late = now.saturating_duration_since(self.sent) > self.limit;
        let (answer, retake) = {
            let mut c = lock(&self.counts);
            c.replied += 1;
            match reply {
                _ if late => {}
                Ok(1) => c.renewed += 1,
                Ok(0) => c.refused += 1,
                Ok(-1) => c.missing.push(at),
                _ => {}
            }
            let answer = match c.done.is_some() {
                true => self.outcome(&c, now),
                false => None,
            };
            if matches!(answer, Some(Ok(Renewal::Renewed { .. }))) {
                c.renewed_all = true;
            }
            let answer = answer.and_then(|a| c.done.take().map(|d| (d, a)));
            let retake = match c.renewed_all {
                true => std::mem::take(&mut c.missing),
                false => Vec::new(),
            };
            (answer, retake)
        };
        if !retake.is_empty() {
            self.retake(&retake);
        }
        if let Some((done, answer)) = answer {
            done.answer_with(answer, answers);
        }
    }

    fn gave_up(&self, now: Instant) -> bool {
        now > self.sent + self.limit || now >= self.valid_until
    }

    fn until(&self) -> Instant {
        self.sent + self.limit
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A round over three masters (none reachable: nothing is sent) whose
    /// answer goes to the receiver, with a limit of `limit`.
    fn round(limit: Duration) -> (Arc<QuorumRound>, mpsc::Receiver<Option<Result<Renewal>>>) {
        let (tx, rx) = mpsc::channel();
        let until = Instant::now() + Duration::from_secs(3);
        let done = Renewing::new(until, move |answer| {
            let _ = tx.send(answer);
        });
        let mut r = QuorumRound::new(
            done,
            Duration::from_secs(3),
            2,
            limit,
            Arc::new(Vec::new()),
            KeyToken::new("k", "t"),
            Arc::default(),
        );
        Arc::get_mut(&mut r).expect("one reference").masters = 3;
        (r, rx)
    }

    fn io() -> RedisResult<i64> {
        Err(redis::RedisError::from((redis::ErrorKind::Io, "down")))
    }

    #[test]
    fn a_majority_renewed_answers_without_waiting_for_the_rest() {
        let (r, rx) = round(Duration::from_secs(1));
        r.answer(0, Ok(1), &mut Answers::new());
        assert!(rx.try_recv().is_err(), "answered after one of three");
        r.answer(2, Ok(1), &mut Answers::new());
        let got = rx.try_recv().expect("answered after two of three");
        assert!(matches!(got, Some(Ok(Renewal::Renewed { .. }))), "{got:?}");
        // The last reply changes nothing, and answers nothing twice.
        r.answer(1, Ok(0), &mut Answers::new());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn too_many_refusals_are_lost_and_too_few_answers_unavailable() {
        let (r, rx) = round(Duration::from_secs(1));
        r.answer(0, Ok(0), &mut Answers::new());
        r.answer(1, Ok(-1), &mut Answers::new());
        assert!(rx.try_recv().is_err(), "decided on one refusal");
        r.answer(2, Ok(0), &mut Answers::new());
        assert!(matches!(rx.try_recv(), Ok(Some(Ok(Renewal::Lost)))));

        let (r, rx) = round(Duration::from_secs(1));
        r.answer(0, Ok(1), &mut Answers::new());
        r.answer(1, io(), &mut Answers::new());
        assert!(rx.try_recv().is_err());
        r.answer(2, Ok(0), &mut Answers::new());
        let got = rx.try_recv().expect("answered once all replied");
        let e = got.expect("an answer").expect_err("not renewed");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.to_string().contains("1 of 3 instances renewed"), "{e}");
    }

    #[test]
    fn a_missing_key_is_no_renewal() {
        let (r, rx) = round(Duration::from_secs(1));
        r.answer(0, Ok(1), &mut Answers::new());
        r.answer(1, Ok(-1), &mut Answers::new());
        assert!(rx.try_recv().is_err(), "decided on a missing key");
        r.answer(2, Ok(1), &mut Answers::new());
        assert!(matches!(
            rx.try_recv(),
            Ok(Some(Ok(Renewal::Renewed { .. })))
        ));

        let (r, rx) = round(Duration::from_secs(1));
        for (at, n) in [(0, 1), (1, -1), (2, -1)] {
            r.answer(at, Ok(n), &mut Answers::new());
        }
        let e = rx.try_recv().expect("answered").expect("an answer");
        assert_eq!(e.expect_err("renewed").kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn a_majority_after_the_validity_it_gives_is_no_renewal() {
        let (tx, rx) = mpsc::channel();
        let done = Renewing::new(Instant::now() + Duration::from_secs(3), move |a| {
            let _ = tx.send(a);
        });
        let mut r = QuorumRound::new(
            done,
            Duration::from_millis(1),
            2,
            Duration::from_secs(1),
            Arc::new(Vec::new()),
            KeyToken::new("k", "t"),
            Arc::default(),
        );
        Arc::get_mut(&mut r).expect("one reference").masters = 3;
        std::thread::sleep(Duration::from_millis(5));
        r.answer(0, Ok(1), &mut Answers::new());
        r.answer(1, Ok(1), &mut Answers::new());
        let e = rx.try_recv().expect("answered").expect("an answer");
        let e = e.expect_err("renewed past its own validity");
        assert!(e.to_string().contains("only after the validity"), "{e}");
    }

    #[test]
    fn replies_after_the_limit_count_as_none() {
        let (r, rx) = round(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert!(r.gave_up(Instant::now()));
        for at in 0..3 {
            r.answer(at, Ok(1), &mut Answers::new());
        }
        let got = rx.try_recv().expect("answered once all replied");
        let e = got.expect("an answer").expect_err("late replies renewed");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }
}
