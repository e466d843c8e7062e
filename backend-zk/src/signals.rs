//! The lost signals of the leases on one session, raised together when the
//! session ends: one event reaches every lock the session holds, also when
//! the client still keeps their node watches (a session given up while the
//! server is gone, which the client waits to reconnect to), and no lease's
//! task keeps a wait of its own on the session.

use std::sync::Mutex;

use lockcore::raw::sync::lock;
use slab::Slab;
use tokio_util::sync::CancellationToken;

/// The lost signals of a session's leases; `None` once raised.
#[derive(Debug)]
pub(crate) struct LostSignals {
    signals: Mutex<Option<Slab<CancellationToken>>>,
}

impl Default for LostSignals {
    fn default() -> Self {
        LostSignals {
            signals: Mutex::new(Some(Slab::new())),
        }
    }
}

impl LostSignals {
    /// Adds a lease's lost signal, raised with the others; raised at once
    /// when they were raised already. Returns its key for
    /// [`remove`](LostSignals::remove).
    pub(crate) fn add(&self, lost: &CancellationToken) -> usize {
        let mut signals = lock(&self.signals);
        match signals.as_mut() {
            Some(slab) => slab.insert(lost.clone()),
            None => {
                drop(signals);
                lost.cancel();
                usize::MAX
            }
        }
    }

    /// Removes the signal added under `key` (a lease that ended); once
    /// they were raised, there is nothing to remove.
    pub(crate) fn remove(&self, key: usize) {
        if let Some(slab) = lock(&self.signals).as_mut() {
            slab.try_remove(key);
        }
    }

    /// Raises every signal added, and any added later.
    pub(crate) fn raise(&self) {
        // Raised outside the lock, which is kept short.
        let taken = lock(&self.signals).take();
        for (_, lost) in taken.into_iter().flatten() {
            lost.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LostSignals;
    use tokio_util::sync::CancellationToken;

    #[test]
    fn raising_reaches_every_signal_still_added_and_any_added_later() {
        let signals = LostSignals::default();
        let (a, b, c) = (
            CancellationToken::new(),
            CancellationToken::new(),
            CancellationToken::new(),
        );
        let ka = signals.add(&a);
        let _kb = signals.add(&b);
        signals.remove(ka);
        signals.raise();
        assert!(!a.is_cancelled(), "a removed signal is not raised");
        assert!(b.is_cancelled());
        signals.add(&c);
        assert!(
            c.is_cancelled(),
            "one added after the raise is raised at once"
        );
    }
}
