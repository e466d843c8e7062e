//! The PostgreSQL harness of the conformance suite, shared by this crate's
//! test binaries (`conformance`, `faults`, `roles`).

// Shared between test binaries: each uses a part.
#![allow(dead_code)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{Harness, Proxies, Target, COMPOSE_HINT};
use sqlx::Connection;

/// The advisory lock entries of the name given as `$1`.
pub(crate) const LOCKS_OF: &str =
    "FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
    AND l.classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::bigint::oid \
    AND l.objid = (hashtextextended($1, 0) & 4294967295)::bigint::oid";

#[derive(Debug)]
pub(crate) struct Postgres {
    pub(crate) url: String,
}

impl Postgres {
    /// An admin connection of the test (plain sqlx).
    pub(crate) async fn admin(&self) -> Result<sqlx::PgConnection, sqlx::Error> {
        sqlx::PgConnection::connect(self.url.split('?').next().unwrap_or_default()).await
    }
}

#[async_trait]
impl Harness for Postgres {
    async fn connect(&self) -> lockcore::Result<Locker> {
        lockcore_postgres::connect(&self.url).await
    }

    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        Some(lockcore_postgres::connect("postgres://lockcore:lockcore@127.0.0.1:1/lockcore").await)
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn can_proxy(&self) -> bool {
        true
    }

    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        let url = match proxies.route_url(&self.url, 5432).await {
            Ok(u) => u,
            Err(e) => return Some(Err(Error::backend_error("postgres", format!("proxy: {e}")))),
        };
        Some(lockcore_postgres::connect(&url).await)
    }

    /// `pg_terminate_backend` of the session holding the name, as an
    /// operator ends a lock.
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        let fail = |e: sqlx::Error| Error::backend_error("postgres", format!("revoke: {e}"));
        let mut c = self.admin().await.map_err(fail)?;
        let sql = format!("SELECT pg_terminate_backend(l.pid) {LOCKS_OF} AND l.granted");
        let ended: Vec<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(name)
            .fetch_all(&mut c)
            .await
            .map_err(fail)?;
        Ok(ended.contains(&true))
    }

    /// Sessions that hold or await the names' advisory locks.
    async fn leftovers(&self, names: &[String]) -> Option<Vec<String>> {
        let mut c = match self.admin().await {
            Ok(c) => c,
            Err(e) => return Some(vec![format!("could not look: {e}")]),
        };
        let sql = format!("SELECT l.pid, l.granted {LOCKS_OF}");
        let mut out = Vec::new();
        for name in names {
            let rows: Result<Vec<(Option<i32>, bool)>, _> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                    .bind(name)
                    .fetch_all(&mut c)
                    .await;
            match rows {
                Ok(rows) => out.extend(rows.into_iter().map(|(pid, granted)| {
                    let what = if granted { "holds" } else { "waits for" };
                    format!("session {pid:?} {what} {name:?}")
                })),
                Err(e) => out.push(format!("could not look: {e}")),
            }
        }
        Some(out)
    }
}

/// The PostgreSQL target over `LOCKTEST_POSTGRES_URL`, called `name`.
pub(crate) fn target(name: &str) -> Target {
    Target::new(name, Some("LOCKTEST_POSTGRES_URL"), |url| async move {
        Ok(Arc::new(Postgres { url }) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}
