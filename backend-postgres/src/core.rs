//! The backend's handle: its settings and connections, and connecting.

use std::sync::Arc;

use lockcore::raw::prelude::*;
use sqlx::AssertSqlSafe;

use crate::config::{check_table, PostgresConfig, NAME};
use crate::conn::{ask, Shared};
use crate::error::{code, sqlstate};
use crate::sql::ident;

/// A PostgreSQL server holding locks as session-level advisory locks. Cheap
/// to clone: clones share connections.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    pub(crate) shared: Arc<Shared>,
}

/// `unique_violation` and `duplicate_table`: another client created the
/// table at the same moment (`CREATE TABLE IF NOT EXISTS` races on the
/// catalog).
const CREATED_BESIDE: [&str; 2] = ["23505", "42P07"];

impl PostgresBackend {
    /// Connects to the server of `cfg`, and creates the table if missing
    /// (with `ensure_schema`, the default) or checks that it is there.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unavailable`] when the server cannot be reached,
    /// [`ErrorKind::Unauthorized`] when it refuses the user, and
    /// [`ErrorKind::InvalidConfig`] when the database or the table is
    /// missing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it creates no lock state.
    pub async fn connect(cfg: PostgresConfig) -> Result<Self> {
        // Checked here too: a config made in code skips the URL's checks,
        // and the name goes into statements.
        check_table(&cfg.table)
            .map_err(|why| Error::invalid_config(NAME, format!("table {:?}: {why}", cfg.table)))?;
        let ensure = cfg.ensure_schema;
        let shared = Shared::new(cfg).await?;
        // The first lock connection says clearly why connecting failed; it
        // is kept for the first lock.
        let mut first = shared.open().await?;
        let limit = shared.cfg.request_timeout;
        let mut refused = None;
        if ensure {
            let created =
                sqlx::query(AssertSqlSafe(shared.sql.schema.as_str())).execute(&mut first.conn);
            let r = ask(&shared, "creating the lock table", limit, false, async {
                match created.await {
                    Err(e)
                        if sqlstate(&e).is_some_and(|s| CREATED_BESIDE.contains(&s.as_str())) =>
                    {
                        Ok(())
                    }
                    r => r.map(|_| ()),
                }
            })
            .await;
            match r {
                Ok(()) => {}
                // `IF NOT EXISTS` is checked after the right to create in
                // the schema: a user who may use the table but not create
                // tables (PostgreSQL 15's default on `public`) is refused
                // even when the table is there. It is enough that it is.
                Err(e) if e.kind() == ErrorKind::Unauthorized => refused = Some(e),
                Err(e) => return Err(e),
            }
        }
        // As the statements name it: quoted, in lower case.
        let table = &ident(&shared.cfg.table);
        let look = look(&shared, &mut first.conn).await?;
        let problem = match (look, refused) {
            (Look::Usable, _) => None,
            (Look::Absent, Some(e)) => Some(Error::new(
                e.kind(),
                NAME,
                format!(
                    "{}; the table {table} is not there to use either: create it in advance (lockcore_postgres::schema_sql) or grant the user CREATE on the schema",
                    e.message()
                ),
            )),
            (Look::Absent, None) => Some(Error::invalid_config(
                NAME,
                format!("the lock table {table} is not there: create it in advance (lockcore_postgres::schema_sql), or connect with ensure_schema=true"),
            )),
            (Look::Unlike(why), _) => Some(Error::invalid_config(
                NAME,
                format!("the table {table} is not a lock table as lockcore_postgres::schema_sql makes one ({why}): give it those columns and the unique key on name, or name another table with table="),
            )),
            (Look::Forbidden(why), _) => Some(Error::new(
                ErrorKind::Unauthorized,
                NAME,
                format!("the user may not SELECT, INSERT and UPDATE the lock table {table} ({why}): grant it those rights, on the table or on its columns"),
            )),
        };
        if let Some(e) = problem {
            return Err(e);
        }
        shared.give_back(first);
        Ok(PostgresBackend {
            shared: Arc::new(shared),
        })
    }
}

/// What a look at the lock table found.
enum Look {
    /// There, with its columns, and the user may use it.
    Usable,
    /// Not there.
    Absent,
    /// There, without the columns of a lock table or its unique key on
    /// `name`: the server's words.
    Unlike(String),
    /// There, but the user may not read or write it: the server's words.
    Forbidden(String),
}

/// Looks at the lock table the way the backend uses it: `EXPLAIN` of a
/// lock's take and release, of the holder's read and of the listing, which
/// plans each statement and checks the user's rights on what it touches
/// without running it. So the table (or a view over one) is there, has
/// the columns and the unique key on `name` the statements use, and the
/// user may read, write and update them, granted on the table or on the
/// columns, as the server will judge at the first lock; and its unique
/// key on `name` is not deferrable (planned, but refused at the first
/// insertion). A failure to ask (no answer in time, a connection lost) is
/// that error, not a finding. What only running a statement finds is left
/// to the first lock: a read-only server, a `fence` too narrow for the
/// clock-floored tokens, NOT NULL on a column a release clears.
async fn look(shared: &Shared, conn: &mut sqlx::PgConnection) -> Result<Look> {
    let sql = &shared.sql;
    let explain = |stmt: &str| format!("EXPLAIN {stmt}");
    let request = async {
        let planned = async {
            sqlx::query(AssertSqlSafe(explain(&sql.lock.try_lock)))
                .bind("")
                .bind("")
                .bind(None::<&str>)
                .bind("1")
                .bind("")
                .execute(&mut *conn)
                .await?;
            sqlx::query(AssertSqlSafe(explain(&sql.lock.release)))
                .bind("")
                .bind("")
                .bind("")
                .execute(&mut *conn)
                .await?;
            sqlx::query(AssertSqlSafe(explain(&sql.holder_row)))
                .bind("")
                .bind(0_i32)
                .execute(&mut *conn)
                .await?;
            sqlx::query(AssertSqlSafe(explain(&sql.list)))
                .bind("%")
                .bind(1_i64)
                .execute(&mut *conn)
                .await?;
            // The planner takes a deferrable unique key as the upsert's
            // target; only a row's insertion is refused (55000).
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_constraint c JOIN pg_attribute a \
                 ON a.attrelid = c.conrelid AND a.attname = 'name' \
                 WHERE c.conrelid = to_regclass($1) AND c.condeferrable \
                 AND c.contype IN ('p', 'u') AND c.conkey = ARRAY[a.attnum])",
            )
            .bind(ident(&shared.cfg.table))
            .fetch_one(&mut *conn)
            .await
        };
        let e = match planned.await {
            Ok(false) => return Ok(Look::Usable),
            Ok(true) => {
                return Ok(Look::Unlike(
                    "its unique key on name is deferrable, which an upsert does not take".into(),
                ))
            }
            Err(e) => e,
        };
        let said = || {
            e.as_database_error()
                .map(|d| d.message().to_owned())
                .unwrap_or_default()
        };
        match sqlstate(&e).as_deref() {
            Some(code::UNDEFINED_TABLE) => Ok(Look::Absent),
            Some(
                code::UNDEFINED_COLUMN
                | code::INVALID_COLUMN_REFERENCE
                | code::DATATYPE_MISMATCH
                | code::WRONG_OBJECT_TYPE
                | code::UNDEFINED_FUNCTION
                | code::AMBIGUOUS_FUNCTION
                | code::GENERATED_ALWAYS
                | code::FEATURE_NOT_SUPPORTED
                | code::NOT_IN_PREREQUISITE_STATE,
            ) => Ok(Look::Unlike(said())),
            Some(code::INSUFFICIENT_PRIVILEGE) => Ok(Look::Forbidden(said())),
            _ => Err(e),
        }
    };
    let limit = shared.cfg.request_timeout;
    ask(shared, "looking at the lock table", limit, false, request).await
}
