//! The backend's handle as users see it: connect (the schema checked or
//! created, the server's flavour read), and the row names of its
//! primitives.

use std::sync::Arc;
use std::time::Duration;

use lockcore::raw::prelude::*;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions, MySqlSslMode};
use sqlx::{AssertSqlSafe, Connection};

use crate::config::{check_table, MysqlConfig, NAME};
use crate::conn::{answer, Idle, Shared, IDLE_BEFORE_PING};
use crate::error::{db_number, map_err};
use crate::sql::{delay_table, schema_sql, value_table, Sql, AUX_SESSION_SETUP};

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
            let [locks, fences, values, delays] = schema_sql(&cfg.table)?;
            for ddl in [locks, fences] {
                let fut = sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut probe);
                // Created or not, nothing is held: a connect that did not
                // answer is Unavailable.
                answer(
                    &server,
                    "creating the lock tables",
                    cfg.request_timeout,
                    false,
                    fut,
                )
                .await?
                .map_err(|e| map_err(e, "creating the lock tables", &server))?;
            }
            // The tables of leaders' values and of lock-delays came later: a
            // deployment that may not create them still locks (with no
            // election, no lock-delay).
            for (ddl, without) in [(values, "no leader election"), (delays, "no lock-delay")] {
                let fut = sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut probe);
                match answer(
                    &server,
                    "creating the lock tables",
                    cfg.request_timeout,
                    false,
                    fut,
                )
                .await?
                {
                    Ok(_) => {}
                    Err(e) if db_number(&e).is_some() => {
                        tracing::warn!(error = %e, "a table could not be created: {without}");
                    }
                    Err(e) => return Err(map_err(e, "creating the lock tables", &server)),
                }
            }
        }
        let values = cfg.fencing
            && has_table(
                &mut probe,
                Probe::Values(&value_table(&cfg.table)),
                &cfg,
                &server,
            )
            .await?;
        // A lock-delay's record is read in the round trip by which a fenced
        // holder publishes itself: no lock-delay without fencing.
        let delays = cfg.fencing
            && has_table(
                &mut probe,
                Probe::Delays(&delay_table(&cfg.table)),
                &cfg,
                &server,
            )
            .await?;
        // MariaDB and MySQL spell a shared lock without waiting differently.
        let what = "reading the server version";
        let version = answer(
            &server,
            what,
            cfg.request_timeout,
            false,
            sqlx::query_scalar::<_, String>("SELECT VERSION()").fetch_one(&mut probe),
        )
        .await?
        .map_err(|e| map_err(e, what, &server))?;
        let mariadb = version.contains("MariaDB");
        let _ = probe.close().await;
        let aux = MySqlPoolOptions::new()
            .max_connections(cfg.aux_pool_size)
            // A ping only for a connection idle long enough to have died
            // (a server restart): not one before every fencing statement.
            .test_before_acquire(false)
            // Inspection reads the holder a lock's transaction recorded in
            // its counter row, uncommitted (see `counter.rs`); probes set
            // their own level for their transactions. A listing's page of
            // names may then show a row another session inserted and has
            // not committed: that session holds it, and its probe says so.
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::raw_sql(AUX_SESSION_SETUP)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            })
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
        let sql = Sql::new(&cfg.table, &cfg.fence_table(), mariadb, values, delays);
        Ok(MysqlBackend {
            shared: Arc::new(Shared {
                idle: Idle::new(cfg.pool_size),
                fence_idle: Idle::new(cfg.pool_size),
                values,
                delays,
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

/// A table that came after the first two, which a deployment may lack.
#[derive(Debug, Clone, Copy)]
enum Probe<'a> {
    /// The table of leaders' values.
    Values(&'a str),
    /// The table of lock-delay records.
    Delays(&'a str),
}

/// Whether a table exists and can be written and deleted from (an error
/// from the server, such as a missing table or a refused statement, is
/// `false`; a failure to ask is an error).
async fn has_table(
    conn: &mut MySqlConnection,
    probe: Probe<'_>,
    cfg: &MysqlConfig,
    server: &str,
) -> Result<bool> {
    // Writes, deletes and reads no row (`WHERE FALSE`), but is checked as
    // an insert (and for the lock-delays, a delete and a read: every fenced
    // acquisition reads the table).
    let (what, without, sql) = match probe {
        Probe::Values(table) => (
            "looking for the table of leaders' values",
            "no table of leaders' values this account may write: no leader election",
            format!(
                "INSERT INTO `{table}` (`name`, `fence`, `value`) SELECT '', 0, '' FROM DUAL WHERE FALSE"
            ),
        ),
        Probe::Delays(table) => (
            "looking for the table of lock-delays",
            "no table of lock-delays this account may write: no lock-delay",
            format!(
                "INSERT INTO `{table}` (`name`, `until`, `owner`) SELECT '', UTC_TIMESTAMP(6), '' FROM DUAL WHERE FALSE; \
                 DELETE FROM `{table}` WHERE FALSE; SELECT 1 FROM `{table}` WHERE FALSE"
            ),
        ),
    };
    let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn);
    match answer(server, what, cfg.request_timeout, false, fut).await? {
        Ok(_) => Ok(true),
        // Missing, refused (also column grants, a read-only server): said
        // once.
        Err(e) if db_number(&e).is_some() => {
            tracing::warn!(error = %e, "{without}");
            Ok(false)
        }
        Err(e) => Err(map_err(e, what, server)),
    }
}

/// The row of read-write lock `name`: the name and a control character,
/// which no lock name has, so it is never a lock's row.
pub(crate) fn rw_row(name: &str) -> String {
    format!("{name}\u{1}rw")
}
