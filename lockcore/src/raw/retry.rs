//! Retry delays with jitter, for renewals and backends' own retry loops.

use std::cell::Cell;
use std::time::Duration;

use rand::RngExt;

thread_local! {
    static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Makes this thread's jitter a fixed sequence drawn from `seed` (`None`:
/// back to the thread's random generator). For deterministic simulation:
/// on a current-thread runtime with a paused clock, a run then replays
/// exactly from its seed.
///
/// ```
/// use std::time::Duration;
/// use lockcore::raw::retry::{jitter_between, seed_jitter};
///
/// let (lo, hi) = (Duration::ZERO, Duration::from_secs(1));
/// seed_jitter(Some(7));
/// let first = (jitter_between(lo, hi), jitter_between(lo, hi));
/// seed_jitter(Some(7));
/// assert_eq!(first, (jitter_between(lo, hi), jitter_between(lo, hi)));
/// seed_jitter(None);
/// ```
pub fn seed_jitter(seed: Option<u64>) {
    SEEDED.with(|s| s.set(seed));
}

/// The next number of this thread's seeded sequence (SplitMix64), if seeded.
fn seeded_next() -> Option<u64> {
    SEEDED.with(|s| {
        let state = s.get()?.wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(Some(state));
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Some(z ^ (z >> 31))
    })
}

/// Exponential backoff with full jitter: the `n`th delay is drawn uniformly
/// from `[min, min(max, min · 2ⁿ)]`.
///
/// ```
/// use std::time::Duration;
/// use lockcore::raw::retry::Backoff;
///
/// let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(200));
/// for _ in 0..10 {
///     let d = b.next_delay();
///     assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(200));
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff between `min` and `max` (`max` is raised to `min` if smaller).
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            attempt: 0,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let factor = 1u32 << self.attempt.min(16);
        self.attempt = self.attempt.saturating_add(1);
        let cap = self.min.saturating_mul(factor).min(self.max);
        jitter_between(self.min, cap)
    }

    /// Starts over from the smallest delay.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// A uniformly random duration in `[lo, hi]` (`lo` when `hi <= lo`),
/// from the thread's generator or its [seeded](seed_jitter) sequence.
pub fn jitter_between(lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let span = u64::try_from((hi - lo).as_nanos()).unwrap_or(u64::MAX);
    let offset = match seeded_next() {
        Some(n) if span == u64::MAX => n,
        Some(n) => n % (span + 1),
        None => rand::rng().random_range(0..=span),
    };
    lo + Duration::from_nanos(offset)
}
