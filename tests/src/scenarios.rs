//! Fault scenarios that measure as they check: each runs one fault against
//! a backend, asserts the contract, and returns the figures
//! (`RELIABILITY.md` is made of them).
//!
//! Unlike the cases of [`crate::cases`], some need more than a harness: a
//! [`Resource`] to write to, or a [`ServerControl`] to pause the servers
//! (which disturbs every other client, so run those one at a time, as
//! [`run_serial`](crate::run_serial) does).

use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockcore::fencing::FenceGate;
use lockcore::{ErrorKind, LockOptions, Wait};

use crate::{ClientPause, Ctx, Dir, Proxies};

/// What a scenario measured, printed as one line:
/// `scenario target: key=value, ...`.
#[derive(Debug, Clone)]
pub struct Report {
    /// The scenario.
    pub scenario: &'static str,
    /// The target it ran on.
    pub target: String,
    /// Its figures, in order.
    pub figures: Vec<(&'static str, String)>,
}

impl Report {
    fn new(scenario: &'static str, ctx: &Ctx) -> Self {
        Report {
            scenario,
            target: ctx.target.clone(),
            figures: Vec::new(),
        }
    }

    fn add(&mut self, key: &'static str, value: impl fmt::Display) {
        self.figures.push((key, value.to_string()));
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FIGURES {} {}:", self.scenario, self.target)?;
        for (i, (k, v)) in self.figures.iter().enumerate() {
            write!(f, "{} {k}={v}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// A guarded resource that takes writes with a fencing token and refuses a
/// token below one it has seen (a storage service, a SQL row with
/// `UPDATE ... WHERE fence < ?`).
#[async_trait]
pub trait Resource: Send + Sync {
    /// Writes for `name` with `token`; `Ok(false)` when the resource
    /// refused it as stale.
    async fn write(&self, name: &str, token: u64) -> Result<bool, String>;
}

/// A [`FenceGate`] as a [`Resource`].
#[derive(Debug, Default)]
pub struct GateResource(pub FenceGate);

#[async_trait]
impl Resource for GateResource {
    async fn write(&self, name: &str, token: u64) -> Result<bool, String> {
        Ok(self.0.check(name, token).is_ok())
    }
}

/// Pauses and resumes the servers of a target.
#[async_trait]
pub trait ServerControl: Send + Sync {
    /// Stops them (SIGSTOP: connections stay open, nothing is answered).
    async fn pause(&self);
    /// Lets them run again.
    async fn resume(&self);
}

/// [`ServerControl`] through `compose/local pause|resume`.
#[derive(Debug, Clone)]
pub struct Compose(pub Vec<String>);

#[async_trait]
impl ServerControl for Compose {
    async fn pause(&self) {
        for s in &self.0 {
            crate::compose("pause", s).await;
        }
    }

    async fn resume(&self) {
        for s in &self.0 {
            crate::compose("resume", s).await;
        }
    }
}

fn opts(ttl: Duration, wait: Wait) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(wait)
}

/// A holder paused past its ttl (as a GC pause or a stopped VM pauses it:
/// its renewals stop) while another client takes the name. On waking it
/// finds its lease gone (`is_held()` false, the lost signal fired at its
/// validity deadline, before the other client got the name), and the write
/// it tries with its old token is refused by `resource`. Backends without
/// fencing skip the writes.
///
/// # Panics
///
/// When the contract does not hold.
pub async fn paused_holder_is_fenced(ctx: &Ctx, resource: &dyn Resource) -> Report {
    let mut r = Report::new("paused_holder_is_fenced", ctx);
    let pause = ClientPause::new();
    let holder = pause.wrap(&ctx.locker().await);
    let other = ctx.locker().await;
    let name = ctx.name("scenario/paused");
    let ttl = Duration::from_secs(2);
    let g = holder
        .acquire(&name, &opts(ttl, Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    if let Some(f) = g.fence() {
        assert!(
            resource.write(&name, f).await.expect("write"),
            "the holder's first write was refused"
        );
    }
    pause.pause();
    let g2 = other
        .lock_timeout(&name, ttl * 3 + Duration::from_secs(5))
        .await
        .expect("another client gets the name once the paused lease expired");
    let other_at = lockcore::raw::now();
    assert!(
        g.lost_token().is_cancelled(),
        "the paused holder's lost signal had not fired when another client got the name"
    );
    let lost_at = g.validity_end(other_at);
    assert!(lost_at <= other_at);
    r.add("lost_before_next_holder", ms(other_at - lost_at));
    let mut stale_accepted = 0;
    if let Some(f2) = g2.fence() {
        assert!(
            resource.write(&name, f2).await.expect("write"),
            "the new holder's write was refused"
        );
    }
    pause.resume();
    // The holder wakes: it checks, as it must, before writing.
    assert!(
        !g.is_held(),
        "the woken holder still believes it holds the name"
    );
    if let Some(f) = g.fence() {
        if resource.write(&name, f).await.expect("write") {
            stale_accepted += 1;
        }
        r.add("stale_writes_accepted", stale_accepted);
        assert_eq!(
            stale_accepted, 0,
            "the resource took the woken holder's stale write"
        );
    } else {
        r.add("stale_writes_accepted", "n/a (no fencing)");
    }
    g2.release().await.expect("release");
    drop(g);
    r
}

/// The holder cut off from the server (every packet dropped both ways):
/// its lost signal fires before the server frees the name, and another
/// client gets the name after that. Reports how long before the name was
/// free the lost signal fired (the margin: it must be positive), and when
/// the other client got it. `None` when the harness cannot proxy.
///
/// # Panics
///
/// When the contract does not hold.
pub async fn cut_off_holder(ctx: &Ctx) -> Option<Report> {
    let mut r = Report::new("cut_off_holder", ctx);
    let proxies = Proxies::new();
    let holder = ctx.locker_via(&proxies).await?;
    let other = ctx.locker().await;
    let name = ctx.name("scenario/cut");
    let ttl = Duration::from_secs(2);
    let g = holder
        .acquire(&name, &opts(ttl, Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    // Past the first renewal.
    tokio::time::sleep(ttl / 2).await;
    proxies.blackhole(Dir::Both);
    let cut = Instant::now();
    // Another client asks every 20 ms until the server frees the name.
    let poll = async {
        loop {
            if let Ok(Some(g2)) = other.try_lock(&name).await {
                return (Instant::now(), g2);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (lost, (free_at, g2)) = tokio::join!(
        async {
            tokio::time::timeout(ttl * 2, g.lost())
                .await
                .expect("lost fires");
            Instant::now()
        },
        async {
            tokio::time::timeout(ttl * 3 + Duration::from_secs(10), poll)
                .await
                .expect("the server frees the name")
        }
    );
    let lost_at = g.validity_end(lost);
    assert!(
        lost_at <= free_at,
        "another client got the name {:?} before the cut-off holder's lost signal",
        lost_at - free_at
    );
    r.add("lost_after_cut", ms(lost_at - cut));
    r.add("margin_before_server_freed", ms(free_at - lost_at));
    r.add("next_holder_after_cut", ms(free_at - cut));
    g2.release().await.expect("release");
    proxies.heal();
    drop(g);
    Some(r)
}

fn ends_cleanly(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Unavailable | ErrorKind::Indeterminate | ErrorKind::Timeout
    )
}

/// The servers paused for `pause` (longer than any request timeout) while
/// a lock is held and other calls are made: a `try` and a wait of 1 s end
/// with `Unavailable`, `Indeterminate` or `Timeout` (a wait by its deadline
/// and [`DEADLINE_GRACE`](lockcore::DEADLINE_GRACE)), the holder's lost
/// signal fires by its validity deadline; nothing panics or hangs. After
/// the resume a new client gets the name. Reports each call's time and the
/// time to the first lock after the resume.
///
/// # Panics
///
/// When the contract does not hold.
pub async fn servers_paused(ctx: &Ctx, control: &dyn ServerControl, pause: Duration) -> Report {
    const TRY_BOUND: Duration = Duration::from_secs(12);
    let mut r = Report::new("servers_paused", ctx);
    let holder = ctx.locker().await;
    let other = ctx.locker().await;
    let name = ctx.name("scenario/server-paused");
    let ttl = Duration::from_secs(3);
    let g = holder
        .acquire(&name, &opts(ttl, Wait::Try))
        .await
        .expect("acquire")
        .expect("free");
    let valid_until = g.valid_until().expect("held");
    control.pause().await;
    let paused = Instant::now();
    let wait = Duration::from_secs(1);
    let (tried, waited, lost) = tokio::join!(
        async {
            let t = Instant::now();
            let res = tokio::time::timeout(
                TRY_BOUND,
                other.try_lock(&ctx.name("scenario/server-paused/try")),
            )
            .await
            .unwrap_or_else(|_| panic!("try_lock hung for {TRY_BOUND:?} on paused servers"));
            match res {
                Err(e) => assert!(ends_cleanly(e.kind()), "try_lock on paused servers: {e}"),
                Ok(Some(_)) => panic!("acquired a lock from paused servers"),
                Ok(None) => {}
            }
            t.elapsed()
        },
        async {
            let t = Instant::now();
            let bound = wait + lockcore::DEADLINE_GRACE + Duration::from_secs(2);
            let res = tokio::time::timeout(
                bound,
                other.lock_timeout(&ctx.name("scenario/server-paused/wait"), wait),
            )
            .await
            .unwrap_or_else(|_| {
                panic!("a wait of {wait:?} went on for {bound:?} on paused servers")
            });
            let e = res.expect_err("acquired a lock from paused servers");
            assert!(
                ends_cleanly(e.kind()),
                "lock_timeout on paused servers: {e}"
            );
            t.elapsed()
        },
        async {
            tokio::time::timeout_at((valid_until + Duration::from_secs(2)).into(), g.lost())
                .await
                .expect("the holder's lost signal fires by its validity deadline");
            Instant::now()
        }
    );
    let remaining = pause.saturating_sub(paused.elapsed());
    tokio::time::sleep(remaining).await;
    control.resume().await;
    let resumed = Instant::now();
    r.add("try_ended_after", ms(tried));
    r.add("wait_1s_ended_after", ms(waited));
    r.add("lost_after_pause", ms(lost - paused));
    drop(g);
    // An ensemble resumed all at once elects a leader before it takes new
    // sessions: a client that cannot connect yet tries again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fresh = loop {
        match ctx.harness.connect().await {
            Ok(l) => break l,
            Err(e) => assert!(
                Instant::now() < deadline,
                "no client could connect within 60 s of the resume: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    loop {
        match tokio::time::timeout(TRY_BOUND, fresh.lock_timeout(&name, ttl * 2)).await {
            Ok(Ok(g)) => {
                g.release().await.expect("release");
                break;
            }
            other => assert!(
                Instant::now() < deadline,
                "no lock within 60 s of the resume: {other:?}"
            ),
        }
    }
    r.add("first_lock_after_resume", ms(resumed.elapsed()));
    r
}

/// A client aimed at a port that never answers, and at one that speaks
/// another protocol: connecting or the first `try` ends with a clear error
/// within 15 s, no panic, no hang. `None` when the harness cannot proxy.
///
/// # Panics
///
/// When a call hangs or succeeds.
pub async fn impostor_servers(ctx: &Ctx) -> Option<Report> {
    const BOUND: Duration = Duration::from_secs(15);
    if !ctx.harness.can_proxy() {
        return None;
    }
    let mut r = Report::new("impostor_servers", ctx);
    for (what, reply) in [
        ("silent", None),
        (
            "http",
            Some(
                &b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"[..],
            ),
        ),
        ("ssh", Some(&b"SSH-2.0-OpenSSH_9.2\r\n"[..])),
    ] {
        let proxies = Proxies::new();
        match reply {
            None => proxies.blackhole(Dir::Both),
            Some(bytes) => proxies.impostor(bytes),
        }
        let t = Instant::now();
        let outcome = tokio::time::timeout(BOUND, async {
            let l = ctx.harness.connect_via(&proxies).await?;
            match l {
                Err(e) => Some(e),
                Ok(l) => match l.try_lock(&ctx.name("scenario/impostor")).await {
                    Err(e) => Some(e),
                    Ok(Some(_)) => panic!("acquired a lock from a {what} impostor"),
                    Ok(None) => panic!("a {what} impostor was taken for a held name"),
                },
            }
        })
        .await
        .unwrap_or_else(|_| panic!("a client of a {what} impostor hung for {BOUND:?}"));
        let e = outcome?;
        assert!(
            !matches!(e.kind(), ErrorKind::Lost | ErrorKind::InvalidName),
            "a {what} impostor: {e}"
        );
        r.add(what, format!("{:?} after {}", e.kind(), ms(t.elapsed())));
    }
    Some(r)
}

/// What our read-write lock does beside another client's hold on the same
/// name (`foreign` says whose, for the messages): our reader is granted
/// beside it exactly when `reads_beside` (the other holds it shared), our
/// writer never; asked of the server with tries.
///
/// # Panics
///
/// When the server grants otherwise: the case fails.
pub async fn rw_beside_a_foreign_hold(rw: &lockcore::RwLock, reads_beside: bool, foreign: &str) {
    let read = rw.try_read().await.expect("try_read");
    assert_eq!(read.is_some(), reads_beside, "our reader beside {foreign}");
    if let Some(r) = read {
        r.release().await.expect("release");
    }
    assert!(
        rw.try_write().await.expect("try_write").is_none(),
        "our writer beside {foreign}"
    );
}
