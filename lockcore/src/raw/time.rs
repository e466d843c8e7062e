//! The clock leases are measured with, and the deadline of one server call.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

/// Now, by the clock leases are measured with: tokio's, which is the
/// system's monotonic clock except on a runtime whose clock is paused (a
/// test or a simulation), where it moves only as the runtime advances it.
/// `lockcore` reads time only through this; a backend may too.
///
/// ```
/// let t = lockcore::raw::now();
/// assert!(lockcore::raw::now() >= t);
/// ```
pub fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The validity deadline of a lease proven by a request sent at `sent`:
/// `sent + ttl`, less a clock-drift allowance of ttl·1% + 2 ms (the server
/// may time the lease out by a clock that runs a little fast). Every backend
/// computes [`Grant::valid_until`](crate::raw::Grant::valid_until) and [`Renewal::Renewed`](crate::raw::Renewal::Renewed) this way.
///
/// ```
/// use std::time::{Duration, Instant};
///
/// let sent = Instant::now();
/// let until = lockcore::raw::validity_deadline(sent, Duration::from_secs(10));
/// assert_eq!(until, sent + Duration::from_millis(9_898));
/// ```
pub fn validity_deadline(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(drift_allowance(ttl))
}

/// The clock-drift allowance [`validity_deadline`] takes on `ttl`.
pub(crate) fn drift_allowance(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// `ttl` in whole seconds, rounded up, at least 1: for servers whose leases
/// and timeouts count seconds (an etcd lease, a MySQL `wait_timeout`, a
/// ZooKeeper session), so the server keeps a lease at least `ttl`.
///
/// ```
/// use std::time::Duration;
///
/// assert_eq!(lockcore::raw::whole_seconds(Duration::from_millis(1500)), 2);
/// assert_eq!(lockcore::raw::whole_seconds(Duration::from_secs(3)), 3);
/// assert_eq!(lockcore::raw::whole_seconds(Duration::ZERO), 1);
/// ```
pub fn whole_seconds(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

/// Runs one request within `limit`: its own result, or, when the server
/// did not answer in time, [`ErrorKind::Indeterminate`] for a request that
/// may have changed server state (`mutating`) and
/// [`ErrorKind::Unavailable`] for one that only reads. `what` says what was
/// asked of which server ("creating the lock key on 127.0.0.1:2379").
///
/// ```
/// use std::time::Duration;
/// use lockcore::{raw::within, ErrorKind};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let slow = async {
///     tokio::time::sleep(Duration::from_secs(5)).await;
///     Ok::<_, lockcore::Error>(1)
/// };
/// let err = within("mine", "reading the lock", Duration::from_millis(10), false, slow)
///     .await
///     .unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::Unavailable);
/// # }
/// ```
///
/// # Errors
///
/// The request's own error, or [`ErrorKind::Indeterminate`] /
/// [`ErrorKind::Unavailable`] when it did not answer within `limit`.
///
/// # Cancel safety
///
/// As the request it runs.
pub async fn within<T>(
    backend: &'static str,
    what: impl fmt::Display,
    limit: Duration,
    mutating: bool,
    request: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, request).await {
        Ok(r) => r,
        Err(_) => {
            let kind = if mutating {
                ErrorKind::Indeterminate
            } else {
                ErrorKind::Unavailable
            };
            Err(Error::new(
                kind,
                backend,
                format!("{what}: no answer within {limit:?}"),
            ))
        }
    }
}
