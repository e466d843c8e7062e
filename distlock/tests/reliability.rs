//! The reliability matrix: the fault scenarios of
//! `lockcore_conformance::scenarios` on every backend and topology, through
//! `distlock::connect`, one at a time (some pause servers). Each prints a
//! `FIGURES` line; `RELIABILITY.md` tabulates them:
//!
//! ```sh
//! eval "$(compose/local env)"
//! cargo test -p distlock --features full --test reliability -- --nocapture 2>&1 | grep FIGURES
//! ```
//!
//! The guarded resource of `paused_holder_is_fenced` is a row of a real
//! MySQL table written with `UPDATE ... WHERE fence < ?` when
//! `LOCKTEST_MYSQL_URL` is set (a fencing gate in memory otherwise).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use async_trait::async_trait;
use lockcore_conformance::scenarios::{
    cut_off_holder, impostor_servers, paused_holder_is_fenced, servers_paused, Compose,
    GateResource, Resource,
};
use lockcore_conformance::{run_serial, ConnectFuture, Ctx, Target, UrlHarness, COMPOSE_HINT};
use sqlx::Connection;

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { distlock::connect(&url).await })
}

/// A row per lock name in a MySQL table; a write is
/// `UPDATE lockcore_fenced SET fence = ? WHERE name = ? AND fence < ?`.
struct SqlRow {
    conn: tokio::sync::Mutex<sqlx::MySqlConnection>,
}

impl SqlRow {
    async fn open(url: &str) -> Self {
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .expect("the resource's MySQL connection");
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS lockcore_fenced (name VARBINARY(255) PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL)",
        )
        .execute(&mut conn)
        .await
        .expect("create the resource's table");
        SqlRow {
            conn: tokio::sync::Mutex::new(conn),
        }
    }
}

#[async_trait]
impl Resource for SqlRow {
    async fn write(&self, name: &str, token: u64) -> Result<bool, String> {
        let mut c = self.conn.lock().await;
        sqlx::query("INSERT IGNORE INTO lockcore_fenced (name, fence) VALUES (?, 0)")
            .bind(name.as_bytes())
            .execute(&mut *c)
            .await
            .map_err(|e| e.to_string())?;
        let done = sqlx::query("UPDATE lockcore_fenced SET fence = ? WHERE name = ? AND fence < ?")
            .bind(token)
            .bind(name.as_bytes())
            .bind(token)
            .execute(&mut *c)
            .await
            .map_err(|e| e.to_string())?;
        Ok(done.rows_affected() == 1)
    }
}

async fn fenced(ctx: Ctx) {
    let report = match std::env::var("LOCKTEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => {
            let row = SqlRow::open(url.split('?').next().unwrap_or_default()).await;
            paused_holder_is_fenced(&ctx, &row).await
        }
        _ => paused_holder_is_fenced(&ctx, &GateResource::default()).await,
    };
    eprintln!("{report}");
}

async fn cut_off(ctx: Ctx) {
    match cut_off_holder(&ctx).await {
        Some(report) => eprintln!("{report}"),
        None => eprintln!("{}: cannot be proxied", ctx.target),
    }
}

async fn impostors(ctx: Ctx) {
    match impostor_servers(&ctx).await {
        Some(report) => eprintln!("{report}"),
        None => eprintln!("{}: cannot be proxied", ctx.target),
    }
}

async fn paused(ctx: Ctx, servers: &'static [&'static str]) {
    let control = Compose(servers.iter().map(|s| (*s).to_owned()).collect());
    let _resume = lockcore_conformance::UndoOnDrop::new("resume", servers);
    let report = servers_paused(&ctx, &control, Duration::from_secs(7)).await;
    eprintln!("{report}");
}

/// `name` over `var`, proxied through `port` when `Some` (not a cluster),
/// pausing `servers` in the paused-servers scenario.
fn target(name: &str, var: &str, port: Option<u16>, servers: &'static [&'static str]) -> Target {
    let t = Target::new(name, Some(var), move |url| async move {
        Ok(match port {
            Some(p) => UrlHarness::proxied(url, connect, p),
            None => UrlHarness::shared(url, connect),
        })
    })
    .hint(COMPOSE_HINT)
    .only_own_cases()
    .case("paused_holder_is_fenced", |ctx| Box::pin(fenced(ctx)))
    .case("cut_off_holder", |ctx| Box::pin(cut_off(ctx)))
    .case("impostor_servers", |ctx| Box::pin(impostors(ctx)));
    match servers {
        ["redis"] => t.case("servers_paused", |ctx| Box::pin(paused(ctx, &["redis"]))),
        ["redlock-1", ..] => t.case("servers_paused", |ctx| {
            Box::pin(paused(
                ctx,
                &[
                    "redlock-1",
                    "redlock-2",
                    "redlock-3",
                    "redlock-4",
                    "redlock-5",
                ],
            ))
        }),
        ["redis-cluster-1", ..] => t.case("servers_paused", |ctx| {
            Box::pin(paused(
                ctx,
                &["redis-cluster-1", "redis-cluster-2", "redis-cluster-3"],
            ))
        }),
        ["zk"] => t.case("servers_paused", |ctx| Box::pin(paused(ctx, &["zk"]))),
        ["zk-1", ..] => t.case("servers_paused", |ctx| {
            Box::pin(paused(ctx, &["zk-1", "zk-2", "zk-3"]))
        }),
        ["etcd"] => t.case("servers_paused", |ctx| Box::pin(paused(ctx, &["etcd"]))),
        ["etcd-1", ..] => t.case("servers_paused", |ctx| {
            Box::pin(paused(ctx, &["etcd-1", "etcd-2", "etcd-3"]))
        }),
        ["mariadb"] => t.case("servers_paused", |ctx| Box::pin(paused(ctx, &["mariadb"]))),
        ["postgres"] => t.case("servers_paused", |ctx| Box::pin(paused(ctx, &["postgres"]))),
        _ => t,
    }
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        Target::new("memory", None, |_| async {
            Ok(UrlHarness::shared("memory://reliability", connect))
        })
        .only_own_cases()
        .case("paused_holder_is_fenced", |ctx| Box::pin(fenced(ctx))),
        target("redis", "LOCKTEST_REDIS_URL", Some(6379), &["redis"]),
        target(
            "redis-cluster",
            "LOCKTEST_REDIS_CLUSTER_URL",
            None,
            &["redis-cluster-1", "redis-cluster-2", "redis-cluster-3"],
        ),
        target(
            "redlock",
            "LOCKTEST_REDLOCK_URL",
            Some(6379),
            &[
                "redlock-1",
                "redlock-2",
                "redlock-3",
                "redlock-4",
                "redlock-5",
            ],
        ),
        target("zk", "LOCKTEST_ZK_URL", Some(2181), &["zk"]),
        target(
            "zk-ensemble",
            "LOCKTEST_ZK_ENSEMBLE_URL",
            Some(2181),
            &["zk-1", "zk-2", "zk-3"],
        ),
        target("etcd", "LOCKTEST_ETCD_URL", Some(2379), &["etcd"]),
        target(
            "etcd-cluster",
            "LOCKTEST_ETCD_CLUSTER_URL",
            Some(2379),
            &["etcd-1", "etcd-2", "etcd-3"],
        ),
        target("mysql", "LOCKTEST_MYSQL_URL", Some(3306), &["mariadb"]),
        target(
            "postgres",
            "LOCKTEST_POSTGRES_URL",
            Some(5432),
            &["postgres"],
        ),
    ])
}
