//! A lock connection and the transaction it may hold: dropped dirty, it is
//! closed without a goodbye and its server thread killed, so nothing stays
//! locked at whatever await point a future was dropped.

use std::sync::Arc;

use lockcore::cleanup::spawn_cleanup;
use lockcore::{Error, Result};
use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::pool::PoolConnection;
use sqlx::Connection;

use std::time::{Duration, Instant};

use crate::backend::{MysqlBackend, Shared};
use crate::config::NAME;
use crate::error::{map_err, timed_out};
use crate::sql::SESSION_SETUP;

/// A lock connection: from the pool when one is free, else one of its own
/// (opened for this acquisition and closed after it).
pub(crate) enum LockConn {
    Pooled(PoolConnection<MySql>),
    Own(MySqlConnection),
}

/// A lock connection that may have a transaction open: unless marked clean,
/// dropping it closes the socket without a goodbye (the server rolls back)
/// and ends the server thread with `KILL` in the background, so nothing
/// stays locked whatever await point a future was dropped at. A clean pooled
/// one goes back to the pool; a clean own one is closed.
pub(crate) struct Holding {
    conn: Option<LockConn>,
    pub(crate) id: Option<u64>,
    pub(crate) dirty: bool,
    pub(crate) kill_on_drop: bool,
    shared: Arc<Shared>,
}

impl Holding {
    pub(crate) fn new(conn: LockConn, shared: Arc<Shared>) -> Self {
        Holding {
            conn: Some(conn),
            id: None,
            dirty: false,
            kill_on_drop: true,
            shared,
        }
    }

    pub(crate) fn conn(&mut self) -> Result<&mut MySqlConnection> {
        match self.conn.as_mut() {
            Some(LockConn::Pooled(c)) => Ok(&mut **c),
            Some(LockConn::Own(c)) => Ok(c),
            None => Err(Error::lost(NAME, "the holding connection is closed")),
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !self.dirty {
            match conn {
                LockConn::Pooled(c) => drop(c), // back to the pool
                LockConn::Own(c) => {
                    spawn_cleanup("close a lock connection", async move {
                        let _ = c.close().await;
                    });
                }
            }
            return;
        }
        // Closing the socket ends an idle session at once; a statement in
        // flight (a lock wait) ends only when the server next writes, so
        // KILL it too.
        match conn {
            LockConn::Pooled(c) => drop(c.detach()),
            LockConn::Own(c) => drop(c),
        }
        if let (true, Some(id)) = (self.kill_on_drop, self.id) {
            let shared = self.shared.clone();
            spawn_cleanup(
                "end the server thread of a dropped lock connection",
                async move {
                    if let Err(e) = shared.kill(id, false).await {
                        tracing::debug!(error = %e, id, "KILL of a dropped lock connection failed; the server ends it when it notices the closed socket");
                    }
                },
            );
        }
    }
}

impl MysqlBackend {
    /// A connection of its own (not pooled), set up for lock statements,
    /// connected within `within`.
    pub(crate) async fn own_conn(&self, within: Duration) -> Result<LockConn> {
        let sh = &self.shared;
        let fut = MySqlConnection::connect_with(&sh.opts);
        let mut c = tokio::time::timeout(within, fut)
            .await
            .map_err(|_| timed_out("connecting", &sh.server, sh.cfg.connect_timeout))?
            .map_err(|e| map_err(e, "connecting", &sh.server))?;
        let fut = sqlx::raw_sql(SESSION_SETUP).execute(&mut c);
        tokio::time::timeout(sh.cfg.request_timeout, fut)
            .await
            .map_err(|_| {
                timed_out(
                    "setting up a connection",
                    &sh.server,
                    sh.cfg.request_timeout,
                )
            })?
            .map_err(|e| map_err(e, "setting up a connection", &sh.server))?;
        Ok(LockConn::Own(c))
    }

    /// A connection to wait and hold on: an idle pooled one, a new pooled
    /// one while the pool has room, else one of its own. Waiters and holders
    /// never wait for each other's connections: a busy pool only costs a
    /// connection setup.
    pub(crate) async fn lock_conn(&self) -> Result<LockConn> {
        let sh = &self.shared;
        if let Some(c) = sh.hold.try_acquire() {
            return Ok(LockConn::Pooled(c));
        }
        // One connect timeout in all: half for a new pooled connection,
        // the rest for one of its own (a busy pool, or a slow server).
        let started = Instant::now();
        if sh.hold.size() < sh.cfg.pool_size {
            let fut = sh.hold.acquire();
            if let Ok(Ok(c)) = tokio::time::timeout(sh.cfg.connect_timeout / 2, fut).await {
                return Ok(LockConn::Pooled(c));
            }
        }
        let left = sh.cfg.connect_timeout.saturating_sub(started.elapsed());
        self.own_conn(left).await
    }
}
