//! The backend's handle: its settings and connections, and connecting.

use std::sync::Arc;

use lockcore::raw::prelude::*;
use sqlx::AssertSqlSafe;

use crate::config::{PostgresConfig, NAME};
use crate::conn::{ask, Shared};
use crate::error::sqlstate;

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
        let ensure = cfg.ensure_schema;
        let shared = Shared::new(cfg).await?;
        // The first lock connection says clearly why connecting failed; it
        // is kept for the first lock.
        let mut first = shared.open().await?;
        let limit = shared.cfg.request_timeout;
        let probe = format!("SELECT 1 FROM {} LIMIT 0", shared.cfg.table);
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
                Err(e) if e.kind() == ErrorKind::Unauthorized => {
                    let found = sqlx::query(AssertSqlSafe(probe.as_str())).execute(&mut first.conn);
                    let found = ask(&shared, "looking for the lock table", limit, false, found);
                    if found.await.is_err() {
                        return Err(Error::new(
                            e.kind(),
                            NAME,
                            format!(
                                "{}; the table {} is not there to use either: create it in advance (lockcore_postgres::schema_sql) or grant the user CREATE on the schema",
                                e.message(),
                                shared.cfg.table
                            ),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        } else {
            ask(
                &shared,
                "looking for the lock table",
                limit,
                false,
                sqlx::query(AssertSqlSafe(probe.as_str())).execute(&mut first.conn),
            )
            .await?;
        }
        shared.give_back(first);
        Ok(PostgresBackend {
            shared: Arc::new(shared),
        })
    }
}
