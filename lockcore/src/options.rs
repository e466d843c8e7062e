//! Lock options: ttl, how long to wait, and whether the watchdog renews.

use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

/// The shortest ttl accepted by default.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The longest ttl accepted by default.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The ttl used when none is given: 30 s, as Redisson's watchdog.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How long an acquisition may wait for a held name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One attempt: the lock, or `Ok(None)` at once when it is held.
    Try,
    /// Wait up to this long, then fail with [`ErrorKind::Timeout`].
    For(Duration),
    /// Wait until acquired or an error.
    Forever,
}

/// Options of one acquisition.
///
/// ```
/// use std::time::{Duration, Instant};
/// use lockcore::{LockOptions, Wait};
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Wait::For(Duration::from_secs(2)))
///     .renew(false);
/// assert_eq!(opts.get_ttl(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "options do nothing until passed to an acquisition"]
pub struct LockOptions {
    ttl: Duration,
    wait: Wait,
    renew: bool,
    lock_delay: Duration,
    metrics_name: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions::new()
    }
}

impl LockOptions {
    /// ttl [`DEFAULT_TTL`], wait forever, renewal on.
    pub const fn new() -> Self {
        LockOptions {
            ttl: DEFAULT_TTL,
            wait: Wait::Forever,
            renew: true,
            lock_delay: Duration::ZERO,
            metrics_name: false,
        }
    }

    /// How long the lease lives without renewal (1 s to 24 h).
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for a held name.
    pub const fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Whether the watchdog renews the lease at about ttl/3 (on by default).
    /// Without renewal the lease ends after its ttl and the guard's lost
    /// signal fires then.
    pub const fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// A lock-delay, as Chubby's and Consul's (off by default): when the
    /// holder disappears without releasing (its process died, its network
    /// went, its lease expired), nobody may take the name for `delay` after
    /// its lease's validity ends, so that a holder cut off but still running
    /// has time to notice the loss and stop. A clean release frees the name
    /// at once. Enforced by the server: the lease lives `ttl + delay` there
    /// while the holder counts `ttl` of validity (see
    /// [`Capabilities::lock_delay`](crate::Capabilities::lock_delay); a
    /// backend that cannot enforce it refuses the option). `ttl + delay`
    /// must be within the ttl range, and the delay at most about
    /// `49 × ttl − 200 ms`: the clock-drift allowance (1 % plus 2 ms) is
    /// taken on `ttl + delay`, all of it from the holder's count, and must
    /// leave the holder half its ttl ([`validate`](LockOptions::validate)
    /// refuses more).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockcore::LockOptions;
    ///
    /// let opts = LockOptions::new().lock_delay(Duration::from_secs(10));
    /// assert_eq!(opts.get_lock_delay(), Duration::from_secs(10));
    /// ```
    pub const fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// Whether the lock's name is a label (`name`) of its metrics (off by
    /// default: names are unbounded, and so would be the series; see
    /// [`observe`](crate::observe)). An acquisition given options uses
    /// theirs; `lock`, `try_lock`, `lock_timeout` and `inspect` use the
    /// [`Locker`](crate::Locker)'s defaults
    /// ([`with_defaults`](crate::Locker::with_defaults)).
    pub const fn metrics_name(mut self, on: bool) -> Self {
        self.metrics_name = on;
        self
    }

    /// Whether the lock's name is a label of its metrics.
    pub const fn get_metrics_name(&self) -> bool {
        self.metrics_name
    }

    /// The lock-delay (zero: none).
    pub const fn get_lock_delay(&self) -> Duration {
        self.lock_delay
    }

    /// The ttl.
    pub const fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait.
    pub const fn get_wait(&self) -> Wait {
        self.wait
    }

    /// Whether renewal is on.
    pub const fn get_renew(&self) -> bool {
        self.renew
    }

    /// Checks the ranges; `backend` is named in the error.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a ttl or wait out of range, a
    /// `ttl + lock_delay` beyond the longest ttl, or a lock-delay that
    /// leaves the holder less than half its ttl once the clock-drift
    /// allowance on `ttl + lock_delay` is taken (a delay above about
    /// `49 × ttl − 200 ms`; 10 s with a 1 s ttl is accepted, 60 s is not).
    pub fn validate(&self, backend: &'static str) -> Result<()> {
        if self.ttl < MIN_TTL || self.ttl > MAX_TTL {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                backend,
                format!(
                    "ttl {:?} is out of range: it must be from {:?} to {:?}",
                    self.ttl, MIN_TTL, MAX_TTL
                ),
            ));
        }
        if self.ttl.saturating_add(self.lock_delay) > MAX_TTL {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                backend,
                format!(
                    "ttl {:?} plus lock-delay {:?} is beyond the longest ttl {:?}",
                    self.ttl, self.lock_delay, MAX_TTL
                ),
            ));
        }
        check_delay(self.ttl, self.lock_delay)
            .map_err(|why| Error::new(ErrorKind::InvalidConfig, backend, why))?;
        if let Wait::For(d) = self.wait {
            if d > MAX_TTL * 365 {
                return Err(Error::new(
                    ErrorKind::InvalidConfig,
                    backend,
                    format!("wait {d:?} is too long: use Wait::Forever"),
                ));
            }
        }
        Ok(())
    }

    /// These options with what is left of their wait since `began`.
    pub(crate) fn left_since(&self, began: Instant) -> LockOptions {
        match self.get_wait() {
            Wait::For(d) => self.wait(Wait::For(
                began
                    .checked_add(d)
                    .map_or(d, |end| end.saturating_duration_since(Instant::now())),
            )),
            _ => *self,
        }
    }
}

/// Refuses a lock-delay that leaves the holder less than half its `ttl`:
/// the clock-drift allowance is taken on `ttl + delay`, all of it from the
/// holder's count.
pub(crate) fn check_delay(ttl: Duration, delay: Duration) -> std::result::Result<(), String> {
    let allowance = crate::raw::drift_allowance(ttl.saturating_add(delay));
    if allowance > ttl / 2 {
        return Err(format!(
            "lock-delay {delay:?} with ttl {ttl:?} leaves the holder less than half its ttl (the clock-drift allowance, {allowance:?}, is 1% of ttl plus lock-delay, plus 2 ms): use a longer ttl or a shorter lock-delay"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_range() {
        assert!(LockOptions::new().validate("t").is_ok());
        for bad in [
            Duration::ZERO,
            Duration::from_millis(999),
            MAX_TTL + Duration::from_secs(1),
        ] {
            let e = LockOptions::new()
                .ttl(bad)
                .validate("t")
                .expect_err("out of range");
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        }
    }

    /// A lock-delay so much longer than the ttl that its clock allowance
    /// would eat most of the holder's ttl is refused; one that leaves at
    /// least half is taken.
    #[test]
    fn a_lock_delay_leaves_the_holder_half_its_ttl() {
        let opts = LockOptions::new().ttl(Duration::from_secs(1));
        let e = opts
            .lock_delay(Duration::from_secs(100))
            .validate("t")
            .expect_err("a 100 s delay on a 1 s ttl");
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("half its ttl"), "{e}");
        assert!(opts
            .lock_delay(Duration::from_secs(40))
            .validate("t")
            .is_ok());
    }
}
