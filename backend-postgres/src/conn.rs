//! The connections: the lock connections (one per waiting or held lock,
//! idle ones kept for reuse) and the auxiliary pool (inspection, ending
//! the server session of a dropped wait), and [`ask`], which bounds every
//! request.
//!
//! Idle lock connections are kept by the backend itself, not in a sqlx
//! pool, which pings every connection it takes back (a round trip per lock
//! cycle). A lock connection holds no lock while idle; one idle for a
//! minute is closed.

use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lockcore::raw::prelude::*;
use lockcore::raw::sync::lock;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection;

use crate::config::{PostgresConfig, SslMode, NAME};
use crate::error::map_err;
use crate::sql::Sql;

/// How long an idle lock connection is kept.
const IDLE_FOR: Duration = Duration::from_secs(60);

/// How often a server session waiting for a lock looks whether its client
/// is still there (`client_connection_check_interval`): a wait whose
/// connection was dropped ends within this, also when the request that
/// ends it cannot reach the server.
const CLIENT_CHECK_MS: &str = "250";

/// A lock connection and its server process id.
pub(crate) struct LockConn {
    pub(crate) conn: PgConnection,
    pub(crate) pid: i32,
    /// When its server process started (µs since 1970): with `pid`, it
    /// names the session (pids are reused).
    pub(crate) started: i64,
}

impl fmt::Debug for LockConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockConn")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// What the backend and its leases share.
pub(crate) struct Shared {
    pub(crate) cfg: PostgresConfig,
    pub(crate) sql: Sql,
    /// `host:port/database`, for errors.
    pub(crate) server: String,
    /// How to open a connection.
    opts: PgConnectOptions,
    /// Idle lock connections (at most `pool_size`), with when they went idle.
    idle: Mutex<Vec<(LockConn, Instant)>>,
    /// The auxiliary pool.
    pub(crate) aux: PgPool,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("cfg", &self.cfg)
            .field("idle", &lock(&self.idle).len())
            .field("aux_size", &self.aux.size())
            .finish_non_exhaustive()
    }
}

/// Waits at most `limit` for `request`'s answer; a request not answered in
/// time is [`ErrorKind::Indeterminate`] when `may_apply` (its effect
/// outlives its connection), else [`ErrorKind::Unavailable`].
///
/// # Cancel safety
///
/// As the request.
pub(crate) async fn ask<T>(
    shared: &Shared,
    what: &str,
    limit: Duration,
    may_apply: bool,
    request: impl Future<Output = Result<T, sqlx::Error>>,
) -> lockcore::Result<T> {
    let server = &shared.server;
    within(
        NAME,
        format!("{what} on {server}"),
        limit,
        may_apply,
        async { request.await.map_err(|e| map_err(e, what, server)) },
    )
    .await
}

impl Shared {
    /// The shared state for `cfg`; connects nothing yet but the auxiliary
    /// pool's first connection.
    pub(crate) async fn new(cfg: PostgresConfig) -> lockcore::Result<Self> {
        let mut opts = PgConnectOptions::new()
            .host(&cfg.host)
            .port(cfg.port)
            .application_name("lockcore")
            // A role's or database's default statement and lock timeouts
            // would cut a wait for a lock short (the wait is one
            // statement): every request is bounded here instead (`ask`,
            // and each acquisition's own deadline).
            .options([
                ("client_connection_check_interval", CLIENT_CHECK_MS),
                ("statement_timeout", "0"),
                ("lock_timeout", "0"),
            ]);
        if let Some(u) = &cfg.user {
            opts = opts.username(u);
        }
        if let Some(p) = &cfg.password {
            opts = opts.password(p.expose());
        }
        if let Some(d) = &cfg.database {
            opts = opts.database(d);
        }
        opts = opts.ssl_mode(match cfg.ssl_mode {
            SslMode::Disable => sqlx::postgres::PgSslMode::Disable,
            SslMode::Prefer => sqlx::postgres::PgSslMode::Prefer,
            SslMode::Require => sqlx::postgres::PgSslMode::Require,
            SslMode::VerifyCa => sqlx::postgres::PgSslMode::VerifyCa,
            SslMode::VerifyFull => sqlx::postgres::PgSslMode::VerifyFull,
        });
        if let Some(ca) = &cfg.ssl_root_cert {
            opts = opts.ssl_root_cert(ca.as_str());
        }
        let server = cfg.to_string();
        let aux = PgPoolOptions::new()
            .max_connections(cfg.aux_pool_size)
            .acquire_timeout(cfg.connect_timeout)
            .idle_timeout(IDLE_FOR)
            .connect_lazy_with(opts.clone());
        Ok(Shared {
            sql: Sql::new(&cfg.table),
            server,
            opts,
            idle: Mutex::new(Vec::new()),
            aux,
            cfg,
        })
    }

    /// An idle lock connection, or a new one, and whether it was reused.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call closes the connection it was opening.
    pub(crate) async fn lock_conn(&self) -> lockcore::Result<(LockConn, bool)> {
        let reused = {
            let mut idle = lock(&self.idle);
            idle.retain(|(_, since)| since.elapsed() < IDLE_FOR);
            idle.pop()
        };
        if let Some((c, _)) = reused {
            return Ok((c, true));
        }
        Ok((self.open().await?, false))
    }

    /// A new lock connection.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call closes the connection it was opening.
    pub(crate) async fn open(&self) -> lockcore::Result<LockConn> {
        let limit = self.cfg.connect_timeout;
        let server = &self.server;
        let mut conn = match tokio::time::timeout(limit, PgConnection::connect_with(&self.opts)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(crate::error::connect_err(e, server)),
            Err(_) => {
                return Err(Error::unavailable(
                    NAME,
                    format!("connecting to {server}: the server did not answer as PostgreSQL within {limit:?} (is it stopped, or is another service listening on that port?)"),
                ))
            }
        };
        let (pid, started): (i32, i64) = ask(
            self,
            "reading the session's process id",
            self.cfg.request_timeout,
            false,
            sqlx::query_as(
                "SELECT pid, floor(extract(epoch FROM backend_start) * 1000000)::bigint \
                 FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            )
            .fetch_one(&mut conn),
        )
        .await?;
        Ok(LockConn { conn, pid, started })
    }

    /// Keeps `c`, which holds no lock and has no idle timeout, for reuse
    /// (closed when `pool_size` are idle already).
    pub(crate) fn give_back(&self, c: LockConn) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.cfg.pool_size as usize {
            idle.push((c, Instant::now()));
        }
    }

    /// Ends server process `pid` of ours (a wait or a grant whose future
    /// was dropped: its connection is closed, and this ends its session on
    /// the server at once, with any lock it took or waits for).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may not have ended it; the server then ends it when
    /// it sees the connection closed (`client_connection_check_interval`).
    pub(crate) async fn terminate(&self, (pid, started): (i32, i64)) {
        let r = ask(
            self,
            "ending a dropped wait's session",
            self.cfg.request_timeout,
            true,
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE pid = $1 AND application_name = 'lockcore' \
                 AND floor(extract(epoch FROM backend_start) * 1000000)::bigint = $2",
            )
            .bind(pid)
            .bind(started)
            .execute(&self.aux),
        )
        .await;
        if let Err(e) = r {
            tracing::debug!(pid, error = %e, "a dropped wait's session was not ended: the server ends it when it sees the connection closed");
        }
    }
}
