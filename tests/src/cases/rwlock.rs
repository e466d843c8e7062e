//! Read-write locks ([`lockcore::RwLock`]): readers share and a writer
//! excludes (as the server sees it), a stream of readers does not starve a
//! waiting writer, writers' tokens rise, and dropped acquisitions leave
//! nothing behind.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockOptions, RwLock, Wait};

use super::{must_be_held, SLACK};
use crate::Ctx;

fn rw(l: &lockcore::Locker, name: &str) -> RwLock {
    RwLock::new(l, name).expect("rwlock")
}

/// Two readers on their own clients hold at once; a writer cannot enter
/// while they do, and readers cannot while a writer holds; the server
/// shows the gate held by the writer.
pub async fn rwlock_readers_share_writer_excludes(ctx: Ctx) {
    let name = ctx.name("rw-share");
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let (ra, rb, rc) = (rw(&a, &name), rw(&b, &name), rw(&c, &name));
    let r1 = ra.try_read().await.unwrap().expect("first reader");
    let r2 = rb.try_read().await.unwrap().expect("readers share");
    assert!(
        rc.try_write().await.unwrap().is_none(),
        "a writer among readers"
    );
    r1.release().await.unwrap();
    assert!(
        rc.try_write().await.unwrap().is_none(),
        "a writer beside a reader"
    );
    r2.release().await.unwrap();
    let w = rc.try_write().await.unwrap().expect("no reader left");
    if ctx.caps.rw_layout == lockcore::Layout::Built {
        must_be_held(&a, &rc.gate_name()).await;
    }
    assert!(
        ra.try_read().await.unwrap().is_none(),
        "a reader beside a writer"
    );
    assert!(rb.try_write().await.unwrap().is_none(), "two writers");
    w.release().await.unwrap();
    let r = ra.try_read().await.unwrap().expect("free again");
    r.release().await.unwrap();
}

/// Readers keep reading in overlapping turns; a writer that starts waiting
/// gets the lock soon, and no reader is inside while it writes (checked by
/// both sides, on entry and on leaving).
pub async fn rwlock_writer_not_starved(ctx: Ctx) {
    let name = ctx.name("rw-starve");
    let stop = Arc::new(AtomicBool::new(false));
    let writing = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicU32::new(0));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let l = rw(&ctx.locker().await, &name);
        let (stop, writing, inside) = (stop.clone(), writing.clone(), inside.clone());
        readers.push(tokio::spawn(async move {
            let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(60)));
            while !stop.load(Ordering::SeqCst) {
                let r = l.read(&opts).await.expect("read").expect("a read lock");
                inside.fetch_add(1, Ordering::SeqCst);
                assert!(
                    !writing.load(Ordering::SeqCst),
                    "a reader entered beside a writer"
                );
                tokio::time::sleep(Duration::from_millis(30)).await;
                assert!(
                    !writing.load(Ordering::SeqCst),
                    "a writer entered beside a reader"
                );
                inside.fetch_sub(1, Ordering::SeqCst);
                r.release().await.expect("release");
            }
        }));
    }
    let w = rw(&ctx.locker().await, &name);
    // Wait until the readers are reading.
    let t = Instant::now();
    while inside.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < SLACK * 5, "no reader ever read");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t = Instant::now();
    let g = w
        .write(&LockOptions::new().wait(Wait::For(SLACK * 5)))
        .await
        .expect("the writer was starved")
        .expect("a write lock");
    let waited = t.elapsed();
    writing.store(true, Ordering::SeqCst);
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "readers inside with the writer"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "a reader came in while writing"
    );
    writing.store(false, Ordering::SeqCst);
    g.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.expect("reader");
    }
    assert!(waited < SLACK * 2, "the writer waited {waited:?}");
}

/// Readers that try at the same moment, each on its own client, all read:
/// passing the gate one after another is not a writer.
pub async fn rwlock_concurrent_try_reads_share(ctx: Ctx) {
    const READERS: usize = 8;
    let name = ctx.name("rw-tries");
    let mut locks = Vec::new();
    for _ in 0..READERS {
        locks.push(rw(&ctx.locker().await, &name));
    }
    for round in 0..3 {
        // All at once: connected first, then started together.
        let start = Arc::new(tokio::sync::Barrier::new(READERS));
        let mut tries = Vec::new();
        for l in &locks {
            let (l, start) = (l.clone(), start.clone());
            tries.push(tokio::spawn(async move {
                start.wait().await;
                l.try_read().await.expect("try_read")
            }));
        }
        let mut held = Vec::new();
        for t in tries {
            let r = t.await.expect("reader");
            held.push(r.unwrap_or_else(|| {
                panic!("round {round}: a concurrent reader was refused with no writer")
            }));
        }
        for r in held {
            r.release().await.unwrap();
        }
    }
}

/// Successive writers get strictly rising tokens.
pub async fn rwlock_writer_tokens_rise(ctx: Ctx) {
    let name = ctx.name("rw-fence");
    let mut last = 0;
    for _ in 0..3 {
        let l = rw(&ctx.locker().await, &name);
        let w = l.try_write().await.unwrap().expect("free");
        let f = w.fence().expect("a token");
        assert!(f > last, "writer token {f} after {last}");
        last = f;
        w.release().await.unwrap();
    }
}

/// A writer waiting for readers that is dropped, and one that times out,
/// leave nothing: once the readers are gone a reader and a writer get in
/// at once.
pub async fn rwlock_dropped_write_leaves_nothing(ctx: Ctx) {
    let name = ctx.name("rw-drop");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (ra, rb) = (rw(&a, &name), rw(&b, &name));
    let r = ra.try_read().await.unwrap().expect("reader");
    let e = rb
        .write(&LockOptions::new().wait(Wait::For(Duration::from_millis(500))))
        .await
        .expect_err("a writer beside a reader");
    assert_eq!(e.kind(), lockcore::ErrorKind::Timeout);
    for ms in [0, 50, 300] {
        let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(30)));
        let _ = tokio::time::timeout(Duration::from_millis(ms), rb.write(&opts)).await;
    }
    r.release().await.unwrap();
    let t = Instant::now();
    let opts = LockOptions::new().wait(Wait::For(SLACK));
    let r = ra
        .read(&opts)
        .await
        .expect("a dropped writer left the gate held")
        .expect("read");
    r.release().await.unwrap();
    let w = ra
        .write(&opts)
        .await
        .expect("a dropped writer left a slot held")
        .expect("write");
    w.release().await.unwrap();
    assert!(t.elapsed() < SLACK * 2);
}

/// A name's lock and its read-write lock are two things, on every
/// backend: holding the lock does not keep readers or a writer out, nor a
/// writer the lock, and `inspect` shows the lock's holder only.
pub async fn rwlock_is_not_the_lock_of_its_name(ctx: Ctx) {
    let name = ctx.name("rw-lock");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let g = a.try_lock(&name).await.unwrap().expect("free");
    let rw = rw(&b, &name);
    let r = rw
        .try_read()
        .await
        .unwrap()
        .expect("a reader beside the lock");
    r.release().await.unwrap();
    let w = rw
        .try_write()
        .await
        .unwrap()
        .expect("a writer beside the lock");
    g.release().await.unwrap();
    let g = a
        .try_lock(&name)
        .await
        .unwrap()
        .expect("the lock beside a writer");
    if ctx.caps.inspect {
        let info = b.inspect(&name).await.unwrap().expect("inspects");
        assert!(info.holder.is_some(), "inspect misses the lock's holder");
        assert!(
            matches!(info.waiters, Some(0) | None),
            "the writer counted as a waiter: {info:?}"
        );
    }
    g.release().await.unwrap();
    if ctx.caps.inspect {
        let info = b.inspect(&name).await.unwrap().expect("inspects");
        assert_eq!(info.holder, None, "the writer shown as the lock's holder");
    }
    w.release().await.unwrap();
}

/// In a native layout, a reader's token is above the writer's before it
/// and below the writer's after it.
pub async fn rwlock_reader_tokens_sit_between_writers(ctx: Ctx) {
    let name = ctx.name("rw-order");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (ra, rb) = (rw(&a, &name), rw(&b, &name));
    let w1 = ra.try_write().await.unwrap().expect("free");
    let before = w1.fence().expect("a token");
    w1.release().await.unwrap();
    let r = rb.try_read().await.unwrap().expect("no writer");
    let read = r.fence().expect("a reader token");
    r.release().await.unwrap();
    let w2 = ra.try_write().await.unwrap().expect("free");
    let after = w2.fence().expect("a token");
    w2.release().await.unwrap();
    assert!(
        before < read && read < after,
        "reader token {read} not between the writers' {before} and {after}"
    );
}

/// Where the two backends of a migration lay a read-write lock out
/// differently, there is none: a clear error, before any server is asked.
pub async fn rwlock_refused_where_layouts_differ(ctx: Ctx) {
    let l = ctx.locker().await;
    let e = RwLock::new(&l, &ctx.name("rw-refused")).expect_err("a read-write lock");
    assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig, "{e}");
    assert!(e.to_string().contains("read-write lock"), "{e}");
}
