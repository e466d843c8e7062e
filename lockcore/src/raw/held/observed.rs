//! What a held lease tells the metrics (see [`observe`]): its labels,
//! its end, its renewals.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Held;
use crate::error::Result;
use crate::observe::{self, Labels};
use crate::raw::Renewal;

impl Held {
    /// Its metrics' labels.
    pub(super) fn labels(&self) -> Labels<'_> {
        Labels {
            backend: self.backend,
            name: self.name_label.then_some(self.name.as_str()),
        }
    }

    /// Counts the lease's end once: released, lost or abandoned.
    pub(super) fn ended(&self) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            observe::gauge(observe::LEASES_HELD, self.labels(), -1.0);
            observe::seconds(observe::HOLD, self.labels(), &[], self.started.elapsed());
        }
    }

    /// Tells of a renewal sent at `sent` and its outcome (`Err`: no
    /// answer by the validity deadline), come at `now`.
    pub(super) fn renewed<E>(
        &self,
        sent: Instant,
        now: Instant,
        outcome: &std::result::Result<Result<Renewal>, E>,
    ) {
        let took = now.saturating_duration_since(sent);
        let failed = match outcome {
            Ok(Ok(Renewal::Renewed { .. })) => None,
            Ok(Ok(Renewal::Lost)) => Some("lost"),
            Ok(Err(e)) => Some(observe::kind(e.kind())),
            Err(_) => Some("timeout"),
        };
        match failed {
            None => observe::renewed(self.labels(), took),
            Some(kind) => {
                observe::server_call(self.labels(), "renew", took);
                let labels = [("result", "error"), ("kind", kind)];
                observe::count(observe::RENEWALS, self.labels(), &labels);
            }
        }
        tracing::debug!(backend = self.backend, name = %self.name, fence = ?self.fence, failed, ?took, "lease renewal");
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Gone without a release that ran (no runtime to run it on).
        self.ended();
    }
}
