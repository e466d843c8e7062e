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
        let table = &shared.cfg.table;
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
            (Look::Unlike, _) => Some(Error::invalid_config(
                NAME,
                format!("the table {table} is not a lock table (it lacks columns, or the unique key on name, of lockcore_postgres::schema_sql): name another with table=, or drop it"),
            )),
            (Look::Forbidden, _) => Some(Error::new(
                ErrorKind::Unauthorized,
                NAME,
                format!("the user may not SELECT, INSERT and UPDATE the lock table {table}: grant it those rights"),
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
    /// `name`.
    Unlike,
    /// There, but the user may not read or write it.
    Forbidden,
}

/// Looks at the lock table: that it is there, has the columns and the
/// unique key on `name` the backend's statements use, and that the user
/// may read, write and update those columns (granted on the table or on
/// each column). A failure to ask (no answer in time, a connection lost)
/// is that error, not a finding.
async fn look(shared: &Shared, conn: &mut sqlx::PgConnection) -> Result<Look> {
    let table = ident(&shared.cfg.table);
    // The table's own columns are read first: a missing table or column
    // fails the statement before the functions below run on it.
    let probe = format!(
        "SELECT \
         (SELECT bool_and(has_column_privilege($1, c, 'SELECT') AND has_column_privilege($1, c, 'INSERT') \
          AND (c = 'name' OR has_column_privilege($1, c, 'UPDATE'))) \
          FROM unnest(ARRAY['name', 'fence', 'owner', 'pid', 'since', 'value']) c), \
         EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a \
          ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
          WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indisvalid AND i.indimmediate \
          AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'name'), \
         (SELECT count(*) FROM (SELECT name, fence, owner, pid, since, value FROM {table} LIMIT 0) t)"
    );
    let request = async {
        let found = sqlx::query_as::<_, (bool, bool, i64)>(AssertSqlSafe(probe))
            .bind(&table)
            .fetch_one(conn)
            .await;
        match found {
            Ok((_, false, _)) => Ok(Look::Unlike),
            Ok((true, true, _)) => Ok(Look::Usable),
            Ok((false, true, _)) => Ok(Look::Forbidden),
            Err(e) => match sqlstate(&e).as_deref() {
                Some(code::UNDEFINED_TABLE) => Ok(Look::Absent),
                Some(code::UNDEFINED_COLUMN) => Ok(Look::Unlike),
                Some(code::INSUFFICIENT_PRIVILEGE) => Ok(Look::Forbidden),
                _ => Err(e),
            },
        }
    };
    let limit = shared.cfg.request_timeout;
    ask(shared, "looking at the lock table", limit, false, request).await
}
