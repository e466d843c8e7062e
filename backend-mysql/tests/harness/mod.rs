//! The mysql harness of the conformance suite, shared by this crate's
//! test binaries (`conformance`, `faults`).

// Shared between test binaries: each uses a part.
#![allow(dead_code)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{Harness, Proxies, Target, COMPOSE_HINT};
use lockcore_mysql::{MysqlBackend, MysqlConfig};
use sqlx::Connection;

#[derive(Debug)]
struct Mysql {
    url: String,
    admin: MysqlBackend,
    /// The server's URL for sqlx (no lock options).
    admin_url: String,
}

#[async_trait]
impl Harness for Mysql {
    async fn connect(&self) -> lockcore::Result<Locker> {
        lockcore_mysql::connect(&self.url).await
    }

    async fn connect_unreachable(&self) -> Option<lockcore::Result<Locker>> {
        Some(lockcore_mysql::connect("mysql://lockcore:lockcore@127.0.0.1:1/lockcore").await)
    }

    fn can_revoke(&self) -> bool {
        true
    }

    fn can_proxy(&self) -> bool {
        true
    }

    async fn connect_via(&self, proxies: &Proxies) -> Option<lockcore::Result<Locker>> {
        let url = match proxies.route_url(&self.url, 3306).await {
            Ok(u) => u,
            Err(e) => return Some(Err(Error::backend_error("mysql", format!("proxy: {e}")))),
        };
        Some(lockcore_mysql::connect(&url).await)
    }

    /// `KILL` of the session holding the row, as an operator ends a lock.
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        self.admin.kill_holder(name).await
    }

    /// Open transactions of other sessions (a lock is a transaction). The
    /// names' rows stay by design (one per name, as the recipe needs).
    async fn leftovers(&self, names: &[String]) -> Option<Vec<String>> {
        let _ = names;
        let mut c = match sqlx::MySqlConnection::connect(&self.admin_url).await {
            Ok(c) => c,
            Err(e) => return Some(vec![format!("could not look: {e}")]),
        };
        let rows: Result<Vec<(u64, String)>, _> = sqlx::query_as(
            "SELECT CAST(trx_mysql_thread_id AS UNSIGNED), CAST(trx_state AS CHAR) FROM information_schema.innodb_trx WHERE trx_mysql_thread_id <> CONNECTION_ID()",
        )
        .fetch_all(&mut c)
        .await;
        Some(match rows {
            Ok(rows) => rows
                .into_iter()
                .map(|(id, state)| format!("transaction of session {id} ({state})"))
                .collect(),
            Err(e) => vec![format!("could not look: {e}")],
        })
    }
}

/// The MySQL target over `LOCKTEST_MYSQL_URL`, called `name`.
pub(crate) fn target(name: &str) -> Target {
    target_with(name, "")
}

/// The MySQL target over `LOCKTEST_MYSQL_URL` with the URL options `extra`
/// (`k=v&...`) added, called `name`.
pub(crate) fn target_with(name: &str, extra: &'static str) -> Target {
    Target::new(name, Some("LOCKTEST_MYSQL_URL"), move |url| async move {
        let url = match (extra, url.contains('?')) {
            ("", _) => url,
            (_, true) => format!("{url}&{extra}"),
            (_, false) => format!("{url}?{extra}"),
        };
        let admin = MysqlBackend::connect(MysqlConfig::parse(&url)?).await?;
        let sep = if url.contains('?') { '&' } else { '?' };
        let admin_url =
            url.split('?')
                .next()
                .unwrap_or_default()
                .replacen("mariadb://", "mysql://", 1);
        Ok(Arc::new(Mysql {
            url: format!("{url}{sep}ensure_schema=false"),
            admin,
            admin_url,
        }) as Arc<dyn Harness>)
    })
    .hint(COMPOSE_HINT)
}
