//! The backend: connect, and acquire a row lock on a connection of its own
//! (a pooled one when free), the fencing counter committed on its own.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::backend::prelude::*;
use lockcore::Role;
use sqlx::mysql::{
    MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlSslMode,
};
use sqlx::{AssertSqlSafe, Connection};

use crate::aux_pool::AuxConn;
use crate::config::{check_table, MysqlConfig, NAME};
use crate::error::{code, db_number, map_err, timed_out};

use crate::idle::Idle;
use crate::lease::MysqlLease;
use crate::slots::counter_row;
use crate::sql::{schema_sql, value_table, Sql, FOREVER_CHUNK_SECS};
use crate::transaction::publish;

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

/// A pooled connection idle this long is pinged before use.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

#[async_trait]
impl Backend for MysqlBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        // Waiting is the server's own row-lock wait: a commit or rollback
        // hands the row to a waiter at once (push), in no promised order.
        // The lease is the holding connection: each held lock keeps one.
        let fencing = if self.shared.cfg.fencing {
            Fencing::Strict
        } else {
            Fencing::None
        };
        Capabilities::new(fencing, LeaseKind::Connection)
            .push_wakeup(true)
            .inspect(self.shared.cfg.fencing)
            .values(self.shared.cfg.fencing && self.shared.values)
            .rw_layout(self.shared.cfg.rwlock)
            .semaphore_layout(self.shared.cfg.semaphore)
    }

    /// On a connection of its own, a transaction that locks the name's row
    /// (`NOWAIT` for a try, the server's lock wait otherwise; a read-write
    /// lock's row shared for a reader), then the
    /// fencing counter advanced and committed on another connection, then a
    /// round trip proving the transaction outlived the increment.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped acquisition closes its connection without a
    /// goodbye and `KILL`s its server thread in the background, which rolls
    /// the transaction back whatever it had locked.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let sh = self.shared.clone();
        let ttl = whole_seconds(req.ttl);
        let first_wait = match req.deadline {
            Deadline::Now => 1,
            Deadline::At(t) => t.saturating_duration_since(Instant::now()).as_secs().max(1),
            Deadline::Never => FOREVER_CHUNK_SECS,
        };
        // From here, dropping `h` (an error, or this future dropped) closes
        // the connection and KILLs its thread: nothing stays locked.
        let h = self.open_transaction(ttl, first_wait).await?;
        // A read-write lock's row is its own, beside the lock's of the same
        // name: readers lock it shared, writers for update. A permit is one
        // of the semaphore's slot rows, its counter one for all of them.
        let (mut h, taken) = match req.mode {
            Mode::Permit { permits } => {
                let wait = (ttl, first_wait);
                let (h, taken) = self
                    .take_slot(h, req.name, permits, req.deadline, wait)
                    .await?;
                (h, taken.map(|(row, at)| (row, counter_row(req.name), at)))
            }
            mode => {
                let mut h = h;
                let (row, shared) = match mode {
                    Mode::Read => (rw_row(req.name), true),
                    Mode::Write => (rw_row(req.name), false),
                    _ => (req.name.to_owned(), false),
                };
                let at = self
                    .wait_for_row(&mut h, &row, req.deadline, first_wait, shared)
                    .await?;
                (h, at.map(|at| (row.clone(), row, at)))
            }
        };
        let Some((row, counter, locked_at)) = taken else {
            self.give_back(h).await?;
            return Ok(None);
        };
        let conn_id = h.id.unwrap_or_default();
        let (fence, sent) = if sh.cfg.fencing {
            // The fencing counter: advanced while the row is locked, in its
            // own committed statement, so it never rolls back with a dead
            // holder.
            let fence = self
                .next_fence(&counter, conn_id, req.owner.to_string())
                .await?;
            let exclusive = matches!(req.mode, Mode::Exclusive);
            if let (true, Some(value)) = (exclusive, req.value) {
                self.record_value(&row, fence, value).await?;
            }
            // Prove the holding transaction outlived the increment: only
            // then is every later holder's increment after this one. A
            // lock's holder proves it by publishing itself, after its
            // fencing row and value are written, so that inspection finds
            // them written.
            let sent = Instant::now();
            if exclusive {
                // A second for a dying previous holder's user lock, unless
                // that would reach past the deadline (a renewal takes it
                // then).
                let wait = match req.deadline {
                    Deadline::Now => 0,
                    Deadline::At(t) if t <= Instant::now() + Duration::from_secs(1) => 0,
                    _ => 1,
                };
                publish(&sh, &mut h, &row, wait, Some(fence)).await?;
            } else {
                self.prove_alive(&mut h).await?;
            }
            (Some(fence), sent)
        } else if locked_at.elapsed() <= req.ttl / 10 {
            // The session's idle clock started with the locking read, which
            // was quick: count the validity from its sending.
            (None, locked_at)
        } else {
            // It waited: one round trip so that the validity counts from
            // now, not from when the wait began.
            let sent = Instant::now();
            self.prove_alive(&mut h).await?;
            (None, sent)
        };
        tracing::debug!(name = req.name, row, ?fence, conn_id, "row lock taken");
        let publishes = sh.cfg.fencing && matches!(req.mode, Mode::Exclusive);
        Ok(Some(Grant {
            lease: Box::new(MysqlLease {
                shared: sh,
                name: row,
                conn_id,
                publish: publishes,
                lost: req.lost.clone(),
                conn: Arc::new(tokio::sync::Mutex::new(Some(h))),
            }),
            fence,
            valid_until: validity_deadline(sent, req.ttl),
        }))
    }

    /// The holder of a lock, with its token and value (`fencing=strict`
    /// only: the holder is found by the user lock it takes beside its
    /// fencing row). Waiters are not counted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        if !self.shared.cfg.fencing {
            return Ok(None);
        }
        self.inspect_row(name).await.map(Some)
    }

    /// The names whose rows are locked now: a lock's, an election's or a
    /// part's row, a read-write lock's (by a writer or readers), a
    /// semaphore's slot. The lock table is read in name order a page at a
    /// time, each page probed in one request that never waits; rows are
    /// never deleted, so the listing stops after a bounded number of rows
    /// (see `listing.rs`). Waiters are not seen. `None` on a server
    /// without `SKIP LOCKED` (MariaDB before 10.6, MySQL before 8.0).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        self.held_names(prefix, limit).await
    }

    /// What a probe that never waits can tell of a semaphore's slots and
    /// a read-write lock's row: one holder per slot held, one holder
    /// standing for every reader while readers hold, one for the writer
    /// while the row is held for update, none with an owner, token or
    /// ttl (the server names who holds a row only in its lock tables, for
    /// `PROCESS`). Readers with a writer waiting behind them show as a
    /// writer. `None` for a layout built from locks.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        self.role_holders(name, role).await
    }
}
