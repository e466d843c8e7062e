//! A lock connection and the transaction it may hold: dropped dirty, it is
//! closed without a goodbye and its server thread killed, so nothing stays
//! locked at whatever await point a future was dropped.

use std::sync::Arc;

use lockcore::cleanup::spawn_cleanup;
use lockcore::{Error, Result};
use sqlx::mysql::MySqlConnection;
use sqlx::Connection;

use std::time::Duration;

use crate::config::NAME;
use crate::core::{MysqlBackend, Shared};
use crate::error::{map_err, timed_out};
use crate::sql::SESSION_SETUP;

/// A lock connection: an idle one taken back (it may have died meanwhile),
/// or one opened for this acquisition. Either is parked for the next one
/// when left clean, while fewer than `pool_size` are idle.
pub(crate) enum LockConn {
    Pooled(MySqlConnection),
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
    /// The user lock this connection holds for the lock it holds, if any
    /// (see `transaction::publish`): let go of before the row.
    pub(crate) user_lock: Option<String>,
    /// The user lock of the lock's term, taken when the row's user lock
    /// was another session's (see `transaction::publish`): let go of
    /// before the row too.
    pub(crate) term_lock: Option<String>,
    /// A statement was sent and its reply not read (a renewal cut off
    /// while the holding stayed with the lease): the connection can no
    /// longer be used.
    pub(crate) in_flight: bool,
    /// The session's `wait_timeout` as last set on the server, in seconds
    /// (kept with the connection, so a renewal whose caller went away
    /// still records what it set).
    pub(crate) session_ttl: u64,
    shared: Arc<Shared>,
}

impl Holding {
    pub(crate) fn new(conn: LockConn, shared: Arc<Shared>) -> Self {
        Holding {
            conn: Some(conn),
            id: None,
            dirty: false,
            kill_on_drop: true,
            user_lock: None,
            term_lock: None,
            in_flight: false,
            session_ttl: 0,
            shared,
        }
    }

    pub(crate) fn conn(&mut self) -> Result<&mut MySqlConnection> {
        match self.conn.as_mut() {
            Some(LockConn::Pooled(c) | LockConn::Own(c)) => Ok(c),
            None => Err(Error::lost(NAME, "the holding connection is closed")),
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let (LockConn::Pooled(c) | LockConn::Own(c)) = conn;
        if !self.dirty {
            self.shared.idle.park(c);
            return;
        }
        // Closing the socket ends an idle session at once; a statement in
        // flight (a lock wait) ends only when the server next writes, so
        // KILL it too.
        drop(c);
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
            .map_err(|_| crate::error::no_greeting(&sh.server, sh.cfg.connect_timeout))?
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

    /// A connection to wait and hold on: an idle one (see `idle.rs`), else
    /// a new one. Waiters and holders
    /// never wait for each other's connections: a busy client only costs a
    /// connection setup.
    pub(crate) async fn lock_conn(&self) -> Result<LockConn> {
        let sh = &self.shared;
        match sh.idle.take(sh.cfg.request_timeout).await {
            Some(c) => Ok(LockConn::Pooled(c)),
            None => self.own_conn(sh.cfg.connect_timeout).await,
        }
    }
}
