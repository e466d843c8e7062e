//! What the server's roles and tables do to connecting and waiting
//! (server from compose/): a role's default timeouts, a user without
//! CREATE, a user with the table's rights or its columns', a user
//! without them, a table of the lock table's name that is not one, and a
//! table named by a reserved word, and a search_path with no schema.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::Duration;

use lockcore::ErrorKind;
use lockcore_conformance::own_cases;
use lockcore_conformance::{run_serial, Ctx};
use sqlx::Connection;

async fn admin(ctx: &Ctx) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(ctx.config.split('?').next().unwrap())
        .await
        .expect("admin connection")
}

async fn exec(c: &mut sqlx::PgConnection, sql: &'static str) {
    sqlx::query(sql)
        .execute(c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The role's default timeouts, reset.
async fn reset_role(c: &mut sqlx::PgConnection) {
    exec(c, "ALTER ROLE CURRENT_USER RESET statement_timeout").await;
    exec(c, "ALTER ROLE CURRENT_USER RESET lock_timeout").await;
}

/// `url` with the option `opt`.
fn with(url: &str, opt: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{opt}")
}

/// The case's URL as compose's `lockcore_dml`, a role with no rights but
/// to log in.
fn dml_url(ctx: &Ctx) -> String {
    let (_, at) = ctx.config.split_once('@').expect("a URL with a user");
    format!("postgres://lockcore_dml:lockcore@{at}")
}

/// `lockcore_dml`'s own default search_path, reset (by the role itself):
/// a run killed inside `a_search_path_with_no_schema_is_named` left it
/// naming no schema.
async fn reset_dml(ctx: &Ctx) {
    let mut c = sqlx::PgConnection::connect(&dml_url(ctx))
        .await
        .expect("lockcore_dml's connection");
    exec(&mut c, "ALTER ROLE CURRENT_USER RESET search_path").await;
}

/// A role whose default `statement_timeout` and `lock_timeout` are shorter
/// than a wait (`ALTER ROLE ... SET`, as some sites set for every
/// application) does not cut the wait short: the backend's sessions run
/// without them and bound each request themselves: a wait for the name,
/// and a try that waits for its fence's row. The role is reset before and
/// after, before anything is asserted, so no later case connects with
/// them.
async fn a_roles_timeouts_do_not_cut_a_wait(ctx: Ctx) {
    let mut c = admin(&ctx).await;
    // A run killed midway left them.
    reset_role(&mut c).await;
    for set in [
        "ALTER ROLE CURRENT_USER SET statement_timeout = '300ms'",
        "ALTER ROLE CURRENT_USER SET lock_timeout = '300ms'",
    ] {
        sqlx::query(set).execute(&mut c).await.unwrap();
    }
    // In a task of its own: a panic in it (a client that cannot connect)
    // still lets the role be reset below.
    let ctx2 = ctx.clone();
    let waited = tokio::spawn(async move {
        let ctx = ctx2;
        let (a, b) = (ctx.locker().await, ctx.locker().await);
        let name = ctx.name("role-timeouts");
        let g = a.try_lock(&name).await?.expect("free");
        let waiter = {
            let name = name.clone();
            tokio::spawn(async move { b.lock_timeout(&name, Duration::from_secs(10)).await })
        };
        // Time is the subject: held four times the role's timeouts.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        g.release().await?;
        let g2 = waiter.await.expect("the waiter's task")?;
        g2.release().await?;
        // The fence's row locked by another transaction: a try waits for
        // it, past the role's lock_timeout (the wait above sets its own).
        let mut other = admin(&ctx).await;
        let mut tx = other.begin().await.expect("begin");
        sqlx::query("SELECT 1 FROM lockcore_locks WHERE name = $1 FOR UPDATE")
            .bind(&name)
            .execute(&mut *tx)
            .await
            .expect("the row locked");
        let tried = tokio::spawn(async move { a.try_lock(&name).await });
        tokio::time::sleep(Duration::from_millis(1200)).await;
        tx.commit().await.expect("commit");
        let g3 = tried.await.expect("the try's task")?.expect("free");
        g3.release().await
    });
    let outcome = tokio::time::timeout(Duration::from_secs(30), waited).await;
    reset_role(&mut c).await;
    let outcome = outcome
        .expect("the wait ended within 30 s")
        .expect("the waiting task");
    if let Err(e) = outcome {
        panic!("the role's timeouts cut the wait short: {e}");
    }
}

/// What a user needs of the lock table, granted on the table and then on
/// its columns alone.
const GRANTS: [&str; 2] = [
    "GRANT SELECT, INSERT, UPDATE ON lockcore_locks TO lockcore_dml",
    "GRANT SELECT (name, fence, owner, pid, since, value), \
     INSERT (name, fence, owner, pid, since, value), \
     UPDATE (fence, owner, pid, since, value) ON lockcore_locks TO lockcore_dml",
];

/// Locks, inspects, lists and releases a name through `url`, proving each
/// step on the server with `owner`'s client.
async fn uses_the_table(ctx: Ctx, url: String, owner: lockcore::Locker) -> lockcore::Result<()> {
    let l = lockcore_postgres::connect(&url).await?;
    let name = ctx.name("no-create");
    let g = l.try_lock(&name).await?.expect("free");
    assert!(
        owner.try_lock(&name).await?.is_none(),
        "taken beside the user without CREATE"
    );
    let info = l.inspect(&name).await?.expect("inspected");
    let fence = info.holder.as_ref().and_then(|h| h.fence);
    assert_eq!(fence, g.fence(), "{info:?}");
    let held = l.held(&name, 10).await?.expect("the backend lists");
    assert_eq!(held.names.len(), 1, "{held:?}");
    g.release().await?;
    assert!(owner.try_lock(&name).await?.is_some(), "not released");
    Ok(())
}

/// A user that may use the lock table but not create tables (PostgreSQL
/// 15's default on `public` for all but the database's owner; compose's
/// `lockcore_dml`) connects with the default `ensure_schema`: the table
/// is there, so nothing needs creating. SELECT, INSERT and UPDATE are
/// enough, granted on the table or on its columns alone: it locks,
/// inspects, lists and releases, and its locks exclude the owner's. Its
/// rights are revoked before anything is asserted.
async fn a_user_without_create_connects_to_an_existing_table(ctx: Ctx) {
    reset_dml(&ctx).await;
    let owner = ctx.locker().await;
    let mut c = admin(&ctx).await;
    // A run killed midway left them.
    exec(&mut c, "REVOKE ALL ON lockcore_locks FROM lockcore_dml").await;
    let url = dml_url(&ctx);
    // A table that is not there: the refusal says how to make it. Before
    // PostgreSQL 15 everyone may create in `public`, and nothing is refused.
    let may_create: bool =
        sqlx::query_scalar("SELECT has_schema_privilege('lockcore_dml', 'public', 'CREATE')")
            .fetch_one(&mut c)
            .await
            .unwrap();
    if !may_create {
        let absent = lockcore_postgres::connect(&with(&url, "table=lockcore_absent")).await;
        exec(&mut c, "DROP TABLE IF EXISTS lockcore_absent").await;
        let absent = absent.expect_err("no table and no right to create it");
        assert_eq!(absent.kind(), ErrorKind::Unauthorized, "{absent}");
        assert!(absent.to_string().contains("schema_sql"), "{absent}");
    }
    for grant in GRANTS {
        exec(&mut c, grant).await;
        let used = tokio::spawn(uses_the_table(ctx.clone(), url.clone(), owner.clone())).await;
        exec(&mut c, "REVOKE ALL ON lockcore_locks FROM lockcore_dml").await;
        match used {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{grant}: {e}"),
            Err(e) => panic!("{grant}: {e}"),
        }
    }
}

/// Whether the relation `name` (as SQL writes it) is there.
async fn exists(c: &mut sqlx::PgConnection, name: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(name)
        .fetch_one(c)
        .await
        .unwrap()
}

/// A table named by a word SQL reserves (`user`, `order`) is a table of
/// that name, not the current user or a syntax error; a name in capitals
/// names the table the same name unquoted does (`MyLocks`: `mylocks`), as
/// it did before names were quoted.
async fn a_table_named_by_a_keyword_is_that_table(ctx: Ctx) {
    let mut c = admin(&ctx).await;
    for (table, made) in [
        ("user", "\"user\""),
        ("order", "\"order\""),
        ("Lockcore_Mixed", "lockcore_mixed"),
    ] {
        let url = with(&ctx.config, &format!("table={table}"));
        // In a task of its own: a panic in it still lets the table be
        // dropped below.
        let ctx2 = ctx.clone();
        let used = tokio::spawn(async move {
            let ctx = ctx2;
            let other = ctx.locker().await;
            let l = lockcore_postgres::connect(&url).await?;
            let name = ctx.name("keyword");
            let g = l.try_lock(&name).await?.expect("free");
            assert!(l.inspect(&name).await?.is_some(), "{table}: not inspected");
            // The name's advisory lock is shared across tables.
            assert!(
                other.try_lock(&name).await?.is_none(),
                "{table}: taken twice"
            );
            g.release().await
        })
        .await;
        let there = exists(&mut c, made).await;
        // And the name as written, were it made so.
        for t in [made.to_owned(), format!("\"{table}\"")] {
            let dropped = format!("DROP TABLE IF EXISTS {t}");
            sqlx::query(sqlx::AssertSqlSafe(dropped))
                .execute(&mut c)
                .await
                .unwrap();
        }
        match used {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("table={table}: {e}"),
            Err(e) => panic!("table={table}: {e}"),
        }
        assert!(there, "table={table}: no table {made} was made");
    }
}

/// A user whose search_path names no schema that exists: connecting says
/// so (the CREATE fails with `3F000`, "no schema has been selected"), as
/// a configuration error that names the search_path, not an unexplained
/// backend error. The role is reset before and after, before anything is
/// asserted.
async fn a_search_path_with_no_schema_is_named(ctx: Ctx) {
    // The role sets its own default, as any role may: compose's
    // `lockcore_dml`, which no other binary connects as.
    reset_dml(&ctx).await;
    let mut c = sqlx::PgConnection::connect(&dml_url(&ctx))
        .await
        .expect("lockcore_dml's connection");
    exec(
        &mut c,
        "ALTER ROLE CURRENT_USER SET search_path = lockcore_nowhere",
    )
    .await;
    let url = dml_url(&ctx);
    let e = tokio::spawn(async move { lockcore_postgres::connect(&url).await.err() }).await;
    exec(&mut c, "ALTER ROLE CURRENT_USER RESET search_path").await;
    let e = e
        .expect("the connecting task")
        .expect("no schema to make the table in");
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("search_path"), "{e}");
}

/// Connecting looks at the table: a user who may read it but not write
/// it, or write it but not read it, is refused at once (not at its first
/// lock), with the rights it needs; a table of that name without a lock
/// table's columns is refused as not one; a table name set in code, past
/// the URL's checks, is checked too.
async fn connecting_checks_the_table_and_the_users_rights(ctx: Ctx) {
    reset_dml(&ctx).await;
    // The owner's connection makes the table.
    drop(ctx.locker().await);
    let mut c = admin(&ctx).await;
    let url = dml_url(&ctx);
    for (grant, what) in [
        (
            "GRANT SELECT ON lockcore_locks TO lockcore_dml",
            "read only",
        ),
        (
            "GRANT INSERT, UPDATE, DELETE ON lockcore_locks TO lockcore_dml",
            "write only",
        ),
        (
            "GRANT SELECT (name, fence, owner, pid, since, value), \
             INSERT (name, fence, owner, pid, since, value), \
             UPDATE (fence, owner, pid, since) ON lockcore_locks TO lockcore_dml",
            "no UPDATE of value",
        ),
    ] {
        exec(&mut c, "REVOKE ALL ON lockcore_locks FROM lockcore_dml").await;
        exec(&mut c, grant).await;
        let e = lockcore_postgres::connect(&url).await;
        exec(&mut c, "REVOKE ALL ON lockcore_locks FROM lockcore_dml").await;
        let e = e.err().unwrap_or_else(|| panic!("{what}: connected"));
        assert_eq!(e.kind(), ErrorKind::Unauthorized, "{what}: {e}");
        let said = e.to_string();
        assert!(said.contains("SELECT, INSERT and UPDATE"), "{what}: {said}");
        assert!(!said.contains("not there"), "{what}: {said}");
    }
    // Tables that are not lock tables, each with what the refusal says:
    // one without the columns; one with them but without the unique key
    // on `name` a lock's upsert needs; one whose key is deferrable
    // (planned, refused at a row).
    let columns = "fence bigint NOT NULL, owner text, pid integer, since timestamptz, value text";
    for (table, key, says) in [
        (
            "lockcore_unlike",
            "name text PRIMARY KEY",
            "not a lock table",
        ),
        ("lockcore_unkeyed", "name text", "not a lock table"),
        (
            "lockcore_deferred",
            "name text PRIMARY KEY DEFERRABLE",
            "deferrable",
        ),
    ] {
        let cols = if table == "lockcore_unlike" {
            key.to_owned()
        } else {
            format!("{key}, {columns}")
        };
        for ddl in [
            format!("DROP TABLE IF EXISTS {table}"),
            format!("CREATE TABLE {table} ({cols})"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(ddl))
                .execute(&mut c)
                .await
                .unwrap();
        }
        let e = lockcore_postgres::connect(&with(&ctx.config, &format!("table={table}"))).await;
        let dropped = format!("DROP TABLE {table}");
        sqlx::query(sqlx::AssertSqlSafe(dropped))
            .execute(&mut c)
            .await
            .unwrap();
        let e = e.err().unwrap_or_else(|| panic!("{table}: connected"));
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{table}: {e}");
        assert!(e.to_string().contains(says), "{table}: {e}");
        assert!(e.to_string().contains("not a lock table"), "{table}: {e}");
    }
    // A view over the lock table is one: the server writes through it.
    exec(&mut c, "DROP VIEW IF EXISTS lockcore_view").await;
    exec(
        &mut c,
        "CREATE VIEW lockcore_view AS SELECT * FROM lockcore_locks",
    )
    .await;
    let ctx2 = ctx.clone();
    let used = tokio::spawn(async move {
        let l = lockcore_postgres::connect(&with(&ctx2.config, "table=lockcore_view")).await?;
        let g = l.try_lock(&ctx2.name("view")).await?.expect("free");
        g.release().await
    })
    .await;
    exec(&mut c, "DROP VIEW lockcore_view").await;
    match used {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("a view over the lock table: {e}"),
        Err(e) => panic!("a view over the lock table: {e}"),
    }
    let mut cfg = lockcore_postgres::PostgresConfig::parse(&ctx.config).unwrap();
    cfg.table = "lockcore_locks; SELECT 1".into();
    let e = lockcore_postgres::PostgresBackend::connect(cfg).await;
    let e = e.expect_err("a table name that is not one");
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e}");
}

fn main() -> std::process::ExitCode {
    run_serial(vec![own_cases!(
        harness::target("postgres-roles").only_own_cases(),
        a_roles_timeouts_do_not_cut_a_wait,
        a_user_without_create_connects_to_an_existing_table,
        a_table_named_by_a_keyword_is_that_table,
        a_search_path_with_no_schema_is_named,
        connecting_checks_the_table_and_the_users_rights,
    )])
}
