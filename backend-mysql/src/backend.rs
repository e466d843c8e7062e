//! Row locks with `SELECT ... FOR UPDATE`, a fencing counter committed on
//! its own, and the holding connection as the lease.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::backend::validity_deadline;
use lockcore::cleanup::spawn_cleanup;
use lockcore::{
    AcquireRequest, Backend, BackendLease, Capabilities, Deadline, Error, ErrorKind, Fencing,
    Grant, LeaseKind, Released, Renewal, Result,
};
use sqlx::mysql::{
    MySql, MySqlConnectOptions, MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlPoolOptions,
    MySqlSslMode,
};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio_util::sync::CancellationToken;

use crate::config::{check_table, MysqlConfig, NAME};

/// Every lock connection's session: no gap locks on a missing row, and no
/// shared locks for the existence check of a new name.
const SESSION_SETUP: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// How long one server-side lock wait lasts when waiting forever; the wait
/// is renewed after each, so a silent server is noticed.
const FOREVER_CHUNK_SECS: u64 = 30;

/// MySQL/MariaDB error numbers this backend reacts to.
mod code {
    /// `ER_LOCK_WAIT_TIMEOUT`: the lock wait ran out (also MariaDB's `NOWAIT`).
    pub(super) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// `ER_LOCK_NOWAIT` (MySQL 8): the row is locked and `NOWAIT` was given.
    pub(super) const LOCK_NOWAIT: u16 = 3572;
    /// `ER_QUERY_INTERRUPTED`: `KILL QUERY` ended the statement.
    pub(super) const QUERY_INTERRUPTED: u16 = 1317;
    /// `ER_DUP_ENTRY`.
    pub(super) const DUP_ENTRY: u16 = 1062;
    /// `ER_ACCESS_DENIED_ERROR`.
    pub(super) const ACCESS_DENIED: u16 = 1045;
    /// `ER_DBACCESS_DENIED_ERROR`.
    pub(super) const DB_ACCESS_DENIED: u16 = 1044;
    /// `ER_BAD_DB_ERROR`.
    pub(super) const BAD_DB: u16 = 1049;
    /// `ER_NO_SUCH_TABLE`.
    pub(super) const NO_SUCH_TABLE: u16 = 1146;
    /// `ER_CONNECTION_KILLED` (MariaDB): this session was killed.
    pub(super) const CONNECTION_KILLED: u16 = 1927;
    /// `ER_SERVER_SHUTDOWN`: the server is shutting down.
    pub(super) const SERVER_SHUTDOWN: u16 = 1053;
    /// `ER_NO_SUCH_THREAD`: `KILL` of a session that is already gone.
    pub(super) const NO_SUCH_THREAD: u16 = 1094;
}

/// The MySQL error number of `e`, if the server sent one.
pub(crate) fn db_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}

/// Maps a driver error to a lockcore error; `what` says what was tried.
pub(crate) fn map_err(e: sqlx::Error, what: &str, server: &str) -> Error {
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
        sqlx::Error::Configuration(_) => ErrorKind::InvalidConfig,
        sqlx::Error::Database(_) => match db_number(&e) {
            Some(
                code::ACCESS_DENIED | code::DB_ACCESS_DENIED | code::BAD_DB | code::NO_SUCH_TABLE,
            ) => ErrorKind::InvalidConfig,
            Some(code::CONNECTION_KILLED | code::SERVER_SHUTDOWN) => ErrorKind::Unavailable,
            _ => ErrorKind::Backend,
        },
        _ => ErrorKind::Backend,
    };
    let hint = match kind {
        ErrorKind::Unavailable => "; is the server up and reachable?",
        ErrorKind::InvalidConfig => {
            "; check the credentials, the database and the table (ensure_schema creates it)"
        }
        _ => "",
    };
    Error::new(kind, NAME, format!("{what} on {server}: {e}{hint}")).with_source(e)
}

fn timed_out(what: &str, server: &str, after: Duration) -> Error {
    Error::unavailable(
        NAME,
        format!("{what} on {server} did not answer within {after:?}"),
    )
}

/// The whole seconds of `ttl`, rounded up, at least 1: the holding session's
/// `wait_timeout`.
fn ttl_secs(ttl: Duration) -> u64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    s.max(1)
}

/// Statements that name no table of ours.
mod sql {
    /// The connection ids blocking a waiter's lock request (MariaDB, and
    /// MySQL before 8).
    pub(super) const BLOCKERS_MARIADB: &str = "SELECT CAST(b.trx_mysql_thread_id AS UNSIGNED) \
         FROM information_schema.INNODB_LOCK_WAITS w \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
         WHERE r.trx_mysql_thread_id = ?";
    /// The same on MySQL 8.
    pub(super) const BLOCKERS_MYSQL8: &str = "SELECT CAST(b.trx_mysql_thread_id AS UNSIGNED) \
         FROM performance_schema.data_lock_waits w \
         JOIN information_schema.INNODB_TRX b ON b.trx_id = w.BLOCKING_ENGINE_TRANSACTION_ID \
         JOIN information_schema.INNODB_TRX r ON r.trx_id = w.REQUESTING_ENGINE_TRANSACTION_ID \
         WHERE r.trx_mysql_thread_id = ?";
}

/// The statements, built once per backend (the table names are checked
/// identifiers, quoted; lock names are always bound parameters).
#[derive(Debug)]
struct Sql {
    lock_nowait: Arc<str>,
    lock_wait: Arc<str>,
    insert_row: Arc<str>,
    fence: Arc<str>,
    holder: Arc<str>,
}

impl Sql {
    fn new(table: &str, fence: &str) -> Self {
        Sql {
            lock_nowait: format!("SELECT 1 FROM `{table}` WHERE `name` = ? FOR UPDATE NOWAIT")
                .into(),
            lock_wait: format!("SELECT 1 FROM `{table}` WHERE `name` = ? FOR UPDATE").into(),
            insert_row: format!(
                "INSERT INTO `{table}` (`name`) SELECT ? FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM `{table}` WHERE `name` = ?)"
            )
            .into(),
            fence: format!(
                "INSERT INTO `{fence}` (`name`, `fence`, `holder_conn`, `owner`) VALUES (?, LAST_INSERT_ID(1), ?, ?) \
                 ON DUPLICATE KEY UPDATE `fence` = LAST_INSERT_ID(`fence` + 1), `holder_conn` = VALUES(`holder_conn`), `owner` = VALUES(`owner`)"
            )
            .into(),
            holder: format!("SELECT `holder_conn` FROM `{fence}` WHERE `name` = ?").into(),
        }
    }
}

/// The `CREATE TABLE` statements of the lock table `table` and its fencing
/// counter table `<table>_fence`, for migrations.
///
/// Names are `VARBINARY(256)` primary keys, so they compare byte for byte
/// (`A` and `a`, `x` and `x `, are different names) and a `FOR UPDATE` on one
/// name locks exactly one index record.
///
/// ```
/// let ddl = lockcore_mysql::schema_sql("lockcore_locks").unwrap();
/// assert!(ddl[0].contains("VARBINARY(256)"));
/// assert!(ddl[1].contains("`lockcore_locks_fence`"));
/// ```
pub fn schema_sql(table: &str) -> Result<[String; 2]> {
    check_table(table)
        .map_err(|why| Error::invalid_config(NAME, format!("table name {table:?}: {why}")))?;
    Ok([
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}` (\n  `name` VARBINARY(256) NOT NULL,\n  PRIMARY KEY (`name`)\n) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}_fence` (\n  `name` VARBINARY(256) NOT NULL,\n  `fence` BIGINT UNSIGNED NOT NULL,\n  `holder_conn` BIGINT UNSIGNED NULL,\n  `owner` CHAR(32) NULL,\n  PRIMARY KEY (`name`)\n) ENGINE=InnoDB"
        ),
    ])
}

/// What the backend and its leases share.
struct Shared {
    cfg: MysqlConfig,
    hold: MySqlPool,
    aux: MySqlPool,
    server: String,
    sql: Sql,
    /// How to open a lock connection of its own.
    opts: MySqlConnectOptions,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("cfg", &self.cfg)
            .field("hold_size", &self.hold.size())
            .field("aux_size", &self.aux.size())
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn err(&self, e: sqlx::Error, what: &str, name: &str) -> Error {
        map_err(e, what, &self.server).with_name(name)
    }

    /// Runs `KILL [QUERY] id` on an auxiliary connection; an unknown thread
    /// (already gone) is success.
    async fn kill(&self, id: u64, query_only: bool) -> Result<()> {
        let sql = if query_only {
            format!("KILL QUERY {id}")
        } else {
            format!("KILL {id}")
        };
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&self.aux);
        match tokio::time::timeout(self.cfg.request_timeout, fut).await {
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

/// A lock connection: from the pool when one is free, else one of its own
/// (opened for this acquisition and closed after it).
enum LockConn {
    Pooled(PoolConnection<MySql>),
    Own(MySqlConnection),
}

/// A lock connection that may have a transaction open: unless marked clean,
/// dropping it closes the socket without a goodbye (the server rolls back)
/// and ends the server thread with `KILL` in the background, so nothing
/// stays locked whatever await point a future was dropped at. A clean pooled
/// one goes back to the pool; a clean own one is closed.
struct Holding {
    conn: Option<LockConn>,
    id: Option<u64>,
    dirty: bool,
    kill_on_drop: bool,
    shared: Arc<Shared>,
}

impl Holding {
    fn new(conn: LockConn, shared: Arc<Shared>) -> Self {
        Holding {
            conn: Some(conn),
            id: None,
            dirty: false,
            kill_on_drop: true,
            shared,
        }
    }

    fn conn(&mut self) -> Result<&mut MySqlConnection> {
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

/// Locks in a MySQL 8 or MariaDB database: one row per name, locked by
/// `SELECT ... FOR UPDATE` in a transaction held open on a dedicated pooled
/// connection. See the [crate docs](crate).
#[derive(Debug, Clone)]
pub struct MysqlBackend {
    shared: Arc<Shared>,
}

impl MysqlBackend {
    /// Connects with `cfg`: checks that the server answers (and creates the
    /// tables when [`MysqlConfig::ensure_schema`] is set), then opens the
    /// pools lazily.
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
            opts = opts.password(p);
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
                .map_err(|_| timed_out("connecting", &server, cfg.connect_timeout))?
                .map_err(|e| map_err(e, "connecting", &server))?;
        if cfg.ensure_schema {
            for ddl in schema_sql(&cfg.table)? {
                let fut = sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut probe);
                tokio::time::timeout(cfg.request_timeout, fut)
                    .await
                    .map_err(|_| {
                        timed_out("creating the lock tables", &server, cfg.request_timeout)
                    })?
                    .map_err(|e| map_err(e, "creating the lock tables", &server))?;
            }
        }
        let _ = probe.close().await;
        let hold = MySqlPoolOptions::new()
            .max_connections(cfg.pool_size)
            .min_connections(0)
            .acquire_timeout(cfg.connect_timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .test_before_acquire(true)
            .after_connect(|conn, _meta| {
                Box::pin(async move { sqlx::raw_sql(SESSION_SETUP).execute(conn).await.map(drop) })
            })
            .connect_lazy_with(opts.clone());
        let aux = MySqlPoolOptions::new()
            .max_connections(cfg.aux_pool_size)
            .min_connections(0)
            .acquire_timeout(cfg.connect_timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .connect_lazy_with(opts.clone());
        let sql = Sql::new(&cfg.table, &cfg.fence_table());
        Ok(MysqlBackend {
            shared: Arc::new(Shared {
                cfg,
                hold,
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

    /// The server connection id (`CONNECTION_ID()`) of the session holding
    /// `name`, if the name is held: what an operator passes to `KILL` to end
    /// the lock.
    ///
    /// Each holder records its connection id in the fencing row while it
    /// holds; but a connection that released the name may hold another one
    /// by now. So the recorded id counts only if the server itself shows it
    /// holding this name's row: a probe transaction asks for the row lock,
    /// and the server's lock-wait graph (`information_schema.INNODB_LOCK_WAITS`
    /// on MariaDB, `performance_schema.data_lock_waits` on MySQL 8) must show
    /// the recorded connection blocking it. Needs the `PROCESS` privilege.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads (the probe's connection is closed, and its
    /// wait ended, when it is dropped).
    pub async fn holder_connection(&self, name: &str) -> Result<Option<u64>> {
        let mut probe = Holding::new(
            self.own_conn(self.shared.cfg.connect_timeout).await?,
            self.shared.clone(),
        );
        self.verified_holder(&mut probe, name).await
    }

    /// Ends the lock on `name` as an operator would: `KILL` of the holding
    /// session (its transaction rolls back, the next waiter gets the row).
    /// Returns whether a holder was found. Only the session the server shows
    /// holding this name's row is killed (see
    /// [`holder_connection`](MysqlBackend::holder_connection)).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have killed the holder.
    pub async fn kill_holder(&self, name: &str) -> Result<bool> {
        let mut probe = Holding::new(
            self.own_conn(self.shared.cfg.connect_timeout).await?,
            self.shared.clone(),
        );
        match self.verified_holder(&mut probe, name).await? {
            Some(id) => {
                self.shared.kill(id, false).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The recorded holder of `name`, if the server shows it blocking
    /// `probe`'s request for the row (see `holder_connection`).
    async fn verified_holder(&self, probe: &mut Holding, name: &str) -> Result<Option<u64>> {
        let sh = self.shared.clone();
        self.begin(probe, 60, 3, name).await?;
        let probe_id = probe.id.unwrap_or_default();
        if self.lock_row(probe, name, Deadline::Now).await?.is_some() {
            // Free (or no such row): nobody holds it.
            return Ok(None);
        }
        // Held: wait for the row in the background, so that the server lists
        // the wait and who blocks it.
        let fut = sqlx::query(AssertSqlSafe(sh.sql.lock_wait.clone()))
            .bind(name.as_bytes().to_vec())
            .fetch_optional(probe.conn()?);
        let verdict = async {
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                // MariaDB refreshes its lock tables only after 100 ms
                // without a read: a quicker read sees an old snapshot.
                tokio::time::sleep(Duration::from_millis(150)).await;
                let recorded = self.recorded_holder(name).await?;
                let blockers = self.blockers_of(probe_id).await?;
                if let Some(id) = recorded.filter(|id| blockers.contains(id)) {
                    return Ok(Some(id));
                }
                if Instant::now() >= deadline {
                    // Held, but not by the recorded session (a new holder
                    // that has not recorded itself yet): nothing to kill.
                    return Ok(None);
                }
            }
        };
        tokio::select! {
            // The row came free meanwhile (or the wait ended).
            _ = fut => Ok(None),
            v = verdict => v,
        }
        // Dropping the probe (dirty) closes it and ends its wait.
    }

    /// The connection id recorded in the fencing row of `name`.
    async fn recorded_holder(&self, name: &str) -> Result<Option<u64>> {
        let sh = &self.shared;
        let q = sqlx::query(AssertSqlSafe(sh.sql.holder.clone()))
            .bind(name.as_bytes())
            .fetch_optional(&sh.aux);
        let row = tokio::time::timeout(sh.cfg.request_timeout, q)
            .await
            .map_err(|_| timed_out("reading the holder", &sh.server, sh.cfg.request_timeout))?
            .map_err(|e| map_err(e, "reading the holder", &sh.server))?;
        Ok(row.and_then(|r| r.try_get::<Option<u64>, _>(0).ok().flatten()))
    }

    /// The connection ids whose transactions block `waiter`'s lock request,
    /// from the server's lock-wait graph.
    async fn blockers_of(&self, waiter: u64) -> Result<Vec<u64>> {
        let sh = &self.shared;
        let mut last = None;
        for sql in [sql::BLOCKERS_MARIADB, sql::BLOCKERS_MYSQL8] {
            let q = sqlx::query(sql).bind(waiter).fetch_all(&sh.aux);
            match tokio::time::timeout(sh.cfg.request_timeout, q).await {
                Err(_) => {
                    return Err(timed_out(
                        "reading the lock waits",
                        &sh.server,
                        sh.cfg.request_timeout,
                    ))
                }
                Ok(Ok(rows)) => {
                    return Ok(rows
                        .iter()
                        .filter_map(|r| r.try_get::<u64, _>(0).ok())
                        .collect())
                }
                // This server has the other table.
                Ok(Err(e)) if db_number(&e).is_some() => last = Some(e),
                Ok(Err(e)) => return Err(map_err(e, "reading the lock waits", &sh.server)),
            }
        }
        Err(match last {
            Some(e) => map_err(e, "reading the lock waits", &sh.server),
            None => Error::backend_error(NAME, "no lock-wait table"),
        })
    }

    /// A connection of its own (not pooled), set up for lock statements,
    /// connected within `within`.
    async fn own_conn(&self, within: Duration) -> Result<LockConn> {
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
    async fn lock_conn(&self) -> Result<LockConn> {
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

    /// Starts the holding transaction: sets the session's idle timeout from
    /// the ttl and its lock wait timeout, and learns the connection id.
    async fn begin(
        &self,
        h: &mut Holding,
        ttl_secs: u64,
        lock_wait_secs: u64,
        name: &str,
    ) -> Result<()> {
        let sh = self.shared.clone();
        let sql = format!(
            "SET SESSION wait_timeout = {ttl_secs}, innodb_lock_wait_timeout = {lock_wait_secs}; START TRANSACTION; SELECT CAST(CONNECTION_ID() AS UNSIGNED)"
        );
        h.dirty = true;
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(h.conn()?);
        let rows = tokio::time::timeout(sh.cfg.request_timeout, fut)
            .await
            .map_err(|_| {
                timed_out(
                    "starting the lock transaction",
                    &sh.server,
                    sh.cfg.request_timeout,
                )
                .with_name(name)
            })?
            .map_err(|e| sh.err(e, "starting the lock transaction", name))?;
        let id = rows
            .last()
            .map(|r| r.try_get::<u64, _>(0))
            .transpose()
            .map_err(|e| sh.err(e, "reading the connection id", name))?
            .ok_or_else(|| {
                Error::backend_error(NAME, "CONNECTION_ID() returned no row").with_name(name)
            })?;
        h.id = Some(id);
        Ok(())
    }

    /// Runs a short statement on the holding connection.
    async fn exec_raw(&self, h: &mut Holding, sql: String, what: &str, name: &str) -> Result<()> {
        let sh = &self.shared;
        let fut = sqlx::raw_sql(AssertSqlSafe(sql)).execute(h.conn()?);
        tokio::time::timeout(sh.cfg.request_timeout, fut)
            .await
            .map_err(|_| timed_out(what, &sh.server, sh.cfg.request_timeout).with_name(name))?
            .map_err(|e| sh.err(e, what, name))?;
        Ok(())
    }

    /// Ends the transaction and hands the connection back to the pool.
    async fn give_back(&self, mut h: Holding, name: &str) -> Result<()> {
        self.exec_raw(
            &mut h,
            "ROLLBACK; SET SESSION wait_timeout = DEFAULT".to_owned(),
            "rolling back",
            name,
        )
        .await?;
        h.dirty = false;
        Ok(())
    }

    /// One locking read on the held transaction. `Ok(Some(true))`: locked;
    /// `Ok(Some(false))`: the row does not exist; `Ok(None)`: held by another
    /// (the wait or `NOWAIT` ended).
    async fn lock_row(
        &self,
        h: &mut Holding,
        name: &str,
        deadline: Deadline,
    ) -> Result<Option<bool>> {
        let sh = self.shared.clone();
        let what = "locking the row";
        let held_err = |e: &sqlx::Error| {
            matches!(
                db_number(e),
                Some(code::LOCK_WAIT_TIMEOUT | code::LOCK_NOWAIT | code::QUERY_INTERRUPTED)
            )
        };
        let (sql, client_limit, cut_at) = match deadline {
            Deadline::Now => (sh.sql.lock_nowait.clone(), sh.cfg.request_timeout, None),
            Deadline::At(t) => {
                let secs = t.saturating_duration_since(Instant::now()).as_secs();
                if secs >= 1 {
                    // The server's own lock wait for the whole seconds.
                    (
                        sh.sql.lock_wait.clone(),
                        Duration::from_secs(secs) + sh.cfg.request_timeout,
                        None,
                    )
                } else {
                    // The sub-second rest: wait up to 1 s on the server and
                    // cut the wait at the deadline with KILL QUERY.
                    (
                        sh.sql.lock_wait.clone(),
                        Duration::from_secs(1) + sh.cfg.request_timeout,
                        Some(t),
                    )
                }
            }
            Deadline::Never => (
                sh.sql.lock_wait.clone(),
                Duration::from_secs(FOREVER_CHUNK_SECS) + sh.cfg.request_timeout,
                None,
            ),
        };
        let id = h.id;
        let fut = sqlx::query(AssertSqlSafe(sql))
            .bind(name.as_bytes())
            .fetch_optional(h.conn()?);
        let fut = tokio::time::timeout(client_limit, fut);
        tokio::pin!(fut);
        let res = match cut_at {
            None => fut.await,
            Some(t) => {
                tokio::select! {
                    r = &mut fut => r,
                    () = tokio::time::sleep_until(t.into()) => {
                        if let Some(id) = id {
                            sh.kill(id, true).await.map_err(|e| e.with_name(name))?;
                        }
                        fut.await
                    }
                }
            }
        };
        match res {
            Err(_) => Err(timed_out(what, &sh.server, client_limit).with_name(name)),
            Ok(Ok(row)) => Ok(Some(row.is_some())),
            Ok(Err(e)) if held_err(&e) => Ok(None),
            Ok(Err(e)) => Err(sh.err(e, what, name)),
        }
    }

    /// Creates the row of `name` outside the holding transaction, then
    /// starts a new one.
    async fn create_row(&self, h: &mut Holding, name: &str) -> Result<()> {
        let sh = self.shared.clone();
        self.exec_raw(h, "ROLLBACK".to_owned(), "rolling back", name)
            .await?;
        let fut = sqlx::query(AssertSqlSafe(sh.sql.insert_row.clone()))
            .bind(name.as_bytes())
            .bind(name.as_bytes())
            .execute(h.conn()?);
        match tokio::time::timeout(sh.cfg.request_timeout, fut).await {
            Err(_) => {
                return Err(
                    timed_out("creating the lock row", &sh.server, sh.cfg.request_timeout)
                        .with_name(name),
                )
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) if db_number(&e) == Some(code::DUP_ENTRY) => {}
            Ok(Err(e)) => return Err(sh.err(e, "creating the lock row", name)),
        }
        self.exec_raw(
            h,
            "START TRANSACTION".to_owned(),
            "starting the lock transaction",
            name,
        )
        .await
    }

    /// Advances the name's fencing counter in its own autocommit statement on
    /// another connection, recording the holder's connection id and owner.
    async fn next_fence(&self, name: &str, conn_id: u64, owner: String) -> Result<u64> {
        let sh = &self.shared;
        let fut = sqlx::query(AssertSqlSafe(sh.sql.fence.clone()))
            .bind(name.as_bytes())
            .bind(conn_id)
            .bind(owner)
            .execute(&sh.aux);
        let done = tokio::time::timeout(sh.cfg.request_timeout, fut)
            .await
            .map_err(|_| {
                timed_out(
                    "advancing the fencing counter",
                    &sh.server,
                    sh.cfg.request_timeout,
                )
                .with_name(name)
            })?
            .map_err(|e| sh.err(e, "advancing the fencing counter", name))?;
        match done.last_insert_id() {
            0 => Err(
                Error::backend_error(NAME, "the fencing counter statement returned no value")
                    .with_name(name),
            ),
            f => Ok(f),
        }
    }
}

#[async_trait]
impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        // Waiting is the server's own row-lock wait: a commit or rollback
        // hands the row to a waiter at once (push), in no promised order.
        Capabilities::new(Fencing::Strict, LeaseKind::Connection).push_wakeup(true)
    }

    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let sh = self.shared.clone();
        let name = req.name;
        let ttl = ttl_secs(req.ttl);
        let conn = self.lock_conn().await?;
        // From here, dropping `h` (an error, or this future dropped) closes
        // the connection and KILLs its thread: nothing stays locked.
        let mut h = Holding::new(conn, sh.clone());
        let first_wait = match req.deadline {
            Deadline::Now => 1,
            Deadline::At(t) => t.saturating_duration_since(Instant::now()).as_secs().max(1),
            Deadline::Never => FOREVER_CHUNK_SECS,
        };
        self.begin(&mut h, ttl, first_wait, name).await?;
        let mut wait_set = first_wait;
        let mut created = false;
        loop {
            if let Deadline::At(t) = req.deadline {
                let left = t.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    self.give_back(h, name).await?;
                    return Ok(None);
                }
                let want = left.as_secs().max(1);
                if want != wait_set {
                    self.exec_raw(
                        &mut h,
                        format!("SET SESSION innodb_lock_wait_timeout = {want}"),
                        "setting the lock wait",
                        name,
                    )
                    .await?;
                    wait_set = want;
                }
            }
            match self.lock_row(&mut h, name, req.deadline).await? {
                Some(true) => break,
                Some(false) if !created => {
                    self.create_row(&mut h, name).await?;
                    created = true;
                }
                Some(false) => {
                    return Err(Error::backend_error(
                        NAME,
                        format!("the lock row vanished right after it was created in `{}`; is something deleting rows?", sh.cfg.table),
                    )
                    .with_name(name))
                }
                None if matches!(req.deadline, Deadline::Now) => {
                    self.give_back(h, name).await?;
                    return Ok(None);
                }
                None => {} // the lock wait ran out: go on waiting
            }
        }
        let conn_id = h.id.unwrap_or_default();
        // The fencing counter: advanced while the row is locked, in its own
        // committed statement, so it never rolls back with a dead holder.
        let fence = self
            .next_fence(name, conn_id, req.owner.to_string())
            .await?;
        // Prove the holding transaction outlived the increment: only then is
        // every later holder's increment after this one.
        let sent = Instant::now();
        let fut = sqlx::query("SELECT 1").fetch_one(h.conn()?);
        match tokio::time::timeout(sh.cfg.request_timeout, fut).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    NAME,
                    format!("the holding connection to {} broke right after the lock was taken; it was not granted: {e}", sh.server),
                )
                .with_name(name)
                .with_source(e))
            }
            Err(_) => {
                return Err(timed_out("checking the holding connection", &sh.server, sh.cfg.request_timeout).with_name(name))
            }
        }
        tracing::debug!(name, fence, conn_id, "row lock taken");
        Ok(Some(Grant {
            lease: Box::new(MysqlLease {
                shared: sh,
                name: name.to_owned(),
                conn_id,
                ttl_secs: AtomicU64::new(ttl),
                lost: req.lost.clone(),
                conn: Arc::new(tokio::sync::Mutex::new(Some(h))),
            }),
            fence: Some(fence),
            valid_until: validity_deadline(sent, req.ttl),
        }))
    }
}

/// A held row lock: the open transaction on its pinned connection.
struct MysqlLease {
    shared: Arc<Shared>,
    name: String,
    conn_id: u64,
    ttl_secs: AtomicU64,
    lost: CancellationToken,
    conn: Arc<tokio::sync::Mutex<Option<Holding>>>,
}

impl fmt::Debug for MysqlLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlLease")
            .field("name", &self.name)
            .field("conn_id", &self.conn_id)
            .field("ttl_secs", &self.ttl_secs.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl MysqlLease {
    /// The connection broke or did not answer: close it, raise lost.
    fn broken(&self, slot: &mut Option<Holding>, why: &str) {
        tracing::warn!(name = %self.name, conn_id = self.conn_id, why, "the connection holding a row lock is gone");
        drop(slot.take()); // dirty: closes the socket and KILLs the thread
        self.lost.cancel();
    }
}

#[async_trait]
impl BackendLease for MysqlLease {
    async fn renew(&self, ttl: Duration) -> Result<Renewal> {
        let mut slot = self.conn.lock().await;
        let Some(h) = slot.as_mut() else {
            return Ok(Renewal::Lost);
        };
        let secs = ttl_secs(ttl);
        let limit = self.shared.cfg.request_timeout.min(ttl);
        let sent = Instant::now();
        let conn = h.conn()?;
        let res = if secs == self.ttl_secs.load(Ordering::Relaxed) {
            tokio::time::timeout(limit, sqlx::query("SELECT 1").fetch_one(conn))
                .await
                .map(|r| r.map(drop))
        } else {
            let sql = format!("SET SESSION wait_timeout = {secs}");
            tokio::time::timeout(limit, sqlx::raw_sql(AssertSqlSafe(sql)).execute(conn))
                .await
                .map(|r| r.map(drop))
        };
        match res {
            Ok(Ok(())) => {
                self.ttl_secs.store(secs, Ordering::Relaxed);
                Ok(Renewal::Renewed {
                    valid_until: validity_deadline(sent, ttl),
                })
            }
            Ok(Err(e)) => {
                self.broken(&mut slot, &e.to_string());
                Ok(Renewal::Lost)
            }
            Err(_) => {
                self.broken(&mut slot, "the keepalive did not answer in time");
                Ok(Renewal::Lost)
            }
        }
    }

    async fn release(&self) -> Result<Released> {
        let mut slot = self.conn.lock().await;
        let Some(mut h) = slot.take() else {
            return Ok(Released::NotHeld);
        };
        drop(slot);
        let rt = self.shared.cfg.request_timeout;
        let fut = sqlx::raw_sql("ROLLBACK; SET SESSION wait_timeout = DEFAULT").execute(h.conn()?);
        match tokio::time::timeout(rt, fut).await {
            Ok(Ok(_)) => {
                h.dirty = false; // back to the pool
                Ok(Released::Released)
            }
            Ok(Err(e)) => {
                // The connection was gone (killed, timed out by the server):
                // the server had already rolled the transaction back.
                tracing::debug!(name = %self.name, error = %e, "release found the holding connection gone");
                self.lost.cancel();
                Ok(Released::NotHeld)
            }
            Err(_) => Err(Error::new(
                ErrorKind::Indeterminate,
                NAME,
                format!(
                    "ROLLBACK on {} did not answer within {rt:?}; the connection was closed and its thread killed, so the row is freed when the server notices",
                    self.shared.server
                ),
            )
            .with_name(self.name.clone())),
        }
    }

    fn abandon(&self) {
        // As a dead process: the socket closes without COMMIT or ROLLBACK,
        // no KILL; the server rolls back when it sees the connection end.
        fn drop_it(slot: &mut Option<Holding>) {
            if let Some(mut h) = slot.take() {
                h.kill_on_drop = false;
                drop(h);
            }
        }
        match self.conn.try_lock() {
            Ok(mut slot) => drop_it(&mut slot),
            Err(_) => {
                // A renewal is in flight (its task is being aborted): close
                // the connection as soon as it lets go.
                let conn = self.conn.clone();
                spawn_cleanup("close an abandoned lock connection", async move {
                    drop_it(&mut *conn.lock().await);
                });
            }
        }
    }
}
