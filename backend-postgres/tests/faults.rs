//! PostgreSQL-specific cases (server from compose/): a raw advisory-lock
//! client and ours exclude each other, a server killed and restarted under
//! a holder, a holder's session terminated, a stalled holder timed out by
//! the server, a dropped wait ended on the server, and the soak.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Wait};
use lockcore_conformance::own_cases;
use lockcore_conformance::scenarios::rw_beside_a_foreign_hold;
use lockcore_conformance::{
    compose, run_serial, soak_pausing, ConnectFuture, Ctx, Target, UndoOnDrop, UrlHarness,
    COMPOSE_HINT,
};
use sqlx::Connection;

use harness::LOCKS_OF;

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_postgres::connect(&url).await })
}

async fn admin(ctx: &Ctx) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(ctx.config.split('?').next().unwrap())
        .await
        .expect("admin connection")
}

/// Sessions waiting for `name`'s advisory lock.
async fn waiting_sessions(c: &mut sqlx::PgConnection, name: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) {LOCKS_OF} AND NOT l.granted"
    )))
    .bind(name)
    .fetch_one(c)
    .await
    .expect("pg_locks")
}

/// A client of plain SQL (`pg_advisory_lock(hashtextextended(name, 0))`,
/// as `psql` would) and a client of ours exclude each other, both ways,
/// and `inspect` shows the plain client as a holder without an owner.
async fn a_raw_advisory_lock_and_ours_exclude_each_other(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("raw/shared");
    let mut raw = admin(&ctx).await;
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(&name)
        .execute(&mut raw)
        .await
        .unwrap();
    assert!(
        l.try_lock(&name).await.unwrap().is_none(),
        "taken beside a raw holder"
    );
    let info = l.inspect(&name).await.unwrap().expect("held");
    let holder = info.holder.expect("a holder");
    assert_eq!(
        (holder.owner, holder.fence),
        (None, None),
        "a raw holder has no owner of ours"
    );
    // Our waiter queues behind the raw holder and gets the name when it
    // lets go.
    let waiter = {
        let (l, name) = (l.clone(), name.clone());
        tokio::spawn(async move { l.lock_timeout(&name, Duration::from_secs(20)).await })
    };
    let mut look = admin(&ctx).await;
    let t = Instant::now();
    while waiting_sessions(&mut look, &name).await < 1 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "our waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
        .bind(&name)
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert!(unlocked);
    let g = waiter
        .await
        .unwrap()
        .expect("granted after the raw holder let go");
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(&name)
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert!(!got, "a raw client took the name beside our holder");
    g.release().await.unwrap();
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(&name)
        .fetch_one(&mut raw)
        .await
        .unwrap();
    assert!(got, "the name is free for a raw client after our release");
}

/// A plain SQL session's shared and exclusive advisory locks on
/// `hashtextextended(name, 1)` are a read-write lock's reader and writer:
/// our reader shares with the first, and neither of ours gets in beside
/// the second; `inspect` shows each.
async fn shared_and_exclusive_locks_from_sql_are_readers_and_writers(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("rw-sql");
    let rw = lockcore::RwLock::new(&l, &name).expect("rwlock");
    for (f, reads_beside) in [
        ("pg_advisory_lock_shared", true),
        ("pg_advisory_lock", false),
    ] {
        let mut sql = admin(&ctx).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {f}(hashtextextended($1, 1))"
        )))
        .bind(&name)
        .execute(&mut sql)
        .await
        .unwrap();
        rw_beside_a_foreign_hold(&rw, reads_beside, f).await;
        let h = l.holdings(&name).await.unwrap();
        assert_eq!(h.readers.len(), usize::from(reads_beside), "{f}: {h:?}");
        assert_eq!(h.writer.is_some(), !reads_beside, "{f}: {h:?}");
        drop(sql);
        let wait = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
        let w = rw
            .write(&wait)
            .await
            .unwrap()
            .expect("free once the SQL session ended");
        w.release().await.unwrap();
    }
    // And ours is a reader and a writer to plain SQL.
    let r = rw.try_read().await.unwrap().expect("free");
    let mut sql = admin(&ctx).await;
    let try_x = |f: &'static str| format!("SELECT {f}(hashtextextended($1, 1))");
    let got: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(try_x("pg_try_advisory_lock")))
        .bind(&name)
        .fetch_one(&mut sql)
        .await
        .unwrap();
    assert!(!got, "a plain writer beside our reader");
    r.release().await.unwrap();
}

/// The server killed (every session process) and started again under a
/// holder: lost fires, the name is free once the server is back, and the
/// next token is larger (the counter was committed before it was handed
/// out).
async fn restart_under_a_holder(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("restart/held");
    let g = l
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(3))
                .wait(Wait::Try),
        )
        .await
        .unwrap()
        .expect("free");
    let before = g.fence().expect("a token");
    let _start = UndoOnDrop::new("start", &["postgres"]);
    compose("kill", "postgres").await;
    let killed = Instant::now();
    compose("start", "postgres").await;
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost fires after the restart");
    let lost_after = killed.elapsed();
    let g2 = l
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("the name is free after the restart");
    let after = g2.fence().expect("a token");
    assert!(
        after > before,
        "the token fell across a restart: {before} then {after}"
    );
    println!(
        "FIGURES restart postgres: lost_after_kill={}ms, first_lock_after_kill={}ms, next_token_larger=true",
        lost_after.as_millis(),
        killed.elapsed().as_millis()
    );
    g2.release().await.unwrap();
}

/// A holder that stops renewing (its process stalled, its connection still
/// open) loses the name within its ttl: the server ends its idle session.
async fn stalled_holder_is_timed_out_by_server(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("stalled");
    let ttl = Duration::from_secs(2);
    let g = a
        .acquire(
            &name,
            &LockOptions::new().ttl(ttl).wait(Wait::Try).renew(false),
        )
        .await
        .unwrap()
        .expect("free");
    let t = Instant::now();
    let g2 = b
        .lock_timeout(&name, ttl + Duration::from_secs(6))
        .await
        .expect("the server ends the stalled session");
    let after = t.elapsed();
    assert!(
        after >= ttl - Duration::from_millis(300),
        "freed after {after:?}"
    );
    assert!(g2.fence() > g.fence());
    let err = g.release().await.expect_err("the stalled lease is gone");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    g2.release().await.unwrap();
}

/// A wait dropped while it is queued on the server is ended there (its
/// session is terminated), not only its socket closed: the queue is empty
/// again within a second, and the holder's release hands the name to no
/// one.
async fn a_dropped_wait_leaves_the_servers_queue(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("dropped-wait");
    let g = a.try_lock(&name).await.unwrap().expect("free");
    let mut look = admin(&ctx).await;
    let waiting = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.lock(&name).await })
    };
    let t = Instant::now();
    while waiting_sessions(&mut look, &name).await < 1 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waiting.abort();
    let _ = waiting.await;
    let dropped = Instant::now();
    while waiting_sessions(&mut look, &name).await > 0 {
        assert!(
            dropped.elapsed() < Duration::from_secs(1),
            "the dropped wait is still queued on the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    g.release().await.unwrap();
    let again = a.try_lock(&name).await.unwrap();
    assert!(again.is_some(), "the name went to the dropped waiter");
}

/// A holder's session terminated by an operator: the guard learns it is
/// lost, and the next holder's token is larger.
async fn a_terminated_session_is_lost(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("terminated");
    let g = l
        .acquire(
            &name,
            &LockOptions::new()
                .ttl(Duration::from_secs(3))
                .wait(Wait::Try),
        )
        .await
        .unwrap()
        .expect("free");
    let mut c = admin(&ctx).await;
    let ended: Vec<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT pg_terminate_backend(l.pid) {LOCKS_OF} AND l.granted"
    )))
    .bind(&name)
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(ended, vec![true]);
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost fires within a renewal");
    let g2 = l.try_lock(&name).await.unwrap().expect("free");
    assert!(g2.fence() > g.fence());
    g2.release().await.unwrap();
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        harness::target("postgres-soak")
            .only_own_cases()
            .case("soak", |ctx| Box::pin(soak_pausing(ctx, "postgres"))),
        own_cases!(
            Target::new(
                "postgres-faults",
                Some("LOCKTEST_POSTGRES_URL"),
                |url| async move {
                    // Creates the table if needed.
                    drop(lockcore_postgres::connect(&url).await?);
                    Ok(UrlHarness::shared(url, connect))
                }
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            a_raw_advisory_lock_and_ours_exclude_each_other,
            shared_and_exclusive_locks_from_sql_are_readers_and_writers,
            restart_under_a_holder,
            stalled_holder_is_timed_out_by_server,
            a_dropped_wait_leaves_the_servers_queue,
            a_terminated_session_is_lost,
        ),
    ])
}
