//! A renewal's outcome, and a renewal whose answer a backend's task gives
//! ([`Renewing`]), alone or many together ([`Answers`]).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::raw::watchdog::{Watchdog, Watched};

/// The outcome of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed; the lease is now valid until this instant.
    Renewed {
        /// The new validity deadline (send time of the request + ttl − drift).
        valid_until: Instant,
    },
    /// The server no longer holds this lease for this owner.
    Lost,
}

/// A renewal started by
/// [`BackendLease::renew_then`](crate::raw::BackendLease::renew_then): answer
/// it once with [`answer`](Renewing::answer), or with
/// [`answer_with`](Renewing::answer_with) among others answered together.
/// Dropped unanswered (a backend's task that ended), it answers that the
/// renewal failed, with [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable):
/// the watchdog retries while the lease is valid.
pub struct Renewing {
    /// The lease's validity deadline when the renewal was asked.
    until: Instant,
    /// When the renewal was asked.
    sent: Instant,
    answer: Option<Answer>,
}

/// Where a [`Renewing`]'s answer goes.
enum Answer {
    /// To a function: `None` when the renewal was dropped unanswered.
    Call(Box<dyn FnOnce(Option<Result<Renewal>>) + Send>),
    /// To a held lease, which holds its renewal turn until then.
    Lease(Arc<dyn Answered>),
}

/// A held lease, as a renewal's answer reaches it.
pub(crate) trait Answered: Watched {
    /// Applies the answer to its renewal sent at `sent` (`None`: dropped
    /// unanswered), as seen at `now`: returns the lease's next check, or
    /// `None` when it is no longer watched. Under the lease's renewal turn.
    fn apply(
        &self,
        sent: Instant,
        now: Instant,
        answer: Option<Result<Renewal>>,
    ) -> Option<Instant>;
    /// The watchdog that watches it.
    fn watchdog(&self) -> &Arc<Watchdog>;
    /// Gives back the renewal turn, once its next check is in the queue.
    fn turn_back(&self);
}

impl fmt::Debug for Renewing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renewing")
            .field("answered", &self.answer.is_none())
            .finish()
    }
}

impl Renewing {
    /// A renewal of a lease valid until `until`, asked now, answered by
    /// `answer`: `Some` with the backend's answer, `None` when it was
    /// dropped unanswered. The watchdog makes these; a backend's own tests
    /// may too.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::time::{Duration, Instant};
    /// use lockcore::raw::{Renewal, Renewing};
    ///
    /// let (tx, rx) = mpsc::channel();
    /// let until = Instant::now() + Duration::from_secs(3);
    /// let done = Renewing::new(until, move |answer| {
    ///     let _ = tx.send(answer.map(|a| a.is_ok()));
    /// });
    /// assert!(!done.is_stale());
    /// done.answer(Ok(Renewal::Lost));
    /// assert_eq!(rx.recv().unwrap(), Some(true));
    /// drop(Renewing::new(until, |answer| assert!(answer.is_none())));
    /// ```
    pub fn new(
        until: Instant,
        answer: impl FnOnce(Option<Result<Renewal>>) + Send + 'static,
    ) -> Self {
        Renewing {
            until,
            sent: crate::raw::now(),
            answer: Some(Answer::Call(Box::new(answer))),
        }
    }

    /// The renewal of `lease`, valid until `until`, asked at `sent`, which
    /// lends it its renewal turn until the answer.
    pub(crate) fn of_lease(lease: Arc<dyn Answered>, until: Instant, sent: Instant) -> Self {
        Renewing {
            until,
            sent,
            answer: Some(Answer::Lease(lease)),
        }
    }

    /// The lease's validity deadline when the renewal was asked.
    pub fn valid_until(&self) -> Instant {
        self.until
    }

    /// When the renewal was asked: a validity counted from then is never
    /// longer than the server's.
    pub fn sent(&self) -> Instant {
        self.sent
    }

    /// Whether the lease's validity deadline (as it was when the renewal
    /// was asked) has passed: the lease is lost by then, and a renewal not
    /// yet sent is better left out (dropped, or answered with an error).
    pub fn is_stale(&self) -> bool {
        self.is_stale_at(crate::raw::now())
    }

    /// [`is_stale`](Renewing::is_stale) at `now`, read by the caller (once
    /// for many renewals).
    pub fn is_stale_at(&self, now: Instant) -> bool {
        now >= self.until
    }

    /// Answers the renewal with what
    /// [`BackendLease::renew`](crate::raw::BackendLease::renew) would have
    /// returned.
    pub fn answer(self, outcome: Result<Renewal>) {
        let mut answers = Answers::new();
        self.answer_with(outcome, &mut answers);
    }

    /// [`answer`](Renewing::answer), among `answers`: the renewals one
    /// reply answers, applied together.
    pub fn answer_with(mut self, outcome: Result<Renewal>, answers: &mut Answers) {
        self.give(Some(outcome), answers);
    }

    /// Takes the renewal back unstarted: nothing is answered (the answer
    /// is dropped uncalled; a lease's turn comes back).
    pub(crate) fn unsent(mut self) {
        if let Some(Answer::Lease(lease)) = self.answer.take() {
            lease.turn_back();
        }
    }

    fn give(&mut self, outcome: Option<Result<Renewal>>, answers: &mut Answers) {
        match self.answer.take() {
            None => {}
            Some(Answer::Call(call)) => call(outcome),
            Some(Answer::Lease(lease)) => {
                // The turn comes back as `Lent` drops, in a panic too.
                let lent = Lent(lease);
                let next = lent.0.apply(self.sent, answers.now, outcome);
                answers.puts.push((lent, next));
            }
        }
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        if self.answer.is_some() {
            let mut answers = Answers::new();
            self.give(None, &mut answers);
        }
    }
}

/// A lease whose renewal's answer was applied, its turn still lent:
/// dropped, it gives the turn back.
struct Lent(Arc<dyn Answered>);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.turn_back();
    }
}

/// Renewals answered together, by a backend's task that answers many
/// from one reply: the clock is read once for all of them, and their
/// leases go back in the watchdog's queue together, under one lock, when
/// this is dropped.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lockcore::raw::{Answers, Renewal, Renewing};
///
/// let until = Instant::now() + Duration::from_secs(3);
/// let mut answers = Answers::new();
/// for _ in 0..3 {
///     let done = Renewing::new(until, |answer| assert!(answer.is_some()));
///     done.answer_with(Ok(Renewal::Lost), &mut answers);
/// }
/// drop(answers);
/// ```
pub struct Answers {
    now: Instant,
    puts: Vec<(Lent, Option<Instant>)>,
}

impl fmt::Debug for Answers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Answers")
            .field("pending", &self.puts.len())
            .finish()
    }
}

impl Default for Answers {
    fn default() -> Self {
        Answers::new()
    }
}

impl Answers {
    /// Answers given now: call this as the reply arrives.
    pub fn new() -> Self {
        Answers {
            now: crate::raw::now(),
            puts: Vec::new(),
        }
    }

    /// When the reply arrived, as these answers count it.
    pub fn now(&self) -> Instant {
        self.now
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        let mut puts = std::mem::take(&mut self.puts);
        // The leases of one watchdog (all of them, as a rule) under one
        // lock each; every turn comes back after its lease's put, as the
        // `Lent`s drop (in a panic too).
        while let Some((first, _)) = puts.first() {
            let watchdog = first.0.watchdog().clone();
            let mine =
                |(lent, _): &(Lent, Option<Instant>)| Arc::ptr_eq(lent.0.watchdog(), &watchdog);
            let rest = if puts.iter().all(mine) {
                Vec::new()
            } else {
                let (these, rest) = puts.into_iter().partition(mine);
                puts = these;
                rest
            };
            watchdog.put_all(
                puts.iter().map(|(lent, next)| {
                    let item: Arc<dyn Watched> = lent.0.clone();
                    (item, *next)
                }),
                self.now,
            );
            drop(puts);
            puts = rest;
        }
    }
}
