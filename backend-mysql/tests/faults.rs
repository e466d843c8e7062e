//! MySQL-specific cases (server from compose/): a holder's connection killed
//! on the server (and only the holder's), byte-exact names, `fencing=none`,
//! a busy pool, a dropped guard, and a stalled holder timed out by the
//! server.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{ErrorKind, LockOptions, Wait};
use lockcore_conformance::own_cases;
use lockcore_conformance::scenarios::rw_beside_a_foreign_hold;
use lockcore_conformance::{
    compose, run_serial, soak_pausing, ConnectFuture, Ctx, Target, UndoOnDrop, UrlHarness,
    COMPOSE_HINT,
};
use lockcore_mysql::{MysqlBackend, MysqlConfig};
use sqlx::{Connection, Row};

fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_mysql::connect(&url).await })
}

fn with_opts(ctx: &Ctx, opts: &str) -> String {
    let sep = if ctx.config.contains('?') { '&' } else { '?' };
    format!("{}{sep}{opts}", ctx.config)
}

async fn admin(ctx: &Ctx) -> sqlx::MySqlConnection {
    sqlx::MySqlConnection::connect(&ctx.config)
        .await
        .expect("admin connection")
}

/// Waits until the server shows at least `n` lock waits (`FOR UPDATE`
/// statements in `PROCESSLIST`); fails with `why()` after 10 s.
async fn until_lock_waits(sql: &mut sqlx::MySqlConnection, n: i64, why: impl Fn() -> String) {
    let t = Instant::now();
    loop {
        let waits: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%FOR UPDATE'",
        )
        .fetch_one(&mut *sql)
        .await
        .expect("lock waits");
        if waits >= n {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{}", why());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `name`, free, taken by a try on `l` with `ttl`.
async fn try_with_ttl(l: &lockcore::Locker, name: &str, ttl: Duration) -> lockcore::LockGuard {
    l.acquire(name, &LockOptions::new().ttl(ttl).wait(Wait::Try))
        .await
        .expect("acquire")
        .expect("free")
}

/// Takes and releases `name` once: its counter row exists from then on,
/// so that the next holder's token is set in its transaction, uncommitted
/// (the first use commits the row on its own).
async fn use_once(l: &lockcore::Locker, name: &str) {
    l.try_lock(name)
        .await
        .expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");
}

/// `KILL <id>` of the holder's session from another connection: the waiter
/// gets the row with a larger fencing token (the holder's, set in its
/// transaction, was rolled back), and the old guard's lost signal
/// fires; its release reports `Lost`.
async fn kill_holder_connection(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let backend = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .unwrap();
    let name = ctx.name("killed");
    let ttl = Duration::from_secs(3);
    use_once(&a, &name).await;
    let g = try_with_ttl(&a, &name, ttl).await;
    let old_fence = g.fence().expect("fence");
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let g = b.lock(&name).await.expect("the waiter acquires");
            (Instant::now(), g)
        })
    };
    // The waiter is queued on the row lock (nothing to await from here).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held row");
    let id = backend
        .holder_connection(&name)
        .await
        .expect("holder")
        .expect("a holder is recorded");
    let mut admin = admin(&ctx).await;
    let killed_at = Instant::now();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&mut admin)
        .await
        .expect("KILL");
    let (got_at, g2) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the row soon after the KILL")
        .expect("waiter task");
    assert!(
        got_at.duration_since(killed_at) < Duration::from_secs(2),
        "handed over {:?} after the KILL",
        got_at.duration_since(killed_at)
    );
    let new_fence = g2.fence().expect("fence");
    assert!(new_fence > old_fence, "token {new_fence} after {old_fence}");
    tokio::time::timeout(ttl + Duration::from_secs(3), g.lost())
        .await
        .expect("the killed holder's lost signal fires");
    assert!(!g.is_held());
    let err = g.release().await.expect_err("release of a killed lease");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let third = ctx.locker().await;
    assert!(
        third.try_lock(&name).await.expect("try").is_none(),
        "the old holder's release freed the new holder"
    );
    g2.release().await.expect("release");
}

/// A leader whose session is killed on the server hands over to the
/// candidate waiting behind it, round after round: the server rolls the
/// dead session back (freeing the row) before it frees its user lock, so
/// the successor must wait that moment out rather than fail. Each round the
/// server names the successor with its value and term, and the row is held
/// (a third client's try).
async fn killed_leader_hands_over_with_its_value(ctx: Ctx) {
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let name = ctx.name("elect-killed");
    let backend = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .unwrap();
    let mut sql = admin(&ctx).await;
    let ea = lockcore::Election::new(&a, &name).expect("election");
    // An observer asks all along: whoever it is told leads is a candidate
    // with its value and a term, never a holder without one.
    let stop = tokio_util::sync::CancellationToken::new();
    let observer = {
        let (e, stop) = (ea.clone(), stop.clone());
        tokio::spawn(async move {
            let mut asked = 0u32;
            while !stop.is_cancelled() {
                let seen = e.leader().await.expect("leader");
                if let Some(l) = seen {
                    assert!(
                        l.term.is_some() && (l.value == "first" || l.value.starts_with("round-")),
                        "an observer was told of {l:?}"
                    );
                }
                asked += 1;
            }
            asked
        })
    };
    let mut leading = ea
        .try_campaign("first")
        .await
        .expect("campaign")
        .expect("no one leads");
    let mut killed = Vec::new();
    for round in 0..8 {
        let eb = lockcore::Election::new(&b, &name).expect("election");
        let value = format!("round-{round}");
        let next = {
            let value = value.clone();
            tokio::spawn(async move { eb.campaign(&value).await })
        };
        // The candidate waits on the row.
        until_lock_waits(&mut sql, 1, || format!("round {round}: no wait")).await;
        let id = backend
            .holder_connection(&name)
            .await
            .expect("holder")
            .expect("the leader is recorded");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
            .execute(&mut sql)
            .await
            .expect("KILL");
        let next = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the candidate leads soon after the KILL")
            .expect("candidate task")
            .unwrap_or_else(|e| panic!("round {round}: the candidate failed: {e}"));
        let seen = ea.leader().await.expect("leader").expect("a leader");
        assert_eq!(seen.value, value, "round {round}");
        assert_eq!(seen.term, next.term(), "round {round}");
        assert!(
            next.term() > leading.term(),
            "round {round}: term {:?} after {:?}",
            next.term(),
            leading.term()
        );
        assert!(
            c.try_lock(&name).await.expect("try").is_none(),
            "round {round}: the leader's row is free"
        );
        // The next round kills this one.
        killed.push(std::mem::replace(&mut leading, next));
    }
    stop.cancel();
    let asked = observer.await.expect("observer");
    assert!(asked > 0);
    // Every killed leader learns it is lost.
    let lost = futures_util::future::join_all(killed.iter().map(|l| l.lost()));
    tokio::time::timeout(Duration::from_secs(30), lost)
        .await
        .expect("every killed leader's lost signal fires");
    leading.resign().await.expect("resign");
    assert_eq!(ea.leader().await.expect("leader"), None);
}

/// The name of `name`'s user lock, as the backend names it (the database
/// of `ctx`'s URL, the default table).
async fn user_lock_of(sql: &mut sqlx::MySqlConnection, name: &str) -> String {
    sqlx::query_scalar(
        "SELECT CONCAT('lockcore:', LEFT(SHA2(CONCAT(CAST(DATABASE() AS BINARY), 0x00, CAST('lockcore_locks' AS BINARY), 0x00, CAST(? AS BINARY)), 256), 55))",
    )
    .bind(name.as_bytes())
    .fetch_one(sql)
    .await
    .expect("user lock name")
}

/// A session that takes a name's user lock itself (any account can:
/// `GET_LOCK` needs no privilege) cannot keep anyone from the lock: a try
/// is granted (after a second) and a wait on a held name is handed the row; only
/// inspection is blind then, and says so with an error, not a leader it
/// cannot name; once the squatter lets go, the holder publishes itself at
/// its next renewal.
async fn a_squatted_user_lock_blocks_no_lock(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("squatted");
    let mut squatter = admin(&ctx).await;
    let key = user_lock_of(&mut squatter, &name).await;
    let got: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&key)
        .fetch_one(&mut squatter)
        .await
        .expect("GET_LOCK");
    assert_eq!(got, 1, "the squatter holds {key}");
    let t = Instant::now();
    let g = a
        .try_lock(&name)
        .await
        .expect("a try beside a squatter")
        .expect("the name is free");
    // It gives the user lock a second (a dead holder's session ends in a
    // moment), then holds the name unpublished.
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the try took {:?}",
        t.elapsed()
    );
    assert!(
        b.try_lock(&name).await.expect("try").is_none(),
        "two holders"
    );
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        // A short ttl: renewals come every second or so.
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(3))
            .wait(Wait::For(Duration::from_secs(20)));
        tokio::spawn(async move { b.acquire(&name, &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.release().await.expect("release");
    let g = waiter
        .await
        .expect("waiter")
        .expect("the waiter is handed the row beside a squatter")
        .expect("not a try");
    assert!(
        a.try_lock(&name).await.expect("try").is_none(),
        "two holders"
    );
    let err = a
        .inspect(&name)
        .await
        .expect_err("inspection cannot name the holder beside a squatter");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    // The squatter lets go: the holder publishes itself at a renewal, and
    // inspection names it again (not "free" for the rest of its term).
    let fence = g.fence();
    let () = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(&key)
        .fetch_one(&mut squatter)
        .await
        .map(|_: i64| ())
        .expect("RELEASE_LOCK");
    let t = Instant::now();
    loop {
        let info = a.inspect(&name).await.expect("inspect").expect("inspects");
        if let Some(h) = info.holder {
            assert_eq!(h.fence, fence, "inspect names another holder");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "a held name shown free after the squatter left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    g.release().await.expect("release");
}

/// A deployment whose tables predate leaders' values (`ensure_schema=false`,
/// no `<table>_value`): locks and inspection work, and an election is
/// refused as unsupported instead of failing on the server.
async fn tables_without_values_still_inspect(ctx: Ctx) {
    let table = format!("lc_noval_{}", std::process::id());
    let mut sql = admin(&ctx).await;
    for ddl in &lockcore_mysql::schema_sql(&table).expect("ddl")[..2] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.clone()))
            .execute(&mut sql)
            .await
            .expect("create");
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS `{table}_value`"
    )))
    .execute(&mut sql)
    .await
    .expect("drop");
    let l = lockcore_mysql::connect(&with_opts(
        &ctx,
        &format!("table={table}&ensure_schema=false"),
    ))
    .await
    .expect("connect");
    let name = ctx.name("noval");
    let g = l.try_lock(&name).await.expect("try").expect("free");
    let info = l
        .inspect(&name)
        .await
        .expect("inspect without a value table")
        .expect("the backend inspects");
    assert_eq!(info.holder.and_then(|h| h.fence), g.fence());
    g.release().await.expect("release");
    let err = lockcore::Election::new(&l, &name).expect_err("no election without values");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    // Nor a lock-delay without its table.
    assert_eq!(
        l.capabilities().lock_delay,
        lockcore::LockDelay::Unsupported
    );
    let err = l
        .acquire(
            &name,
            &LockOptions::new()
                .lock_delay(Duration::from_secs(5))
                .wait(Wait::Try),
        )
        .await
        .expect_err("no lock-delay without its table");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    for t in [table.clone(), format!("{table}_fence")] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE `{t}`")))
            .execute(&mut sql)
            .await
            .expect("drop");
    }
}

/// Names are byte-exact: case, trailing spaces and emoji make different
/// locks and different rows.
async fn names_are_byte_exact(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let base = ctx.name("exact");
    let pairs = [
        (format!("{base}/Name"), format!("{base}/name")),
        (format!("{base}/x"), format!("{base}/x ")),
        (format!("{base}/x "), format!("{base}/x  ")),
        (format!("{base}/e\u{301}"), format!("{base}/\u{e9}")),
        (format!("{base}/🦀"), format!("{base}/🦞")),
    ];
    for (one, other) in &pairs {
        let g1 = a.try_lock(one).await.expect("try").expect("free");
        let g2 = b
            .try_lock(other)
            .await
            .expect("try")
            .unwrap_or_else(|| panic!("{other:?} was held by a holder of {one:?}"));
        assert!(b.try_lock(one).await.expect("try").is_none());
        assert!(a.clone().try_lock(other).await.expect("try").is_none());
        g1.release().await.expect("release");
        g2.release().await.expect("release");
    }
    let mut admin = admin(&ctx).await;
    let rows: i64 = sqlx::query("SELECT COUNT(*) FROM lockcore_locks WHERE name IN (?, ?, ?, ?)")
        .bind(pairs[0].0.as_bytes())
        .bind(pairs[0].1.as_bytes())
        .bind(pairs[1].1.as_bytes())
        .bind(pairs[2].1.as_bytes())
        .fetch_one(&mut admin)
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 4, "one row per distinct name");
}

/// A holder of a lock's row that has not published itself (a plain SQL
/// session holding the row, as our holder does between its locking read
/// and its `GET_LOCK`) holds the name: `inspect` shows it held with no
/// owner, never free; once the row is let go, free again.
async fn a_row_held_unpublished_is_held(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("unpublished");
    // The row exists once the lock has been taken.
    l.try_lock(&name)
        .await
        .expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");
    let mut sql = admin(&ctx).await;
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut sql)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM lockcore_locks WHERE name = ? FOR UPDATE")
        .bind(name.as_bytes())
        .fetch_optional(&mut sql)
        .await
        .expect("lock the row")
        .expect("the row");
    let info = l.inspect(&name).await.expect("inspect").expect("inspects");
    let holder = info.holder.expect("a held row shown free");
    assert_eq!(holder.owner, None, "{holder:?}");
    assert!(
        l.try_lock(&name).await.expect("try").is_none(),
        "two holders"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut sql)
        .await
        .expect("rollback");
    let info = l.inspect(&name).await.expect("inspect").expect("inspects");
    assert!(info.holder.is_none(), "a free row shown held: {info:?}");
}

/// A read-write lock's row, locked from plain SQL on the server: a
/// session holding it `LOCK IN SHARE MODE` reads beside our readers and
/// keeps our writer out; one holding it `FOR UPDATE` keeps our readers out.
/// The row is the name and `\x01rw`, beside the lock's own row.
async fn share_and_update_locks_from_sql_are_readers_and_writers(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("rw-sql");
    let rw = lockcore::RwLock::new(&l, &name).expect("rwlock");
    let row = format!("{name}\u{1}rw");
    // The row exists once our writer has taken the lock.
    let w = rw.try_write().await.expect("try").expect("free");
    w.release().await.expect("release");
    for (clause, reads_beside) in [("LOCK IN SHARE MODE", true), ("FOR UPDATE", false)] {
        let mut sql = admin(&ctx).await;
        sqlx::raw_sql("START TRANSACTION")
            .execute(&mut sql)
            .await
            .expect("begin");
        let locked = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM lockcore_locks WHERE name = ? {clause}"
        )))
        .bind(row.as_bytes())
        .fetch_optional(&mut sql)
        .await
        .expect("lock the row");
        assert!(locked.is_some(), "no row {row:?}");
        rw_beside_a_foreign_hold(&rw, reads_beside, &format!("SQL's {clause}")).await;
        sqlx::raw_sql("COMMIT")
            .execute(&mut sql)
            .await
            .expect("commit");
        let w = rw
            .try_write()
            .await
            .expect("try")
            .expect("free once SQL committed");
        w.release().await.expect("release");
    }
}

/// A plain SQL session that locks a semaphore's slot rows `FOR UPDATE`
/// holds those permits: with both slots of a 2-permit semaphore locked from
/// SQL, our client gets none, and it gets one once SQL commits. A row beyond
/// a client's count, held, makes its full semaphore a mismatch.
async fn slot_rows_locked_from_sql_are_permits(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("sem-sql");
    let sem = lockcore::Semaphore::new(&l, &name, 2).expect("semaphore");
    // The slot rows exist once our client has taken a permit.
    let p = sem.try_acquire().await.expect("try").expect("free");
    p.release().await.expect("release");
    let slot = |i: u32| format!("{name}\u{1}sem\u{1}{i:04}");
    let mut sql = admin(&ctx).await;
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut sql)
        .await
        .expect("begin");
    for i in 0..2 {
        let locked = sqlx::query("SELECT 1 FROM lockcore_locks WHERE name = ? FOR UPDATE")
            .bind(slot(i).as_bytes())
            .fetch_optional(&mut sql)
            .await
            .expect("lock a slot row");
        assert!(locked.is_some(), "no row {:?}", slot(i));
    }
    assert!(
        sem.try_acquire().await.expect("try").is_none(),
        "a permit beside SQL's two"
    );
    let one = lockcore::Semaphore::new(&l, &name, 1).expect("semaphore");
    let e = one.try_acquire().await.expect_err("a mismatched count");
    assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig, "{e}");
    sqlx::raw_sql("COMMIT")
        .execute(&mut sql)
        .await
        .expect("commit");
    let p = sem
        .try_acquire()
        .await
        .expect("try")
        .expect("free once SQL committed");
    p.release().await.expect("release");
}

/// A backend asked directly for a permit of a semaphore with 0 or too many
/// permits says so: an error, not a panic or a permit.
async fn permit_counts_out_of_range_are_refused(ctx: Ctx) {
    use lockcore::raw::prelude::{AcquireRequest, Backend, CancellationToken, Deadline};
    let b = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .expect("connect");
    let name = ctx.name("sem-range");
    let lost = CancellationToken::new();
    for permits in [0, lockcore::semaphore::MAX_PERMITS + 1] {
        let got = b
            .acquire(AcquireRequest {
                name: &name,
                owner: lockcore::raw::OwnerToken::random(),
                ttl: Duration::from_secs(10),
                lock_delay: Duration::ZERO,
                deadline: Deadline::Now,
                lost: &lost,
                value: None,
                mode: lockcore::raw::Mode::Permit { permits },
                renew: true,
            })
            .await;
        let e = got.map(|g| g.is_some()).expect_err("a count out of range");
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{permits}: {e}");
    }
}

/// Slot rows left by a client that once counted more are not a mismatch:
/// clients that all count 4 and find the semaphore full at the same moment
/// each time out, none is told the counts disagree (each one's look at
/// the rows beyond its count must not take another's look for a holder).
async fn equal_counts_beside_old_rows_are_no_mismatch(ctx: Ctx) {
    const WAITERS: usize = 16;
    let l = ctx.locker().await;
    let name = ctx.name("sem-old-rows");
    let eight = lockcore::Semaphore::new(&l, &name, 8).expect("semaphore");
    let mut once = Vec::new();
    for _ in 0..8 {
        once.push(eight.try_acquire().await.expect("try").expect("free"));
    }
    for p in once {
        p.release().await.expect("release");
    }
    let four = lockcore::Semaphore::new(&l, &name, 4).expect("semaphore");
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(four.try_acquire().await.expect("try").expect("free"));
    }
    let start = Arc::new(tokio::sync::Barrier::new(WAITERS));
    let mut waits = Vec::new();
    for _ in 0..WAITERS {
        let (sem, start) = (four.clone(), start.clone());
        waits.push(tokio::spawn(async move {
            start.wait().await;
            sem.acquire_timeout(Duration::from_secs(2)).await.map(drop)
        }));
    }
    for w in waits {
        let e = w.await.expect("task").expect_err("no permit is free");
        assert_eq!(e.kind(), lockcore::ErrorKind::Timeout, "{e}");
    }
    for p in held {
        p.release().await.expect("release");
    }
}

/// A semaphore with more slots than a waiter waits on at once: with every
/// permit held, a waiter still gets the one permit freed, whichever it is,
/// within a few seconds (it looks at every slot again each second), and
/// the server then shows the semaphore full again.
async fn wide_semaphore_waiter_gets_any_freed_permit(ctx: Ctx) {
    const N: u32 = 12;
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let name = ctx.name("sem-wide");
    let sa = lockcore::Semaphore::new(&a, &name, N).expect("semaphore");
    let mut held = Vec::new();
    for _ in 0..N {
        held.push(sa.try_acquire().await.expect("try").expect("free"));
    }
    for round in 0..3 {
        let sb = lockcore::Semaphore::new(&b, &name, N).expect("semaphore");
        let waiter = tokio::spawn(async move {
            let p = sb.acquire_timeout(Duration::from_secs(30)).await;
            (p, Instant::now())
        });
        // The waiter is waiting on the server: 8 lock waits (as many slots
        // as it waits on at once), one of which may be the freed one.
        let mut sql = admin(&ctx).await;
        until_lock_waits(&mut sql, 8, || {
            format!(
                "no 8 lock waits (waiter finished: {})",
                waiter.is_finished()
            )
        })
        .await;
        // A different permit each round: the first, the middle, the last.
        let freed = held.remove([0, held.len() / 2, held.len() - 1][round]);
        let released = Instant::now();
        freed.release().await.expect("release");
        let (p, got) = waiter.await.expect("waiter");
        let p = p.expect("the freed permit");
        let took = got.duration_since(released);
        assert!(took < Duration::from_secs(5), "round {round}: {took:?}");
        let sc = lockcore::Semaphore::new(&c, &name, N).expect("semaphore");
        assert!(
            sc.try_acquire().await.expect("try").is_none(),
            "round {round}: a permit beyond {N}"
        );
        held.push(p);
    }
    for p in held {
        p.release().await.expect("release");
    }
}

/// With every pooled connection busy (held locks, waiters), the client
/// still takes a free name at once and waits on a held one: a lock that
/// finds no idle pooled connection opens one of its own. The server shows
/// each name held (another client's try) and hands a released one over.
async fn busy_pool_opens_its_own_connections(ctx: Ctx) {
    let l = lockcore_mysql::connect(&with_opts(&ctx, "pool_size=2&ensure_schema=false"))
        .await
        .expect("connect");
    let other = ctx.locker().await;
    let name = |i: u32| ctx.name(&format!("pool/{i}"));
    let g1 = l.try_lock(&name(1)).await.expect("try").expect("free");
    let g2 = l.try_lock(&name(2)).await.expect("try").expect("free");
    let t = Instant::now();
    let g3 = l
        .try_lock(&name(3))
        .await
        .expect("a try with the pool busy")
        .expect("free");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "try took {:?}",
        t.elapsed()
    );
    for i in 1..=3 {
        assert!(
            other.try_lock(&name(i)).await.expect("try").is_none(),
            "{} is not held on the server",
            name(i)
        );
    }
    let waiter = {
        let (l, n) = (l.clone(), name(1));
        tokio::spawn(async move {
            let g = l
                .lock_timeout(&n, Duration::from_secs(20))
                .await
                .expect("waiter");
            let at = Instant::now();
            g.release().await.expect("release");
            at
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "acquired a held name");
    let released = Instant::now();
    g1.release().await.expect("release");
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the released name")
        .expect("waiter task");
    assert!(got.duration_since(released) < Duration::from_secs(2));
    g2.release().await.expect("release");
    g3.release().await.expect("release");
}

/// `kill_holder` ends the session that holds *this* name, never a session
/// that held it once: a pooled connection that released the name and now
/// holds another is left alone (the server still refuses that other name).
async fn kill_holder_spares_a_reused_connection(ctx: Ctx) {
    let l = lockcore_mysql::connect(&with_opts(&ctx, "pool_size=1&ensure_schema=false"))
        .await
        .expect("connect");
    let other = ctx.locker().await;
    let admin = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .unwrap();
    let (x, y) = (ctx.name("reused/x"), ctx.name("reused/y"));
    let gx = l.try_lock(&x).await.expect("try").expect("free");
    let conn = admin
        .holder_connection(&x)
        .await
        .expect("holder_connection")
        .expect("x is held");
    gx.release().await.expect("release");
    // Take `y` until it lands on the connection that held `x` (the pool
    // takes it back in the background).
    let mut tries = 0;
    let gy = loop {
        let g = l.try_lock(&y).await.expect("try").expect("free");
        if admin
            .holder_connection(&y)
            .await
            .expect("holder_connection")
            == Some(conn)
        {
            break g;
        }
        g.release().await.expect("release");
        tries += 1;
        assert!(tries < 100, "the pool never gave the connection back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed = admin.kill_holder(&x).await.expect("kill_holder");
    assert!(!killed, "kill_holder found a holder of a free name");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        other.try_lock(&y).await.expect("try").is_none(),
        "kill_holder of a free name ended the session holding another name"
    );
    gy.extend(Duration::from_secs(30))
        .await
        .expect("the other name's holder still renews");
    gy.release().await.expect("release");
}

/// The recorded holder of a name that now *waits* for it (another session
/// took the row without recording itself): `kill_holder` finds no holder to
/// kill and leaves the waiter alone.
async fn kill_holder_never_kills_a_waiter(ctx: Ctx) {
    let l = lockcore_mysql::connect(&with_opts(&ctx, "pool_size=1&ensure_schema=false"))
        .await
        .expect("connect");
    let backend = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .unwrap();
    let name = ctx.name("waiter-recorded");
    let g = l.try_lock(&name).await.expect("try").expect("free");
    let recorded = backend
        .holder_connection(&name)
        .await
        .expect("holder_connection")
        .expect("held");
    g.release().await.expect("release");
    // Another session takes the row without recording itself.
    let mut raw = admin(&ctx).await;
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut raw)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM lockcore_locks WHERE name = ? FOR UPDATE")
        .bind(name.as_bytes())
        .fetch_optional(&mut raw)
        .await
        .unwrap();
    // The recorded connection waits for the row (the pool gives it back
    // in the background: try until the waiting session is that one).
    let mut tries = 0;
    let waiter = loop {
        let w = {
            let (l, n) = (l.clone(), name.clone());
            tokio::spawn(async move { l.lock(&n).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let waiting: Vec<u64> = sqlx::query(
            "SELECT CAST(trx_mysql_thread_id AS UNSIGNED) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'",
        )
        .fetch_all(&mut admin(&ctx).await)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
        if waiting.contains(&recorded) {
            break w;
        }
        w.abort();
        tries += 1;
        assert!(tries < 30, "the recorded connection never waited");
    };
    let killed = backend.kill_holder(&name).await.expect("kill_holder");
    assert!(
        !killed,
        "kill_holder killed the recorded session, which only waits"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter was ended");
    sqlx::raw_sql("ROLLBACK").execute(&mut raw).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the row")
        .expect("task")
        .expect("the waiter acquires");
}

/// The server restarts while the client keeps idle pooled connections: the
/// next lock does not fail on a dead one.
async fn first_lock_after_a_server_restart(ctx: Ctx) {
    let l = lockcore_mysql::connect(&with_opts(&ctx, "pool_size=4&ensure_schema=false"))
        .await
        .expect("connect");
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(
            l.try_lock(&ctx.name(&format!("restart/{i}")))
                .await
                .unwrap()
                .unwrap(),
        );
    }
    for g in guards {
        g.release().await.unwrap();
    }
    let _start = UndoOnDrop::new("start", &["mariadb"]);
    compose("kill", "mariadb").await;
    compose("start", "mariadb").await;
    let g = l
        .lock_timeout(&ctx.name("restart/after"), Duration::from_secs(10))
        .await
        .expect("the first lock after a restart");
    g.release().await.unwrap();
}

/// The server restarted under a holder: its lost signal fires (its
/// connection, and so its transaction, is gone), and the next holder's
/// token is larger (the holder's token, set in its transaction, rolled
/// back with it: the successor's comes from the clock, later).
async fn restart_under_a_holder(ctx: Ctx) {
    let l = ctx.locker().await;
    let name = ctx.name("restart/held");
    use_once(&l, &name).await;
    let g = try_with_ttl(&l, &name, Duration::from_secs(3)).await;
    let before = g.fence().expect("a token");
    let _start = UndoOnDrop::new("start", &["mariadb"]);
    compose("kill", "mariadb").await;
    let killed = Instant::now();
    compose("start", "mariadb").await;
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost fires after the restart");
    let lost_after = killed.elapsed();
    let g2 = l
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("the name is free after the restart");
    let resumed = killed.elapsed();
    let after = g2.fence().expect("a token");
    assert!(
        after > before,
        "the token fell across a restart: {before} then {after}"
    );
    println!(
        "FIGURES restart mysql: lost_after_kill={}ms, first_lock_after_kill={}ms, next_token_larger=true",
        lost_after.as_millis(),
        resumed.as_millis()
    );
    g2.release().await.expect("release");
}

/// A guard dropped without `release()` frees the row within a bound, not
/// whenever a pool gets round to a queued rollback.
async fn dropped_guard_frees_row_promptly(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("dropped");
    for _ in 0..5 {
        let g = a.try_lock(&name).await.expect("try").expect("free");
        let t = Instant::now();
        drop(g);
        let g = b
            .lock_timeout(&name, Duration::from_secs(5))
            .await
            .expect("the dropped guard's row is freed");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "freed {:?} after the drop",
            t.elapsed()
        );
        g.release().await.expect("release");
    }
}

/// Panics anywhere in this process since the hook was installed.
static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A renewal cut off at the validity deadline (the server paused) leaves
/// its reply unread on the holding connection. The release that follows
/// must not read it as its own (the driver misreads it and panics): it
/// closes that connection and ends its session instead, and the name is
/// free once the server is back.
async fn release_after_a_cut_off_renewal(ctx: Ctx) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        previous(info);
    }));
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("cut-renewal");
    let g = try_with_ttl(&a, &name, Duration::from_secs(3)).await;
    {
        let _resume = UndoOnDrop::new("resume", &["mariadb"]);
        compose("pause", "mariadb").await;
        tokio::time::timeout(Duration::from_secs(10), g.lost())
            .await
            .expect("lost at the validity deadline");
    }
    compose("resume", "mariadb").await;
    drop(g);
    assert!(
        lockcore::cleanup::flush(Duration::from_secs(10)).await,
        "the release did not finish"
    );
    let g = b
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("the name is free once the server is back");
    g.release().await.expect("release");
    assert_eq!(
        PANICS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a panic while releasing"
    );
}

/// An `extend` dropped right after it was sent (its reply not yet read)
/// keeps the lease: the renewal still reads its reply, and the lease lives
/// on through the next renewals, as the server shows (another client's
/// try is refused after more than a ttl).
async fn a_dropped_extend_keeps_the_lease(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let name = ctx.name("dropped-extend");
    let ttl = Duration::from_secs(3);
    let g = try_with_ttl(&a, &name, ttl).await;
    for _ in 0..3 {
        let _ = tokio::time::timeout(Duration::ZERO, g.extend(ttl)).await;
    }
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert!(g.is_held(), "a dropped extend lost the lease");
    assert!(
        b.try_lock(&name).await.expect("try").is_none(),
        "the name is free on the server"
    );
    g.release().await.expect("release");
}

/// A holder that stops talking (no renewal) is ended by the server's
/// `wait_timeout` (set from the ttl): the waiter gets the row after about a
/// ttl, and not long before.
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
        .expect("acquire")
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
    g2.release().await.expect("release");
}

/// How many lock-delay records `name` has on the server.
async fn delay_records(sql: &mut sqlx::MySqlConnection, table: &str, name: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{table}_delay` WHERE `name` = ?"
    )))
    .bind(name.as_bytes())
    .fetch_one(&mut *sql)
    .await
    .expect("count the lock-delay records")
}

/// A holder with a lock-delay whose connection ends at once (`KILL`, as
/// a dead process's socket): the row is free on the server at once (a
/// plain `SELECT ... FOR UPDATE` gets it), but its record keeps every
/// client of ours out until ttl + delay after its grant (no renewals);
/// the next holder, without a lock-delay, gets a larger token and deletes
/// the record. A clean release deletes its record before the row goes.
async fn lock_delay_outlives_a_killed_connection(ctx: Ctx) {
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let table = MysqlConfig::parse(&ctx.config).unwrap().table;
    let backend = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .unwrap();
    let mut sql = admin(&ctx).await;
    let name = ctx.name("delay/killed");
    let (ttl, delay) = (Duration::from_secs(2), Duration::from_secs(3));
    let opts = LockOptions::new()
        .ttl(ttl)
        .lock_delay(delay)
        .renew(false)
        .wait(Wait::Try);
    let sent = Instant::now();
    let g = a
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    assert_eq!(delay_records(&mut sql, &table, &name).await, 1);
    let id = backend
        .holder_connection(&name)
        .await
        .expect("holder")
        .expect("a holder is recorded");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&mut sql)
        .await
        .expect("KILL");
    tokio::time::timeout(ttl + Duration::from_secs(3), g.lost())
        .await
        .expect("the killed holder's lost signal fires");
    // The row itself is free: the record is ours to honour.
    let mut plain = admin(&ctx).await;
    let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "START TRANSACTION; SELECT 1 FROM `{table}` WHERE `name` = X'{}' FOR UPDATE; ROLLBACK",
        name.bytes().map(|b| format!("{b:02X}")).collect::<String>()
    )))
    .fetch_all(&mut plain)
    .await
    .expect("a plain client locks the row");
    assert_eq!(rows.len(), 1);
    assert!(
        b.try_lock(&name).await.expect("try").is_none(),
        "granted during the lock-delay"
    );
    // The refused try left nothing: no holder named, no user lock kept.
    let info = b.inspect(&name).await.expect("inspect").expect("inspects");
    assert!(
        info.holder.is_none(),
        "a refused try is shown as the holder: {info:?}"
    );
    let waiting = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            b.lock_timeout(&name, ttl + delay + Duration::from_secs(5))
                .await
        }
    });
    // While it waits the delay out, holding the row, the name is shown
    // held with no owner: not as the waiter's.
    let third = ctx.locker().await;
    let t = Instant::now();
    loop {
        let info = third
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("inspects");
        if let Some(h) = info.holder {
            assert!(
                h.owner.is_none() || sent.elapsed() >= ttl + delay,
                "the waiter is shown as the holder during the delay: {h:?}"
            );
            break;
        }
        assert!(t.elapsed() < ttl + delay, "the waiter never took the row");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let g2 = waiting
        .await
        .expect("task")
        .expect("granted after the delay");
    let granted = sent.elapsed();
    assert!(
        granted >= ttl + delay,
        "granted {granted:?} after the first grant was sent, before ttl + delay"
    );
    assert!(
        g2.fence() > g.fence(),
        "{:?} then {:?}",
        g.fence(),
        g2.fence()
    );
    let t = Instant::now();
    while delay_records(&mut sql, &table, &name).await > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the record of the unclean end stayed after the next grant"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    g2.release().await.expect("release");
    let g3 = a
        .acquire(&name, &opts)
        .await
        .expect("acquire")
        .expect("free");
    assert_eq!(delay_records(&mut sql, &table, &name).await, 1);
    g3.release().await.expect("release");
    assert_eq!(
        delay_records(&mut sql, &table, &name).await,
        0,
        "a clean release left its record"
    );
    let g4 = b.try_lock(&name).await.expect("try").expect("free at once");
    g4.release().await.expect("release");
}

/// Holding more locks than the server lets this client connect (an
/// account allowed 6 connections): the lock that finds no connection fails
/// fast with an error that names the limit, never hangs; the locks held
/// stay held, and once they are released the name is taken again.
async fn more_locks_than_connections_fail_fast(ctx: Ctx) {
    let url = ctx
        .config
        .replacen("lockcore:lockcore@", "lockcore_few:lockcore@", 1);
    assert_ne!(url, ctx.config, "the URL names the lockcore user");
    let l = lockcore_mysql::connect(&url).await.expect("connect");
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..10 {
        let name = ctx.name(&format!("few/{i}"));
        let t = Instant::now();
        match l.try_lock(&name).await {
            Ok(g) => held.push((name, g.expect("free"))),
            Err(e) => {
                refused = Some((e, t.elapsed()));
                break;
            }
        }
    }
    let (err, took) = refused.expect("10 locks held on an account allowed 6 connections");
    // One connection for the fencing counter, one per lock held.
    assert!(
        (1..6).contains(&held.len()),
        "{} locks held on 6 connections",
        held.len()
    );
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("max_user_connections") && msg.contains("connection of its own"),
        "the error does not name the limit: {msg}"
    );
    assert!(took < Duration::from_secs(5), "refused after {took:?}");
    let other = ctx.locker().await;
    for (name, g) in held {
        assert!(other.try_lock(&name).await.expect("try").is_none());
        g.release().await.expect("release");
    }
    let again = l
        .try_lock(&ctx.name("few/0"))
        .await
        .expect("a connection is free again")
        .expect("free");
    again.release().await.expect("release");
}

/// The server's count of rows written (inserted or updated) by InnoDB.
async fn rows_written(c: &mut sqlx::MySqlConnection) -> u64 {
    let mut n = 0;
    for row in sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_rows_inserted', 'Innodb_rows_updated')",
    )
    .fetch_all(&mut *c)
    .await
    .expect("status")
    {
        let v: String = row.try_get(1).expect("value");
        n += v.parse::<u64>().expect("a count");
    }
    n
}

/// `fencing=none`: no tokens, the capability says so, lock cycles write no
/// row on the server (the fencing counter is skipped), and the holder is
/// still found (and killed) through the server's lock-wait graph.
async fn fencing_none_writes_nothing(ctx: Ctx) {
    let l = lockcore_mysql::connect(&with_opts(&ctx, "fencing=none"))
        .await
        .expect("connect");
    assert_eq!(l.capabilities().fencing, lockcore::Fencing::None);
    let name = ctx.name("nofence");
    // The row is created on first use: a write, before counting.
    l.lock(&name).await.unwrap().release().await.unwrap();
    let mut c = admin(&ctx).await;
    let before = rows_written(&mut c).await;
    for _ in 0..20 {
        let g = l.lock(&name).await.unwrap();
        assert_eq!(g.fence(), None);
        g.release().await.unwrap();
    }
    let written = rows_written(&mut c).await - before;
    assert_eq!(written, 0, "rows written by 20 lock cycles without fencing");
    let fenced = sqlx::query("SELECT COUNT(*) FROM lockcore_locks_fence WHERE name = ?")
        .bind(name.as_bytes())
        .fetch_one(&mut c)
        .await
        .unwrap()
        .get::<i64, _>(0);
    assert_eq!(fenced, 0, "no fencing counter row");

    let g = l.lock(&name).await.unwrap();
    let b = MysqlBackend::connect(MysqlConfig::parse(&with_opts(&ctx, "fencing=none")).unwrap())
        .await
        .unwrap();
    assert!(b.holder_connection(&name).await.unwrap().is_some());
    assert!(b.kill_holder(&name).await.unwrap(), "the holder was found");
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("lost fires after the kill");
    let other = lockcore_mysql::connect(&ctx.config).await.unwrap();
    let g2 = other
        .try_lock(&name)
        .await
        .unwrap()
        .expect("free on the server");
    g2.release().await.unwrap();
}

/// `fencing=none`: a lock granted after a long wait is valid for its ttl
/// from the grant, not from when the wait began.
async fn fencing_none_validity_after_a_long_wait(ctx: Ctx) {
    let url = with_opts(&ctx, "fencing=none");
    let (a, b) = (
        lockcore_mysql::connect(&url).await.unwrap(),
        lockcore_mysql::connect(&url).await.unwrap(),
    );
    let name = ctx.name("nofence-wait");
    let ttl = Duration::from_secs(3);
    let g = a
        .acquire(&name, &LockOptions::new().ttl(ttl))
        .await
        .unwrap()
        .unwrap();
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait(Wait::For(Duration::from_secs(20)));
    let waiter = tokio::spawn(async move { b.acquire(&name, &opts).await });
    // The waiter is inside the server's lock wait by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    g.release().await.unwrap();
    let got = waiter.await.unwrap().unwrap().expect("granted");
    let left = got
        .valid_until()
        .expect("a deadline")
        .saturating_duration_since(Instant::now());
    assert!(
        left > ttl / 2,
        "granted with {left:?} of validity left of a {ttl:?} ttl"
    );
    got.release().await.unwrap();
}

/// Holds `row` of the counter table in a transaction of a plain SQL
/// session, until the session is dropped or rolled back.
async fn lock_counter_row(ctx: &Ctx, row: &str) -> sqlx::MySqlConnection {
    let mut sql = admin(ctx).await;
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut sql)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM lockcore_locks_fence WHERE name = ? FOR UPDATE")
        .bind(row.as_bytes())
        .fetch_optional(&mut sql)
        .await
        .expect("lock the counter row")
        .expect("the counter row");
    sql
}

/// A plain SQL session holds a name's fencing counter row. A lock's holder
/// sets its counter in its own transaction: the acquire fails
/// `Unavailable`, naming the counter row, its transaction rolled back. A
/// reader advances the counter in an autocommit write on a connection of
/// its own: one that does not answer in time may have committed, so it
/// fails `Indeterminate`. Nothing stays held either way: once the session
/// lets go, another client takes the name, with a token above the one
/// before.
async fn a_locked_counter_row_fails_the_acquire_and_holds_nothing(ctx: Ctx) {
    let name = ctx.name("fence-stuck");
    let plain = ctx.locker().await;
    use_once(&plain, &name).await;
    let first = plain.try_lock(&name).await.expect("try").expect("free");
    let before = first.fence().expect("a token");
    first.release().await.expect("release");
    let rw = lockcore::RwLock::new(&plain, &name).expect("rwlock");
    let reader = rw.try_read().await.expect("try_read").expect("free");
    let read_before = reader.fence().expect("a reader's token");
    drop(reader);
    let quick = lockcore_mysql::connect(&with_opts(&ctx, "request_timeout_ms=1500"))
        .await
        .expect("connect");
    let sql = lock_counter_row(&ctx, &name).await;
    let err = quick
        .try_lock(&name)
        .await
        .expect_err("granted while the counter row was locked");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("fencing counter row"), "{err}");
    drop(sql);
    let mut sql = lock_counter_row(&ctx, &format!("{name}\u{1}rw")).await;
    let quick_rw = lockcore::RwLock::new(&quick, &name).expect("rwlock");
    let err = quick_rw
        .try_read()
        .await
        .expect_err("a reader granted while the counter row was locked");
    assert_eq!(err.kind(), ErrorKind::Indeterminate, "{err}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut sql)
        .await
        .expect("rollback");
    // Nothing stays held: the failed attempts' connections were closed
    // (their transactions rolled back), so waiters get the names well
    // within 10 s.
    let wait = LockOptions::new().wait(Wait::For(Duration::from_secs(10)));
    let next = plain
        .acquire(&name, &wait)
        .await
        .expect("acquire")
        .expect("the name stayed held after the failed acquire");
    assert!(
        next.fence().expect("a token") > before,
        "tokens did not rise"
    );
    next.release().await.expect("release");
    let w = rw
        .write(&wait)
        .await
        .expect("write")
        .expect("the read-write lock stayed held after the failed read");
    assert!(
        w.fence().expect("a token") > read_before,
        "tokens did not rise"
    );
    w.release().await.expect("release");
}

/// A counter raised past the server's clock (by hand here; readers and
/// permits in one microsecond, or a clock stepped back, do it too): a
/// lock's holder cannot take the clock, so it advances the counter
/// committed on its own. Its successor after a `KILL` (the holder's
/// transaction rolled back) still gets a larger token, and so does the
/// one after a release.
async fn a_counter_past_the_clock_still_rises_across_a_killed_holder(ctx: Ctx) {
    let name = ctx.name("fence-ahead");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    use_once(&a, &name).await;
    let ahead: u64 = 1 << 62;
    let mut sql = admin(&ctx).await;
    sqlx::query("UPDATE lockcore_locks_fence SET fence = ? WHERE name = ?")
        .bind(ahead)
        .bind(name.as_bytes())
        .execute(&mut sql)
        .await
        .expect("raise the counter");
    let g = try_with_ttl(&a, &name, Duration::from_secs(3)).await;
    let t1 = g.fence().expect("a token");
    assert!(t1 > ahead, "token {t1} not above the counter {ahead}");
    let id = MysqlBackend::connect(MysqlConfig::parse(&ctx.config).unwrap())
        .await
        .unwrap()
        .holder_connection(&name)
        .await
        .expect("holder")
        .expect("a holder is recorded");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&mut sql)
        .await
        .expect("KILL");
    let g2 = b
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("the name is free after the KILL");
    let t2 = g2.fence().expect("a token");
    assert!(t2 > t1, "token {t2} after {t1}, across a killed holder");
    g2.release().await.expect("release");
    let g3 = a.try_lock(&name).await.expect("try").expect("free");
    let t3 = g3.fence().expect("a token");
    assert!(t3 > t2, "token {t3} after {t2}, across a release");
    g3.release().await.expect("release");
}

/// A writer's token is set to the clock in its transaction; a reader's
/// advances the counter committed on its own. After the writer's session
/// is killed (its token rolled back with it), a reader's token is still
/// larger: the committed counter is floored at the clock too.
async fn a_reader_after_a_killed_writer_gets_a_larger_token(ctx: Ctx) {
    let name = ctx.name("rw-killed");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let rw_a = lockcore::RwLock::new(&a, &name).expect("rwlock");
    // Used once: the counter row exists, so the next writer's token is
    // set in its transaction.
    let w = rw_a.try_write().await.expect("try_write").expect("free");
    w.release().await.expect("release");
    let w = rw_a.try_write().await.expect("try_write").expect("free");
    let written = w.fence().expect("a writer's token");
    // The writer's connection, as its transaction recorded it (uncommitted).
    let mut sql = admin(&ctx).await;
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        .execute(&mut sql)
        .await
        .expect("read uncommitted");
    let id: Option<u64> =
        sqlx::query_scalar("SELECT holder_conn FROM lockcore_locks_fence WHERE name = ?")
            .bind(format!("{name}\u{1}rw").as_bytes())
            .fetch_one(&mut sql)
            .await
            .expect("the writer's counter row");
    let id = id.expect("the writer's connection is recorded");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&mut sql)
        .await
        .expect("KILL");
    let rw_b = lockcore::RwLock::new(&b, &name).expect("rwlock");
    let r = rw_b
        .read(&LockOptions::new().wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("read")
        .expect("the writer's row is free after the KILL");
    let read = r.fence().expect("a reader's token");
    assert!(
        read > written,
        "a reader's token {read} after the killed writer's {written}"
    );
    r.release().await.expect("release");
}

fn main() -> std::process::ExitCode {
    run_serial(vec![
        harness::target("mysql-soak")
            .only_own_cases()
            .case("soak", |ctx| Box::pin(soak_pausing(ctx, "mariadb"))),
        own_cases!(
            Target::new(
                "mysql-faults",
                Some("LOCKTEST_MYSQL_URL"),
                |url| async move {
                    // Creates the tables if needed.
                    drop(lockcore_mysql::connect(&url).await?);
                    Ok(UrlHarness::shared(url, connect))
                },
            )
            .hint(COMPOSE_HINT)
            .only_own_cases(),
            a_locked_counter_row_fails_the_acquire_and_holds_nothing,
            a_counter_past_the_clock_still_rises_across_a_killed_holder,
            a_reader_after_a_killed_writer_gets_a_larger_token,
            restart_under_a_holder,
            kill_holder_connection,
            killed_leader_hands_over_with_its_value,
            a_row_held_unpublished_is_held,
            a_squatted_user_lock_blocks_no_lock,
            tables_without_values_still_inspect,
            release_after_a_cut_off_renewal,
            a_dropped_extend_keeps_the_lease,
            share_and_update_locks_from_sql_are_readers_and_writers,
            slot_rows_locked_from_sql_are_permits,
            permit_counts_out_of_range_are_refused,
            equal_counts_beside_old_rows_are_no_mismatch,
            wide_semaphore_waiter_gets_any_freed_permit,
            names_are_byte_exact,
            fencing_none_writes_nothing,
            fencing_none_validity_after_a_long_wait,
            busy_pool_opens_its_own_connections,
            kill_holder_spares_a_reused_connection,
            kill_holder_never_kills_a_waiter,
            first_lock_after_a_server_restart,
            dropped_guard_frees_row_promptly,
            stalled_holder_is_timed_out_by_server,
            lock_delay_outlives_a_killed_connection,
            more_locks_than_connections_fail_fast,
        ),
    ])
}
