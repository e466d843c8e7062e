//! Connections of the auxiliary pool (`aux_pool_size`): returned to the
//! pool only after a statement that finished. One whose statement was cut
//! off (a timeout, a dropped future) is closed instead: the pool would ping
//! it with the reply still unread, and sqlx can misread that reply (a panic
//! in its background task, sqlx #4139).

use lockcore::{Error, Result};
use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::pool::PoolConnection;

use crate::backend::Shared;
use crate::config::NAME;
use crate::error::{db_number, map_err, timed_out};

/// An auxiliary connection, closed on drop unless its statement finished.
pub(crate) struct AuxConn {
    conn: Option<PoolConnection<MySql>>,
    finished: bool,
}

impl AuxConn {
    /// A connection from the auxiliary pool, within the request timeout.
    pub(crate) async fn take(sh: &Shared, what: &str) -> Result<Self> {
        let rt = sh.cfg.request_timeout;
        let conn = tokio::time::timeout(rt, sh.aux.acquire())
            .await
            .map_err(|_| timed_out(what, &sh.server, rt))?
            .map_err(|e| map_err(e, what, &sh.server))?;
        Ok(AuxConn {
            conn: Some(conn),
            finished: false,
        })
    }

    /// The connection, for one statement.
    pub(crate) fn conn(&mut self) -> Result<&mut MySqlConnection> {
        self.finished = false;
        self.conn
            .as_deref_mut()
            .ok_or_else(|| Error::backend_error(NAME, "an auxiliary connection was closed"))
    }

    /// Marks the statement finished when it was answered, with a result or
    /// an error from the server: the connection may go back to the pool.
    /// After any other error (the connection broke, a reply it could not
    /// read) it is closed.
    pub(crate) fn finished_if<T>(&mut self, answer: &std::result::Result<T, sqlx::Error>) {
        self.finished = match answer {
            Ok(_) => true,
            Err(e) => db_number(e).is_some(),
        };
    }
}

impl Drop for AuxConn {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(c) = self.conn.take() {
                // Not returned: dropped without a ping.
                drop(c.detach());
            }
        }
    }
}
