//! Retry delays with jitter, for renewals and backends' own retry loops.

use std::time::Duration;

use rand::RngExt;

/// Exponential backoff with full jitter: the `n`th delay is drawn uniformly
/// from `[min, min(max, min · 2ⁿ)]`.
///
/// ```
/// use std::time::Duration;
/// use lockcore::retry::Backoff;
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

/// A uniformly random duration in `[lo, hi]` (`lo` when `hi <= lo`).
pub fn jitter_between(lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let span = u64::try_from((hi - lo).as_nanos()).unwrap_or(u64::MAX);
    lo + Duration::from_nanos(rand::rng().random_range(0..=span))
}
