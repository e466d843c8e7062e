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

use crate::config::NAME;
use crate::conn::{Holding, Shared};
use crate::core::MysqlBackend;
use crate::counter::Autocommit;
use crate::publish::{publish, unpublish, DelayRecord};

/// What an acquisition does after reading its predecessor's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delayed {
    /// No record of another holder's, or its deadline had passed.
    No,
    /// A deadline waited out; the holder published itself again by a
    /// round trip sent at this instant, after it.
    Waited(Instant),
    /// A try found a deadline not yet passed: it gives the row back (its
    /// user locks already let go of).
    Refused,
}

impl MysqlBackend {
    /// A new holder of `row` (owner `owner`, token `fence`) honours
    /// `record`, read as it published itself. A predecessor's deadline not
    /// yet passed is waited out here, holding the row but unpublished (its
    /// user locks let go of, so that inspection shows the name held with
    /// no owner rather than this waiter as its holder), with a keepalive
    /// every third of the lease's ttl (the session's idle timeout follows
    /// it); then it publishes itself again, which reads the record again
    /// (a predecessor's renewal still in flight may have moved it). A try
    /// is refused at once; a wait whose deadline comes before the record's
    /// (and a request's time to spare) fails with `Timeout` at once. A
    /// holder without a lock-delay deletes the predecessor's record
    /// afterwards (in the background).
    ///
    /// # Cancel safety
    ///
    /// As the acquisition: a dropped wait drops the holding connection,
    /// which rolls back and frees the user locks.
    pub(crate) async fn honour_delay(
        &self,
        h: &mut Holding,
        row: &str,
        fence: u64,
        mut record: Option<DelayRecord>,
        owner: &str,
        req: &AcquireRequest<'_>,
    ) -> Result<Delayed> {
        let sh = &self.shared;
        let mut delayed = Delayed::No;
        let mut seen = None;
        while let Some(rec) = record.take().filter(|r| r.owner != owner) {
            if rec.left.is_zero() {
                seen = Some(rec);
                break;
            }
            unpublish(sh, h).await?;
            let until = Instant::now() + rec.left;
            match req.deadline {
                Deadline::Now => return Ok(Delayed::Refused),
                Deadline::At(t) if t < until + sh.cfg.request_timeout => {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        NAME,
                        format!(
                            "a holder that ended without releasing keeps the name for its lock-delay, {:?} more: beyond this wait",
                            rec.left
                        ),
                    ))
                }
                _ => {}
            }
            tracing::info!(name = row, left = ?rec.left, "waiting out the lock-delay of a holder that ended without releasing");
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
            record = publish(sh, h, row, 0, Some(fence), owner).await?;
            delayed = Delayed::Waited(sent);
            seen = Some(rec);
        }
        if let Some(rec) = seen.filter(|_| req.lock_delay.is_zero()) {
            spawn_cleanup(
                "delete a predecessor's lock-delay record",
                clear(self.shared.clone(), row.to_owned(), rec.owner),
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
