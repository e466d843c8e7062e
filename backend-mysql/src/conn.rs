//! The one connection store, and the one way a request is made: the
//! backend's shared handle, its idle lock and counter connections, the
//! auxiliary pool, the lock connection a holding transaction lives on
//! (dropped dirty, it is closed without a goodbye and its server thread
//! killed, so nothing stays locked at whatever await point a future was
//! dropped), and [`answer`], which bounds every request.
//!
//! Idle connections are kept by the backend itself, not in a sqlx pool,
//! which pings every connection it takes back (a round trip per lock
//! cycle). One idle for a second or more is pinged before reuse; one idle
//! for a minute is closed.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::cleanup::spawn_cleanup;
use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::config::{MysqlConfig, NAME};
use crate::error::{code, db_number, map_err};
use crate::sql::{Sql, SESSION_SETUP};

/// What the backend and its leases share.
pub(crate) struct Shared {
    pub(crate) cfg: MysqlConfig,
    /// Idle lock connections (at most `pool_size`).
    pub(crate) idle: Idle,
    /// Idle connections for the fencing counter (at most `pool_size`).
    pub(crate) fence_idle: Idle,
    /// Whether the table of leaders' values exists.
    pub(crate) values: bool,
    /// Whether the table of lock-delay records exists (and fencing is on).
    pub(crate) delays: bool,
    pub(crate) aux: MySqlPool,
    pub(crate) server: String,
    pub(crate) sql: Sql,
    /// How to open a lock connection of its own.
    pub(crate) opts: MySqlConnectOptions,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("cfg", &self.cfg)
            .field("idle", &self.idle.len())
            .field("fence_idle", &self.fence_idle.len())
            .field("aux_size", &self.aux.size())
            .finish_non_exhaustive()
    }
}

/// Waits at most `limit` for the answer of `server` to one request: the
/// request's own outcome, or, when none came in time, an error that says
/// whether the caller must count the request as possibly applied.
/// `may_apply`: its effect matters to the caller and does not end with its
/// connection (the fencing counter's increment, a leader's value, a `KILL`,
/// a release's `ROLLBACK`), so a timeout is [`ErrorKind::Indeterminate`];
/// otherwise it only reads, its change ends with its connection (a
/// statement of a holding transaction, whose connection is then closed
/// dirty and rolls it back), or nothing is held whatever it did (a lock row
/// or table created), and a timeout is [`ErrorKind::Unavailable`]. Every
/// request of this backend is bounded here, but for connecting (a server
/// that does not greet is told apart) and the ping of an idle connection
/// before reuse (a failed one is only replaced).
///
/// # Cancel safety
///
/// As the request.
pub(crate) async fn answer<T, E>(
    server: &str,
    what: &str,
    limit: Duration,
    may_apply: bool,
    request: impl Future<Output = std::result::Result<T, E>>,
) -> Result<std::result::Result<T, E>> {
    within(
        NAME,
        format!("{what} on {server}"),
        limit,
        may_apply,
        async { Ok(request.await) },
    )
    .await
}

impl Shared {
    /// [`answer`] from this backend's server.
    ///
    /// # Cancel safety
    ///
    /// As the request.
    pub(crate) async fn answer<T, E>(
        &self,
        what: &str,
        limit: Duration,
        may_apply: bool,
        request: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<std::result::Result<T, E>> {
        answer(&self.server, what, limit, may_apply, request).await
    }

    /// Runs `KILL [QUERY] id` on an auxiliary connection; an unknown thread
    /// (already gone) is success.
    pub(crate) async fn kill(&self, id: u64, query_only: bool) -> Result<()> {
        let sql = if query_only {
            format!("KILL QUERY {id}")
        } else {
            format!("KILL {id}")
        };
        let what = "KILL of a lock connection";
        let mut aux = AuxConn::take(self, what).await?;
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(aux.conn()?);
        let done = self
            .answer(what, self.cfg.request_timeout, true, fut)
            .await?;
        aux.finished_if(&done);
        match done {
            Ok(_) => Ok(()),
            Err(e) if db_number(&e) == Some(code::NO_SUCH_THREAD) => Ok(()),
            Err(e) => Err(map_err(e, what, &self.server)),
        }
    }
}

/// An auxiliary connection, closed on drop unless its statement finished.
pub(crate) struct AuxConn {
    conn: Option<PoolConnection<MySql>>,
    finished: bool,
}

impl AuxConn {
    /// A connection from the auxiliary pool, within the request timeout.
    pub(crate) async fn take(sh: &Shared, what: &str) -> Result<Self> {
        let rt = sh.cfg.request_timeout;
        let conn = sh
            .answer(what, rt, false, sh.aux.acquire())
            .await?
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
    /// The fencing token the last locking read set in this transaction,
    /// when it was asked to (see `counter.rs`).
    pub(crate) fence: Option<u64>,
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
            fence: None,
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

impl Shared {
    /// A connection of its own (not pooled), set up for lock statements,
    /// connected within `within`.
    pub(crate) async fn own_conn(&self, within: Duration) -> Result<LockConn> {
        let sh = self;
        let fut = MySqlConnection::connect_with(&sh.opts);
        let mut c = tokio::time::timeout(within, fut)
            .await
            .map_err(|_| crate::error::no_greeting(&sh.server, sh.cfg.connect_timeout))?
            .map_err(|e| map_err(e, "connecting", &sh.server))?;
        let fut = sqlx::raw_sql(SESSION_SETUP).execute(&mut c);
        sh.answer(
            "setting up a connection",
            sh.cfg.request_timeout,
            false,
            fut,
        )
        .await?
        .map_err(|e| map_err(e, "setting up a connection", &sh.server))?;
        Ok(LockConn::Own(c))
    }

    /// A connection to wait and hold on: an idle one (see [`Idle`]), else
    /// a new one. Waiters and holders
    /// never wait for each other's connections: a busy client only costs a
    /// connection setup.
    pub(crate) async fn lock_conn(&self) -> Result<LockConn> {
        let sh = self;
        match sh.idle.take(sh.cfg.request_timeout).await {
            Some(c) => Ok(LockConn::Pooled(c)),
            None => self.own_conn(sh.cfg.connect_timeout).await,
        }
    }
}

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
