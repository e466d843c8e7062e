//! Idle connections kept for reuse: the backend's own small pools, because
//! a sqlx pool pings every connection it takes back (a round trip per lock
//! cycle). One idle for a second or more is pinged before reuse; one idle
//! for a minute is closed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockcore::cleanup::spawn_cleanup;
use lockcore::raw::sync::lock;
use sqlx::mysql::MySqlConnection;
use sqlx::Connection;

/// A connection idle this long is pinged before reuse.
pub(crate) const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// A connection idle longer than this is closed, not reused.
const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// Up to `cap` idle connections, newest last.
pub(crate) struct Idle {
    conns: Mutex<Vec<(MySqlConnection, Instant)>>,
    cap: usize,
}

impl Idle {
    pub(crate) fn new(cap: u32) -> Self {
        Idle {
            conns: Mutex::default(),
            cap: cap as usize,
        }
    }

    /// How many are idle.
    pub(crate) fn len(&self) -> usize {
        lock(&self.conns).len()
    }

    /// The newest idle connection that answers (pinged within `limit` if it
    /// was idle for a second or more), or `None`.
    ///
    /// Cancel safe: a connection being pinged when the future is dropped is
    /// closed.
    pub(crate) async fn take(&self, limit: Duration) -> Option<MySqlConnection> {
        loop {
            let (mut c, since) = lock(&self.conns).pop()?;
            let idle_for = since.elapsed();
            if idle_for > IDLE_LIMIT {
                spawn_cleanup("close an idle connection", async move {
                    let _ = c.close().await;
                });
                continue;
            }
            if idle_for >= IDLE_BEFORE_PING
                && !matches!(tokio::time::timeout(limit, c.ping()).await, Ok(Ok(())))
            {
                continue; // dead: dropped
            }
            return Some(c);
        }
    }

    /// Keeps a clean connection for reuse, or closes it when `cap` are idle.
    pub(crate) fn park(&self, c: MySqlConnection) {
        let mut conns = lock(&self.conns);
        if conns.len() < self.cap {
            conns.push((c, Instant::now()));
            return;
        }
        drop(conns);
        spawn_cleanup("close a connection", async move {
            let _ = c.close().await;
        });
    }
}
