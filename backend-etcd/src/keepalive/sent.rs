//! What a keep-alive stream's task knows: the keepalives sent on its
//! stream and not answered, with the renewals waiting on each, and every
//! shared lease's last answer, which renewals may take; and what a
//! renewal asks.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use tokio::sync::oneshot;

/// What a renewal asked: `Ok(Some(sent))` renewed by a keepalive sent at
/// `sent`, `Ok(None)` the lease is gone.
pub(super) type Reply = oneshot::Sender<Result<Option<Instant>>>;

/// One renewal's request: the lease and where its answer goes.
pub(super) struct Ask {
    pub(super) id: i64,
    /// How long the renewal waits for its answer.
    pub(super) limit: Duration,
    /// Until when: `limit` from when the renewal asked.
    pub(super) deadline: Instant,
    /// How old a keepalive of the same lease it may take the answer of.
    pub(super) fresh: Duration,
    pub(super) reply: Reply,
}

/// Each shared lease's last answer. Written by the tasks, read by the
/// renewals (each renewal looks its lease up: the ids are random, so a
/// fixed hasher serves).
pub(super) type Recent = Arc<Mutex<HashMap<i64, Answer, foldhash::fast::FixedState>>>;

/// A shared lease's last answer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answer {
    /// When its keepalive was sent.
    pub(super) sent: Instant,
    /// Whether the lease lived.
    pub(super) alive: bool,
    /// Whether a keepalive was asked ahead of this answer's window's end
    /// (see [`KeepAlives::ask_ahead`](super::KeepAlives::ask_ahead)).
    pub(super) ahead: bool,
}

impl Answer {
    pub(super) fn new(sent: Instant, alive: bool) -> Self {
        Answer {
            sent,
            alive,
            ahead: false,
        }
    }
}

/// [`KeepAlives::ask_ahead`](super::KeepAlives::ask_ahead) at `now`.
pub(super) fn ask_ahead(
    recent: &Recent,
    id: i64,
    sent: Instant,
    fresh: Duration,
    now: Instant,
) -> bool {
    if now.saturating_duration_since(sent) < fresh * 3 / 4 {
        return false;
    }
    match lock(recent).get_mut(&id) {
        Some(a) if a.sent == sent && a.alive && !a.ahead => {
            a.ahead = true;
            true
        }
        _ => false,
    }
}

/// One keepalive sent and not answered, and the renewals waiting on it.
pub(super) struct Pending {
    sent: Instant,
    /// Asked with a `fresh` window: its answer is kept for others.
    kept: bool,
    pub(super) replies: Vec<Reply>,
}

/// How long a lease's last answer is kept for renewals that may take it:
/// the longest `fresh` window (`shared.rs` caps it at a second).
const RECENT: Duration = Duration::from_secs(1);

/// The renewals sent on a stream and not answered.
pub(super) struct Sent {
    /// By lease id, in the order sent.
    pub(super) waiting: HashMap<i64, VecDeque<Pending>>,
    /// Until when each waits, in the order sent (the order answered).
    deadlines: VecDeque<Instant>,
    /// The answers kept for renewals with a `fresh` window.
    recent: Recent,
}

impl Sent {
    pub(super) fn new(recent: Recent) -> Self {
        Sent {
            waiting: HashMap::new(),
            deadlines: VecDeque::new(),
            recent,
        }
    }

    /// Answers `ask` from a keepalive of its lease sent within its
    /// `fresh` window (answered, or in flight); gives it back otherwise.
    pub(super) fn join(&mut self, ask: Ask) -> Option<Ask> {
        if ask.fresh.is_zero() {
            return Some(ask);
        }
        let Some(since) = Instant::now().checked_sub(ask.fresh) else {
            return Some(ask);
        };
        if let Some(&a) = lock(&self.recent).get(&ask.id) {
            if a.sent >= since {
                let _ = ask.reply.send(Ok(a.alive.then_some(a.sent)));
                return None;
            }
        }
        match self.waiting.get_mut(&ask.id).and_then(|q| q.back_mut()) {
            Some(p) if p.sent >= since => {
                p.replies.push(ask.reply);
                None
            }
            _ => Some(ask),
        }
    }

    /// Records a keepalive of `ask`'s lease sent at `sent`.
    pub(super) fn push(&mut self, ask: Ask, sent: Instant) {
        let Ask {
            id,
            deadline,
            fresh,
            reply,
            ..
        } = ask;
        self.waiting.entry(id).or_default().push_back(Pending {
            sent,
            kept: !fresh.is_zero(),
            replies: vec![reply],
        });
        self.deadlines.push_back(deadline);
    }

    /// Routes one answer to the renewals waiting on it.
    pub(super) fn answer(&mut self, id: i64, ttl: i64) {
        if let Some(q) = self.waiting.get_mut(&id) {
            if let Some(p) = q.pop_front() {
                self.deadlines.pop_front();
                let alive = ttl > 0;
                if p.kept {
                    lock(&self.recent).insert(id, Answer::new(p.sent, alive));
                }
                for reply in p.replies {
                    let _ = reply.send(Ok(alive.then_some(p.sent)));
                }
            }
            if q.is_empty() {
                self.waiting.remove(&id);
            }
        }
    }

    /// Forgets the answers too old for any renewal to take.
    pub(super) fn prune(&mut self) {
        if let Some(since) = Instant::now().checked_sub(RECENT) {
            lock(&self.recent).retain(|_, a| a.sent >= since);
        }
    }

    pub(super) fn in_flight(&self) -> usize {
        self.deadlines.len()
    }

    /// Whether a renewal in flight is past its own deadline: the stream is
    /// stalled or too far behind for it (renewals of shorter ttls have
    /// shorter deadlines, so not only the oldest is looked at).
    pub(super) fn behind(&self) -> bool {
        let now = Instant::now();
        self.deadlines.iter().any(|d| *d < now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keepalive_is_asked_ahead_once_an_answer() {
        let recent = Recent::default();
        let (t0, fresh) = (Instant::now(), Duration::from_millis(100));
        let at = |ms| t0 + Duration::from_millis(ms);
        // No answer known: nothing to ask ahead of.
        assert!(!ask_ahead(&recent, 7, t0, fresh, at(80)));
        lock(&recent).insert(7, Answer::new(t0, true));
        assert!(!ask_ahead(&recent, 7, t0, fresh, at(74)), "too early");
        assert!(ask_ahead(&recent, 7, t0, fresh, at(75)));
        assert!(!ask_ahead(&recent, 7, t0, fresh, at(90)), "asked once");
        // The next answer: asked ahead of it in its turn.
        lock(&recent).insert(7, Answer::new(at(76), true));
        assert!(!ask_ahead(&recent, 7, t0, fresh, at(90)), "an older answer");
        assert!(ask_ahead(&recent, 7, at(76), fresh, at(160)));
        // A lease found gone is not kept alive.
        lock(&recent).insert(8, Answer::new(t0, false));
        assert!(!ask_ahead(&recent, 8, t0, fresh, at(90)));
    }
}
