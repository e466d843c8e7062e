//! The backend's handle: the configuration, the idle lock connections,
//! the auxiliary pool and its connections, the schema check at connect.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockcore::raw::prelude::*;
use sqlx::mysql::{
    MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlSslMode,
};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection};

use crate::config::{check_table, MysqlConfig, NAME};
use crate::error::{code, db_number, map_err, timed_out};
use crate::idle::{Idle, IDLE_BEFORE_PING};
use crate::sql::{schema_sql, value_table, Sql};

/// What the backend and its leases share.
pub(crate) struct Shared {
    pub(crate) cfg: MysqlConfig,
    /// Idle lock connections (at most `pool_size`).
    pub(crate) idle: Idle,
    /// Idle connections for the fencing counter (at most `aux_pool_size`).
    pub(crate) fence_idle: Idle,
    /// Whether the table of leaders' values exists.
    pub(crate) values: bool,
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

impl Shared {
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
        let done = tokio::time::timeout(self.cfg.request_timeout, fut).await;
        if let Ok(r) = &done {
            aux.finished_if(r);
        }
        match done {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if db_number(&e) == Some(code::NO_SUCH_THREAD) => Ok(()),
            Ok(Err(e)) => Err(map_err(e, "KILL of a lock connection", &self.server)),
            Err(_) => Err(timed_out(
                "KILL of a lock connection",
                &self.server,
                self.cfg.request_timeout,
            )),
        }
    }
}

/// Locks in a MySQL 8 or MariaDB database: one row per name, locked by
/// `SELECT ... FOR UPDATE` in a transaction held open on a dedicated pooled
/// connection. See the [crate docs](crate).
#[derive(Debug, Clone)]
pub struct MysqlBackend {
    pub(crate) shared: Arc<Shared>,
}

impl MysqlBackend {
    /// Connects with `cfg`: checks that the server answers (and creates the
    /// tables when [`MysqlConfig::ensure_schema`] is set), then opens the
    /// pools lazily.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a bad table name, refused credentials or
    /// a missing database, [`ErrorKind::Unavailable`] when the server does not
    /// answer within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state (a dropped schema creation is
    /// `CREATE TABLE IF NOT EXISTS`, done or not).
    pub async fn connect(cfg: MysqlConfig) -> Result<Self> {
        check_table(&cfg.table).map_err(|why| {
            Error::invalid_config(NAME, format!("table name {:?}: {why}", cfg.table))
        })?;
        let server = cfg.to_string();
        let mut opts = MySqlConnectOptions::new()
            .host(&cfg.host)
            .port(cfg.port)
            .ssl_mode(MySqlSslMode::Disabled)
            .charset("utf8mb4");
        if let Some(u) = &cfg.user {
            opts = opts.username(u);
        }
        if let Some(p) = &cfg.password {
            opts = opts.password(p.expose());
        }
        if let Some(db) = &cfg.database {
            opts = opts.database(db);
        }
        // One direct connection: fail fast with the real error when the
        // server is absent or refuses us (a pool would retry until its
        // timeout).
        let mut probe =
            tokio::time::timeout(cfg.connect_timeout, MySqlConnection::connect_with(&opts))
                .await
                .map_err(|_| crate::error::no_greeting(&server, cfg.connect_timeout))?
                .map_err(|e| map_err(e, "connecting", &server))?;
        if cfg.ensure_schema {
            let [locks, fences, values] = schema_sql(&cfg.table)?;
            for ddl in [locks, fences] {
                let fut = sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut probe);
                tokio::time::timeout(cfg.request_timeout, fut)
                    .await
                    .map_err(|_| {
                        timed_out("creating the lock tables", &server, cfg.request_timeout)
                    })?
                    .map_err(|e| map_err(e, "creating the lock tables", &server))?;
            }
            // The table of leaders' values came later: a deployment that
            // may not create it still locks (it has no election).
            let fut = sqlx::raw_sql(AssertSqlSafe(values)).execute(&mut probe);
            match tokio::time::timeout(cfg.request_timeout, fut).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if db_number(&e).is_some() => {
                    tracing::warn!(error = %e, "the table of leaders' values could not be created: no leader election");
                }
                Ok(Err(e)) => return Err(map_err(e, "creating the lock tables", &server)),
                Err(_) => {
                    return Err(timed_out(
                        "creating the lock tables",
                        &server,
                        cfg.request_timeout,
                    ))
                }
            }
        }
        let values =
            cfg.fencing && has_table(&mut probe, &value_table(&cfg.table), &cfg, &server).await?;
        // MariaDB and MySQL spell a shared lock without waiting differently.
        let version = tokio::time::timeout(
            cfg.request_timeout,
            sqlx::query_scalar::<_, String>("SELECT VERSION()").fetch_one(&mut probe),
        )
        .await
        .map_err(|_| timed_out("reading the server version", &server, cfg.request_timeout))?
        .map_err(|e| map_err(e, "reading the server version", &server))?;
        let mariadb = version.contains("MariaDB");
        let _ = probe.close().await;
        let aux = MySqlPoolOptions::new()
            .max_connections(cfg.aux_pool_size)
            // A ping only for a connection idle long enough to have died
            // (a server restart): not one before every fencing statement.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_BEFORE_PING {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .min_connections(0)
            .acquire_timeout(cfg.connect_timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .connect_lazy_with(opts.clone());
        let sql = Sql::new(&cfg.table, &cfg.fence_table(), mariadb, values);
        Ok(MysqlBackend {
            shared: Arc::new(Shared {
                idle: Idle::new(cfg.pool_size),
                fence_idle: Idle::new(cfg.pool_size),
                values,
                cfg,
                aux,
                server,
                sql,
                opts,
            }),
        })
    }

    /// The settings.
    pub fn config(&self) -> &MysqlConfig {
        &self.shared.cfg
    }
}

/// Whether `table` exists and can be written (an error from the server, such
/// as a missing table or a refused insert, is `false`; a failure to ask is
/// an error).
async fn has_table(
    conn: &mut MySqlConnection,
    table: &str,
    cfg: &MysqlConfig,
    server: &str,
) -> Result<bool> {
    let what = "looking for the table of leaders' values";
    // Writes no row (`WHERE FALSE`), but is checked as an insert.
    let sql = format!(
        "INSERT INTO `{table}` (`name`, `fence`, `value`) SELECT '', 0, '' FROM DUAL WHERE FALSE"
    );
    let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn);
    match tokio::time::timeout(cfg.request_timeout, fut).await {
        Ok(Ok(_)) => Ok(true),
        // Missing, refused (also column grants, a read-only server): no
        // elections, said once.
        Ok(Err(e)) if db_number(&e).is_some() => {
            tracing::warn!(error = %e, "no table of leaders' values this account may write: no leader election");
            Ok(false)
        }
        Ok(Err(e)) => Err(map_err(e, what, server)),
        Err(_) => Err(timed_out(what, server, cfg.request_timeout)),
    }
}

/// The row of read-write lock `name`: the name and a control character,
/// which no lock name has, so it is never a lock's row.
pub(crate) fn rw_row(name: &str) -> String {
    format!("{name}\u{1}rw")
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
