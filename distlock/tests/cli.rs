//! The real `distlock` binary against each backend's server (from compose/):
//! `run` never overlaps across processes, exit codes, a lost lease stops the
//! command, signals pass through. One case at a time: some pause servers.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lockcore_conformance::{compose, run_serial, Ctx, Target, UndoOnDrop, UrlHarness};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// One backend: target name, its variable, its compose/ server, and how the
/// variable's value becomes a URL.
struct Spec {
    target: &'static str,
    env: &'static str,
    server: &'static str,
    url: fn(&str) -> String,
}

const SPECS: &[Spec] = &[
    #[cfg(feature = "redis")]
    Spec {
        target: "cli-redis",
        env: "LOCKTEST_REDIS_URL",
        server: "redis",
        url: |v| v.to_owned(),
    },
    #[cfg(feature = "zk")]
    Spec {
        target: "cli-zk",
        env: "LOCKTEST_ZK",
        server: "zk",
        url: |v| format!("zk://{v}"),
    },
    #[cfg(feature = "etcd")]
    Spec {
        target: "cli-etcd",
        env: "LOCKTEST_ETCD",
        server: "etcd",
        url: |v| v.replace("http://", "etcd://"),
    },
    #[cfg(feature = "mysql")]
    Spec {
        target: "cli-mysql",
        env: "LOCKTEST_MYSQL_URL",
        server: "mariadb",
        url: |v| v.to_owned(),
    },
];

fn spec(ctx: &Ctx) -> &'static Spec {
    SPECS
        .iter()
        .find(|s| ctx.namespace.ends_with(&format!("/{}", s.target)))
        .expect("a known target")
}

fn distlock(ctx: &Ctx) -> Command {
    let mut c = Command::new(BIN);
    c.env("DISTLOCK_URL", (spec(ctx).url)(&ctx.config))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

fn scratch(ctx: &Ctx, what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(ctx.namespace.replace('/', "_"));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(what);
    let _ = std::fs::remove_file(&p);
    p
}

async fn until_exists(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two `distlock run` processes on one name, three rounds each: their
/// critical sections (start/end marks with timestamps) never interleave.
async fn run_never_overlaps(ctx: Ctx) {
    let marks = scratch(&ctx, "marks");
    let name = ctx.name("overlap");
    let script = format!(
        "echo start $$ $(date +%s%N) >> {m}; sleep 0.2; echo end $$ $(date +%s%N) >> {m}",
        m = marks.display()
    );
    let mut procs = Vec::new();
    for _ in 0..2 {
        let (ctx, name, script) = (ctx.clone(), name.clone(), script.clone());
        procs.push(tokio::spawn(async move {
            for _ in 0..3 {
                let st = distlock(&ctx)
                    .args(["run", "--ttl", "5s", &name, "--", "sh", "-c", &script])
                    .status()
                    .await
                    .unwrap();
                assert!(st.success(), "distlock run failed: {st}");
            }
        }));
    }
    for p in procs {
        p.await.unwrap();
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 12, "{text}");
    let mut last_end = 0u128;
    for pair in lines.chunks(2) {
        let (s, e) = (&pair[0], &pair[1]);
        assert_eq!((s[0], e[0]), ("start", "end"), "interleaved:\n{text}");
        assert_eq!(s[1], e[1], "interleaved:\n{text}");
        let (ts, te): (u128, u128) = (s[2].parse().unwrap(), e[2].parse().unwrap());
        assert!(
            ts >= last_end && te >= ts,
            "overlapping critical sections:\n{text}"
        );
        last_end = te;
    }
}

/// The command's status passes through; a held lock gives the conflict code
/// without running anything; name and fencing token are exported.
async fn exit_codes_and_environment(ctx: Ctx) {
    let name = ctx.name("codes");
    let out = distlock(&ctx)
        .args([
            "run",
            &name,
            "--",
            "sh",
            "-c",
            "echo $DISTLOCK_NAME $DISTLOCK_FENCE; exit 7",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with(&name), "{stdout}");
    if ctx.caps.has_fencing() {
        let fence = stdout.trim().rsplit(' ').next().unwrap_or("");
        assert!(
            fence.parse::<u64>().is_ok(),
            "no DISTLOCK_FENCE in {stdout:?}"
        );
    }
    let holder = ctx.locker().await;
    let g = holder.lock(&name).await.unwrap();
    let ran = scratch(&ctx, "ran");
    let touch = format!("touch {}", ran.display());
    let st = distlock(&ctx)
        .args(["run", "--no-wait", &name, "--", "sh", "-c", &touch])
        .status()
        .await
        .unwrap();
    assert_eq!(st.code(), Some(75));
    let t = Instant::now();
    let st = distlock(&ctx)
        .args(["run", "--wait", "500ms", &name, "--", "sh", "-c", &touch])
        .status()
        .await
        .unwrap();
    assert_eq!(st.code(), Some(75));
    assert!(t.elapsed() >= Duration::from_millis(500));
    assert!(!ran.exists(), "the command ran without the lock");
    g.release().await.unwrap();
    let st = distlock(&ctx)
        .args(["run", "--no-wait", &name, "--", "sh", "-c", &touch])
        .status()
        .await
        .unwrap();
    assert!(st.success() && ran.exists());
    let st = distlock(&ctx)
        .args(["run", &name, "--", "/nonexistent/cmd"])
        .status()
        .await
        .unwrap();
    assert_eq!(st.code(), Some(127));
    let st = distlock(&ctx)
        .args(["run", "bad\nname", "--", "true"])
        .status()
        .await
        .unwrap();
    assert_eq!(st.code(), Some(64));
}

/// SIGTERM to distlock reaches the command; distlock exits with the
/// command's status and the lock is free right after.
async fn signals_pass_through(ctx: Ctx) {
    let name = ctx.name("signals");
    let got = scratch(&ctx, "got-term");
    let ready = scratch(&ctx, "ready");
    let script = format!(
        "trap 'echo TERM > {g}; exit 3' TERM; touch {r}; while true; do sleep 0.05; done",
        g = got.display(),
        r = ready.display()
    );
    let mut child = distlock(&ctx)
        .args(["run", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    until_exists(&ready).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(st.code(), Some(3));
    assert!(got.exists(), "the command did not get SIGTERM");
    let free = ctx.locker().await.try_lock(&name).await.unwrap();
    assert!(free.is_some(), "the lock was not released");
}

/// The lease is lost while the command runs (the server is paused past the
/// ttl): the command gets SIGTERM and distlock exits with the lost code.
async fn lost_lease_stops_the_command(ctx: Ctx) {
    let server = spec(&ctx).server;
    let name = ctx.name("lost");
    let ready = scratch(&ctx, "ready");
    let script = format!("touch {}; exec sleep 60", ready.display());
    let mut child = distlock(&ctx)
        .args([
            "run", "--ttl", "2s", "--grace", "1s", &name, "--", "sh", "-c", &script,
        ])
        .spawn()
        .unwrap();
    until_exists(&ready).await;
    let resume = UndoOnDrop::new("resume", &[server]);
    compose("pause", server).await;
    let st = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    drop(resume);
    let st = st.expect("distlock did not stop the command").unwrap();
    assert_eq!(st.code(), Some(76), "{st}");
}

fn main() -> std::process::ExitCode {
    let targets = SPECS
        .iter()
        .map(|s| {
            let to_url = s.url;
            Target::new(s.target, Some(s.env), move |cfg| async move {
                Ok(UrlHarness::shared(to_url(&cfg), |u| {
                    Box::pin(async move { distlock::connect(&u).await })
                }))
            })
            .only_own_cases()
            .case("run_never_overlaps", |c| Box::pin(run_never_overlaps(c)))
            .case("exit_codes_and_environment", |c| {
                Box::pin(exit_codes_and_environment(c))
            })
            .case("signals_pass_through", |c| {
                Box::pin(signals_pass_through(c))
            })
            .case("lost_lease_stops_the_command", |c| {
                Box::pin(lost_lease_stops_the_command(c))
            })
        })
        .collect();
    run_serial(targets)
}
