//! Read-write locks ([`lockcore::RwLock`]): readers share and a writer
//! excludes (as the server sees it), a stream of readers does not starve a
//! waiting writer, writers' tokens rise, and dropped acquisitions leave
//! nothing behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{LockOptions, RwLock, Wait};

use super::{must_be_held, SLACK};
use crate::Ctx;

fn rw(l: &lockcore::Locker, name: &str) -> RwLock {
    RwLock::with_max_readers(l, name, 4).expect("rwlock")
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
    must_be_held(&a, &rc.gate_name()).await;
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
/// gets the lock soon, and no reader is inside while it writes.
pub async fn rwlock_writer_not_starved(ctx: Ctx) {
    let name = ctx.name("rw-starve");
    let stop = Arc::new(AtomicBool::new(false));
    let writing = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let l = rw(&ctx.locker().await, &name);
        let (stop, writing) = (stop.clone(), writing.clone());
        readers.push(tokio::spawn(async move {
            let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(60)));
            while !stop.load(Ordering::SeqCst) {
                let r = l.read(&opts).await.expect("read").expect("a read lock");
                assert!(
                    !writing.load(Ordering::SeqCst),
                    "a reader inside with a writer"
                );
                tokio::time::sleep(Duration::from_millis(30)).await;
                r.release().await.expect("release");
            }
        }));
    }
    let w = rw(&ctx.locker().await, &name);
    // The readers are reading by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let g = w
        .write(&LockOptions::new().wait(Wait::For(SLACK * 5)))
        .await
        .expect("the writer was starved")
        .expect("a write lock");
    let waited = t.elapsed();
    writing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    writing.store(false, Ordering::SeqCst);
    g.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.expect("reader");
    }
    assert!(waited < SLACK * 2, "the writer waited {waited:?}");
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
