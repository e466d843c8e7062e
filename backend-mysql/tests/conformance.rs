//! The conformance suite against MariaDB (or MySQL 8) from compose/.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::{Error, Locker};
use lockcore_conformance::{run, Harness, Proxies, Target, COMPOSE_HINT};
use lockcore_mysql::{MysqlBackend, MysqlConfig};

#[derive(Debug)]
struct Mysql {
    url: String,
    admin: MysqlBackend,
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
}

fn main() -> std::process::ExitCode {
    run(vec![Target::new(
        "mysql",
        Some("LOCKTEST_MYSQL_URL"),
        |url| async move {
            let admin = MysqlBackend::connect(MysqlConfig::parse(&url)?).await?;
            let sep = if url.contains('?') { '&' } else { '?' };
            Ok(Arc::new(Mysql {
                url: format!("{url}{sep}ensure_schema=false"),
                admin,
            }) as Arc<dyn Harness>)
        },
    )
    .hint(COMPOSE_HINT)])
}
