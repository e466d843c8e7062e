//! The watchdog: renews a lease at about ttl/3 and raises the lost signal.
//!
//! One task per held lease. It renews while renewal is on, retries a failed
//! renewal with jittered backoff while the lease is still valid, and raises
//! the lost signal when renewal is refused, when the backend reports the
//! lease gone, or when the validity deadline passes without a successful
//! renewal. Release and abandon abort it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::ErrorKind;
use crate::guard::Held;
use crate::retry::Backoff;

/// Spawns the watchdog of `held` on the current runtime.
pub(crate) fn spawn(held: &Arc<Held>) {
    let task = tokio::spawn(run(held.clone()));
    held.set_watchdog(task.abort_handle());
}

fn renew_interval(ttl: Duration) -> Duration {
    ttl / 3
}

async fn run(held: Arc<Held>) {
    let mut next_renew = Instant::now() + renew_interval(held.ttl());
    let mut backoff: Option<Backoff> = None;
    loop {
        let valid_until = held.valid_until();
        let wake_at = if held.renew {
            next_renew.min(valid_until)
        } else {
            valid_until
        };
        tokio::select! {
            _ = held.lost.cancelled() => return,
            _ = held.poke.notified() => {
                // extend() renewed with a new ttl: plan from now.
                next_renew = Instant::now() + renew_interval(held.ttl());
                continue;
            }
            _ = tokio::time::sleep_until(wake_at.into()) => {}
        }
        let now = Instant::now();
        if now >= held.valid_until() {
            held.mark_lost("the validity deadline passed without a successful renewal");
            return;
        }
        if !held.renew || now < next_renew {
            continue;
        }
        let ttl = held.ttl();
        match held.renew_now(ttl).await {
            Ok(()) => {
                backoff = None;
                next_renew = now + renew_interval(ttl);
            }
            Err(e) if e.kind() == ErrorKind::Lost => return,
            Err(e) => {
                let b = backoff.get_or_insert_with(|| {
                    Backoff::new(
                        (ttl / 30).max(Duration::from_millis(10)),
                        (ttl / 6).max(Duration::from_millis(20)),
                    )
                });
                let delay = b.next_delay();
                tracing::warn!(backend = held.backend, name = %held.name, error = %e, retry_in = ?delay, "lease renewal failed; retrying while the lease is valid");
                next_renew = now + delay;
            }
        }
    }
}
