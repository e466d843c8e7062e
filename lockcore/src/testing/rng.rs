//! A small seedable random number generator for tests and simulations:
//! the same sequence for the same seed on every platform, shared by tasks
//! without a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// SplitMix64 over an atomic counter: small, seedable, and the same on
/// every platform; tasks may share one (`&Rng`), each draw its own.
///
/// ```
/// use lockcore::testing::rng::Rng;
///
/// let (a, b) = (Rng::new(7), Rng::new(7));
/// assert_eq!(a.next(), b.next(), "one seed, one sequence");
/// assert!(a.below(10) < 10);
/// ```
#[derive(Debug)]
pub struct Rng(AtomicU64);

impl Rng {
    /// A generator whose sequence `seed` fixes.
    pub fn new(seed: u64) -> Self {
        Rng(AtomicU64::new(seed))
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&self) -> u64 {
        let state = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Uniform in `[0, n)` (0 for `n == 0`).
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Uniform in `[0, max]` milliseconds.
    pub fn millis(&self, max: u64) -> Duration {
        Duration::from_millis(self.below(max.saturating_add(1)))
    }
}
