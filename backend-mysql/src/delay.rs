//! A lock-delay here: a record beside the lock in the table of lock-delays
//! (`<table>_delay`), which a holder with a lock-delay writes when it takes
//! the row and moves at each renewal, and deletes when it releases. A
//! holder that ends without releasing (its process died, its connection
//! was cut) leaves it: the next holder of ours reads it as it publishes
//! itself, and waits the deadline out while it holds the row, so no one
//! else is granted before it either.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;

use crate::conn::{Holding, Shared};
use crate::core::MysqlBackend;
use crate::counter::Autocommit;
use crate::publish::DelayRecord;

/// What an acquisition does after reading its predecessor's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delayed {
    /// No record of another holder's, or its deadline had passed.
    No,
    /// A deadline waited out; the holding transaction was proven alive by
    /// a round trip sent at this instant, after it.
    Waited(Instant),
    /// A deadline beyond the acquisition's own: it gives the row back.
    Refused,
}

impl MysqlBackend {
    /// A new holder of `row` (owner `owner`) honours `record`, read as it
    /// published itself: a predecessor's deadline not yet passed is waited
    /// out here, holding the row, with a keepalive every third of the
    /// lease's ttl (the session's idle timeout follows it), unless it lies
    /// beyond the acquisition's deadline. A holder without a lock-delay
    /// deletes the predecessor's record afterwards (in the background).
    ///
    /// # Cancel safety
    ///
    /// As the acquisition: a dropped wait drops the holding connection,
    /// which rolls back.
    pub(crate) async fn honour_delay(
        &self,
        h: &mut Holding,
        row: &str,
        record: Option<DelayRecord>,
        owner: &str,
        req: &AcquireRequest<'_>,
    ) -> Result<Delayed> {
        let Some(record) = record.filter(|r| r.owner != owner) else {
            return Ok(Delayed::No);
        };
        let mut delayed = Delayed::No;
        if !record.left.is_zero() {
            let until = Instant::now() + record.left;
            let fits = match req.deadline {
                Deadline::Now => false,
                Deadline::At(t) => t >= until,
                Deadline::Never => true,
            };
            if !fits {
                tracing::debug!(name = row, left = ?record.left, "a lock-delay outlasts the acquisition's deadline");
                return Ok(Delayed::Refused);
            }
            tracing::info!(name = row, left = ?record.left, "waiting out the lock-delay of a holder that ended without releasing");
            let every = (req.ttl / 3).max(Duration::from_millis(100));
            loop {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                tokio::time::sleep_until(until.min(now + every).into()).await;
                if Instant::now() < until {
                    self.prove_alive(h).await?;
                }
            }
            let sent = Instant::now();
            self.prove_alive(h).await?;
            delayed = Delayed::Waited(sent);
        }
        if req.lock_delay.is_zero() {
            spawn_cleanup(
                "delete a predecessor's lock-delay record",
                clear(self.shared.clone(), row.to_owned(), record.owner),
            );
        }
        Ok(delayed)
    }

    /// Deletes `owner`'s record of `row` if the acquisition that is about
    /// to write it is dropped or fails.
    pub(crate) fn arm_delay_clear(&self, row: &str, owner: &str) -> CleanupOnDrop {
        CleanupOnDrop::new(
            "delete the lock-delay record of a dropped acquisition",
            clear(self.shared.clone(), row.to_owned(), owner.to_owned()),
        )
    }
}

/// Deletes `owner`'s record of `name`, logging a failure (a record left
/// behind only delays the next holder until its deadline).
pub(crate) async fn clear(sh: Arc<Shared>, name: String, owner: String) {
    let stmt = Autocommit::DelayClear {
        name: &name,
        owner: &owner,
    };
    if let Err(e) = sh.autocommit(stmt, "deleting a lock-delay record").await {
        tracing::warn!(name, error = %e, "a lock-delay record was not deleted: the next holder waits until its deadline");
    }
}
