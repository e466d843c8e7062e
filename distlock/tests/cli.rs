//! The real `distlock` binary against each backend's server (from compose/):
//! `run` never overlaps across processes, exit codes, a lost lease stops the
//! command, signals pass through, the command never outlives a dead or
//! stalled `distlock`, a signal while waiting leaves nothing queued, and a
//! command run from a terminal can read it. One case at a time: some pause
//! servers.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lockcore_conformance::{
    compose, run_serial, Ctx, Target, UndoOnDrop, UrlHarness, COMPOSE_HINT,
};
use tokio::process::Command;

/// The binary under test: the one cargo builds, or `LOCKTEST_DISTLOCK_BIN`
/// (an installed one).
fn bin() -> String {
    std::env::var("LOCKTEST_DISTLOCK_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_distlock").to_owned())
}

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
        env: "LOCKTEST_ZK_URL",
        server: "zk",
        url: |v| v.to_owned(),
    },
    #[cfg(feature = "etcd")]
    Spec {
        target: "cli-etcd",
        env: "LOCKTEST_ETCD_URL",
        server: "etcd",
        url: |v| v.to_owned(),
    },
    #[cfg(feature = "mysql")]
    Spec {
        target: "cli-mysql",
        env: "LOCKTEST_MYSQL_URL",
        server: "mariadb",
        url: |v| v.to_owned(),
    },
    #[cfg(feature = "postgres")]
    Spec {
        target: "cli-postgres",
        env: "LOCKTEST_POSTGRES_URL",
        server: "postgres",
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
    let mut c = Command::new(bin());
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

/// Whether process `pid` still runs (not gone, not a zombie).
fn running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name in parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("X");
    !matches!(state, "Z" | "X" | "x")
}

/// The pid a command wrote to `path`.
async fn pid_in(path: &std::path::Path) -> i32 {
    until_exists(path).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(Ok(p)) = std::fs::read_to_string(path).map(|s| s.trim().parse::<i32>()) {
            return p;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `pid` no longer runs, or fails after `within`.
async fn until_dead(pid: i32, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while running(pid) {
        assert!(
            Instant::now() < deadline,
            "{what}: the command still runs after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The process group of `pid`.
fn group_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    rest.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn signal_group(group: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(group), sig).unwrap();
}

/// Nanoseconds since the epoch, as `date +%s%N` writes them.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(pid, sig).unwrap();
}

async fn until_exists(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `distlock ARGS` `rounds` times one after another in a task; each
/// must succeed.
fn in_rounds(ctx: &Ctx, rounds: usize, args: &[&str]) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::spawn(async move {
        for _ in 0..rounds {
            let st = distlock(&ctx).args(&args).status().await.unwrap();
            assert!(st.success(), "distlock {args:?} failed: {st}");
        }
    })
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
    let procs: Vec<_> = (0..2)
        .map(|_| {
            in_rounds(
                &ctx,
                3,
                &["run", "--ttl", "5s", &name, "--", "sh", "-c", &script],
            )
        })
        .collect();
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

/// Starts two `distlock run <flags> name` whose commands run until `gate`
/// exists, and waits until both commands are running at once.
async fn run_together(
    ctx: &Ctx,
    flags: &[&str],
    name: &str,
    gate: &std::path::Path,
) -> Vec<tokio::process::Child> {
    let started = gate.with_extension("started");
    let _ = std::fs::remove_file(&started);
    let hold = format!(
        "echo $$ >> {s}; while [ ! -e {g} ]; do sleep 0.05; done",
        s = started.display(),
        g = gate.display()
    );
    let mut children = Vec::new();
    for _ in 0..2 {
        let mut c = distlock(ctx);
        c.arg("run")
            .args(flags)
            .args([name, "--", "sh", "-c", &hold]);
        children.push(c.spawn().unwrap());
    }
    let t = Instant::now();
    while std::fs::read_to_string(&started)
        .unwrap_or_default()
        .lines()
        .count()
        < 2
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "two commands never ran at once ({flags:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    children
}

/// `distlock run <flags> --no-wait name -- sh -c script`, to its end.
async fn run_no_wait(
    ctx: &Ctx,
    flags: &[&str],
    name: &str,
    script: &str,
) -> std::process::ExitStatus {
    distlock(ctx)
        .arg("run")
        .args(flags)
        .args(["--no-wait", name, "--", "sh", "-c", script])
        .status()
        .await
        .unwrap()
}

/// `run --permits 2`: two commands run at once, a third finds every permit
/// held (75, nothing run), and a freed permit lets it run.
async fn permits_bound_the_copies(ctx: Ctx) {
    let name = ctx.name("permits");
    let (gate, ran) = (scratch(&ctx, "gate"), scratch(&ctx, "ran"));
    let copies = run_together(&ctx, &["--permits", "2"], &name, &gate).await;
    let touch = format!("touch {}", ran.display());
    let st = run_no_wait(&ctx, &["--permits", "2"], &name, &touch).await;
    assert_eq!(st.code(), Some(75), "a third copy with two permits held");
    assert!(!ran.exists(), "the third copy ran");
    std::fs::write(&gate, b"").unwrap();
    for mut c in copies {
        assert!(c.wait().await.unwrap().success());
    }
    let st = run_no_wait(&ctx, &["--permits", "2"], &name, &touch).await;
    assert!(st.success() && ran.exists(), "a freed permit");
}

/// `run --shared`: readers run together; with a writer holding the
/// read-write lock (through the library), a reader does not run.
async fn shared_readers_run_together(ctx: Ctx) {
    let name = ctx.name("shared");
    let (gate, ran) = (scratch(&ctx, "rgate"), scratch(&ctx, "rran"));
    let readers = run_together(&ctx, &["--shared"], &name, &gate).await;
    let l = ctx.locker().await;
    let rw = distlock::RwLock::new(&l, &name).unwrap();
    assert!(
        rw.try_write().await.unwrap().is_none(),
        "a writer beside readers"
    );
    std::fs::write(&gate, b"").unwrap();
    for mut c in readers {
        assert!(c.wait().await.unwrap().success());
    }
    let w = rw.try_write().await.unwrap().expect("the readers are gone");
    let touch = format!("touch {}", ran.display());
    let st = run_no_wait(&ctx, &["--shared"], &name, &touch).await;
    assert_eq!(st.code(), Some(75), "a reader beside a writer");
    assert!(!ran.exists(), "the reader ran beside a writer");
    w.release().await.unwrap();
}

/// `run -x` takes the writer of the read-write lock `run -s` reads:
/// writers never overlap readers or each other (a history of marks), a
/// writer does not run beside readers, and a waiting writer is not starved
/// by readers arriving after it.
async fn exclusive_writers_exclude_everyone(ctx: Ctx) {
    let name = ctx.name("rw");
    // A history: two writers and two readers, two rounds each.
    let marks = scratch(&ctx, "rwmarks");
    let mut procs = Vec::new();
    for flag in ["-x", "-x", "-s", "-s"] {
        let script = format!(
            "echo start {flag} $$ $(date +%s%N) >> {m}; sleep 0.2; echo end {flag} $$ $(date +%s%N) >> {m}",
            m = marks.display()
        );
        let args = ["run", flag, "--ttl", "5s", &name, "--", "sh", "-c", &script];
        procs.push(in_rounds(&ctx, 2, &args));
    }
    for p in procs {
        p.await.unwrap();
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    // (flag, start, end) per command, by its shell's pid.
    let mut spans: std::collections::HashMap<&str, (&str, u128, u128)> = Default::default();
    for l in text.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let ts: u128 = f[3].parse().unwrap();
        let e = spans.entry(f[2]).or_insert((f[1], 0, 0));
        if f[0] == "start" {
            e.1 = ts;
        } else {
            e.2 = ts;
        }
    }
    assert_eq!(spans.len(), 8, "{text}");
    let spans: Vec<_> = spans.into_values().collect();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            let apart = a.2 <= b.1 || b.2 <= a.1;
            assert!(
                apart || (a.0 == "-s" && b.0 == "-s"),
                "a writer overlapped another holder ({a:?}, {b:?}):\n{text}"
            );
        }
    }

    // Readers run together; a writer does not run beside them.
    let (gate, ran) = (scratch(&ctx, "xgate"), scratch(&ctx, "xran"));
    let readers = run_together(&ctx, &["-s"], &name, &gate).await;
    let touch = format!("touch {}", ran.display());
    let st = run_no_wait(&ctx, &["-x"], &name, &touch).await;
    assert_eq!(st.code(), Some(75), "a writer beside readers");
    assert!(!ran.exists(), "the writer ran beside readers");

    // A writer waits for them; once it waits, readers that come later
    // wait behind it.
    let (wgate, order) = (scratch(&ctx, "wgate"), scratch(&ctx, "order"));
    let wscript = format!(
        "echo writer $(date +%s%N) >> {o}; while [ ! -e {g} ]; do sleep 0.05; done",
        o = order.display(),
        g = wgate.display()
    );
    let mut writer = distlock(&ctx)
        .args([
            "run", "-x", "--wait", "60s", &name, "--", "sh", "-c", &wscript,
        ])
        .spawn()
        .unwrap();
    // The writer is queued once a new reader's try is refused.
    let t = Instant::now();
    loop {
        let st = run_no_wait(&ctx, &["-s"], &name, "true").await;
        if st.code() == Some(75) {
            break;
        }
        assert!(st.success(), "{st}");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "readers kept passing a waiting writer"
        );
    }
    let rscript = format!("echo reader $(date +%s%N) >> {}", order.display());
    let mut late = distlock(&ctx)
        .args([
            "-v", "run", "-s", "--wait", "60s", &name, "--", "sh", "-c", &rscript,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It waits (it says so) before the readers inside leave.
    let mut said =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(late.stderr.take().unwrap()));
    while let Some(line) = said.next_line().await.unwrap() {
        if line.contains("waiting for") {
            break;
        }
    }
    std::fs::write(&gate, b"").unwrap();
    for mut c in readers {
        assert!(c.wait().await.unwrap().success());
    }
    until_exists(&order).await;
    // The writer runs: the server refuses a reader and a writer.
    let l = ctx.locker().await;
    let rw = distlock::RwLock::new(&l, &name).unwrap();
    assert!(
        rw.try_read().await.unwrap().is_none(),
        "a reader beside the writer"
    );
    assert!(rw.try_write().await.unwrap().is_none(), "two writers");
    std::fs::write(&wgate, b"").unwrap();
    assert!(writer.wait().await.unwrap().success());
    assert!(late.wait_with_output().await.unwrap().status.success());
    let text = std::fs::read_to_string(&order).unwrap();
    assert!(
        text.starts_with("writer"),
        "a reader that came after a waiting writer went first:\n{text}"
    );
}

/// `elect` runs the command while it leads, with its term as
/// DISTLOCK_FENCE; `leader` prints the leader the server names, and
/// `leader --watch` follows the changes. On a backend with no leader
/// election both are refused with a usage error.
async fn elect_and_leader(ctx: Ctx) {
    let name = ctx.name("elect");
    let (gate, ran, fence) = (
        scratch(&ctx, "egate"),
        scratch(&ctx, "eran"),
        scratch(&ctx, "efence"),
    );
    if !ctx.caps.values {
        let st = distlock(&ctx)
            .args(["elect", "--value", "a", &name, "--", "true"])
            .status()
            .await
            .unwrap();
        assert_eq!(st.code(), Some(64), "elect without leader election");
        let st = distlock(&ctx)
            .args(["leader", &name])
            .status()
            .await
            .unwrap();
        assert_eq!(st.code(), Some(64), "leader without leader election");
        return;
    }
    let leader_line = || async {
        let out = distlock(&ctx)
            .args(["leader", &name])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "distlock leader: {}", out.status);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(leader_line().await, "none");
    let hold = format!(
        "echo $DISTLOCK_FENCE > {f}.tmp; mv {f}.tmp {f}; while [ ! -e {g} ]; do sleep 0.05; done",
        f = fence.display(),
        g = gate.display()
    );
    let mut leading = distlock(&ctx)
        .args(["elect", "--value", "host-a", &name, "--", "sh", "-c", &hold])
        .spawn()
        .unwrap();
    until_exists(&fence).await;
    let term = std::fs::read_to_string(&fence).unwrap().trim().to_owned();
    let expected = if ctx.caps.has_fencing() {
        format!("term={term} host-a")
    } else {
        "term=- host-a".to_owned()
    };
    assert_eq!(leader_line().await, expected);
    // Checked on the server by another client: it cannot lead.
    let l = ctx.locker().await;
    let election = distlock::Election::new(&l, &name).unwrap();
    assert!(
        election.try_campaign("x").await.unwrap().is_none(),
        "a second leader"
    );
    let touch = format!("touch {}", ran.display());
    let st = distlock(&ctx)
        .args([
            "elect",
            "--no-wait",
            "--value",
            "host-b",
            &name,
            "--",
            "sh",
            "-c",
            &touch,
        ])
        .status()
        .await
        .unwrap();
    assert_eq!(st.code(), Some(75), "a second candidate with --no-wait");
    assert!(!ran.exists(), "the second candidate ran");
    let (mut watch, mut lines) = watch_leader(&ctx, &name);
    assert_eq!(next_line(&mut lines).await, expected);
    std::fs::write(&gate, b"").unwrap();
    assert!(leading.wait().await.unwrap().success());
    assert_eq!(next_line(&mut lines).await, "none", "the leader resigned");
    let ours = election
        .try_campaign("host-c")
        .await
        .unwrap()
        .expect("free");
    let line = next_line(&mut lines).await;
    assert!(line.ends_with(" host-c"), "{line}");
    signal(watch.id().unwrap(), nix::sys::signal::Signal::SIGTERM);
    assert!(
        watch.wait().await.unwrap().success(),
        "SIGTERM ends --watch"
    );
    // A reader that goes away (`| head -1`) ends --watch quietly.
    let (mut watch, mut lines) = watch_leader(&ctx, &name);
    assert!(next_line(&mut lines).await.ends_with(" host-c"));
    // No change comes: it notices without writing.
    drop(lines);
    let st = tokio::time::timeout(Duration::from_secs(10), watch.wait())
        .await
        .expect("--watch ends once its output is closed, with no change to print")
        .unwrap();
    assert!(st.success(), "--watch with its output closed: {st}");
    ours.resign().await.unwrap();
}

/// `distlock leader --watch name`, and the lines it prints.
fn watch_leader(
    ctx: &Ctx,
    name: &str,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    let mut watch = distlock(ctx)
        .args(["leader", "--watch", name])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = watch.stdout.take().unwrap();
    let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(out));
    (watch, lines)
}

/// The next line a child prints, within 20 s.
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(lines: &mut tokio::io::Lines<R>) -> String {
    tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("the child still runs")
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
    let daemon = scratch(&ctx, "daemon");
    let script = format!(
        "{}; touch {}; exec sleep 60",
        double_fork(&daemon),
        ready.display()
    );
    let mut child = distlock(&ctx)
        .args([
            "run", "--ttl", "2s", "--grace", "1s", &name, "--", "sh", "-c", &script,
        ])
        .spawn()
        .unwrap();
    until_exists(&ready).await;
    let daemon = pid_in(&daemon).await;
    assert!(running(daemon));
    let resume = UndoOnDrop::new("resume", &[server]);
    compose("pause", server).await;
    let st = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
    drop(resume);
    let st = st.expect("distlock did not stop the command").unwrap();
    assert_eq!(st.code(), Some(76), "{st}");
    until_dead(
        daemon,
        Duration::from_secs(2),
        "a daemon the command started",
    )
    .await;
}

/// A shell line that starts a daemon as `nohup cmd &` and daemonizing
/// servers do (a new session, then a second fork whose parent exits), and
/// writes its pid to `pidfile`.
fn double_fork(pidfile: &std::path::Path) -> String {
    format!(
        "setsid sh -c 'sleep 120 & echo $! > {p}.tmp; mv {p}.tmp {p}' < /dev/null > /dev/null 2>&1",
        p = pidfile.display()
    )
}

/// `distlock` killed with SIGKILL while its command runs: the command dies
/// with it at once (it would otherwise run on, lease-less, beside the next
/// holder's).
async fn command_dies_with_distlock(ctx: Ctx) {
    let name = ctx.name("orphan");
    let pidfile = scratch(&ctx, "pid");
    let daemon = scratch(&ctx, "orphan-daemon");
    let script = format!(
        "{}; echo $$ > {}; sleep 30",
        double_fork(&daemon),
        pidfile.display()
    );
    let mut child = distlock(&ctx)
        .args(["run", "--ttl", "2s", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid = pid_in(&pidfile).await;
    let daemon = pid_in(&daemon).await;
    signal(child.id().unwrap(), nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait().await;
    until_dead(pid, Duration::from_secs(2), "distlock was killed").await;
    until_dead(daemon, Duration::from_secs(2), "a daemon, distlock killed").await;
    // The server frees the name by the ttl; the next holder runs alone.
    let g = ctx
        .locker()
        .await
        .lock_timeout(&name, Duration::from_secs(10))
        .await
        .expect("the name is free after the ttl");
    g.release().await.unwrap();
}

/// `distlock run --lock-delay` killed with SIGKILL: the name stays taken
/// for the delay beyond the dead holder's validity (which had not passed
/// when it was killed), on the server; another client is granted no
/// earlier than the delay after the kill, with a larger token.
async fn lock_delay_outlives_a_killed_distlock(ctx: Ctx) {
    if ctx.caps.lock_delay == distlock::LockDelay::Unsupported {
        // PostgreSQL: a connection lease, freed at once when it closes.
        // The delay is refused before the command runs.
        assert_eq!(
            spec(&ctx).target,
            "cli-postgres",
            "every other CLI target enforces a lock-delay"
        );
        let ran = scratch(&ctx, "ran");
        let touch = format!("touch {}", ran.display());
        let name = ctx.name("delay-refused");
        let url = (spec(&ctx).url)(&ctx.config);
        let args = ["run", "--lock-delay", "2s", &name, "--", "sh", "-c", &touch];
        let (code, _, err) = with_url(&url, &args).await;
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains("lock-delay"), "{err}");
        assert!(!ran.exists(), "the command ran");
        return;
    }
    let name = ctx.name("delay-killed");
    let pidfile = scratch(&ctx, "pid-delay");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let (ttl, delay) = (Duration::from_secs(2), Duration::from_secs(4));
    let mut child = distlock(&ctx)
        .args(["run", "--ttl", "2s", "--lock-delay", "4s", &name, "--"])
        .args(["sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid = pid_in(&pidfile).await;
    let locker = ctx.locker().await;
    let before = locker.inspect(&name).await.unwrap();
    let killed = Instant::now();
    signal(child.id().unwrap(), nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait().await;
    until_dead(pid, Duration::from_secs(2), "distlock was killed").await;
    assert!(
        locker.try_lock(&name).await.unwrap().is_none(),
        "free right after the kill"
    );
    let g = locker
        .lock_timeout(&name, ttl + delay + Duration::from_secs(10))
        .await
        .expect("the name is free after the ttl and the delay");
    let after = killed.elapsed();
    assert!(
        after >= delay,
        "granted {after:?} after the kill: within the lock-delay {delay:?}"
    );
    if let Some(old) = before.and_then(|i| i.holder).and_then(|h| h.fence) {
        assert!(g.fence().expect("a token") > old, "tokens did not rise");
    }
    g.release().await.unwrap();
}

/// `distlock` stopped (SIGSTOP, as a stalled process) while its command
/// runs: the command is killed by the lease's validity deadline, and once
/// `distlock` goes on it reports the lost lease.
async fn stalled_distlock_stops_the_command(ctx: Ctx) {
    let name = ctx.name("stalled");
    let pidfile = scratch(&ctx, "pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut child = distlock(&ctx)
        .args(["run", "--ttl", "2s", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid = pid_in(&pidfile).await;
    let id = child.id().unwrap();
    signal(id, nix::sys::signal::Signal::SIGSTOP);
    until_dead(pid, Duration::from_secs(4), "distlock was stopped").await;
    signal(id, nix::sys::signal::Signal::SIGCONT);
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("distlock went on")
        .unwrap();
    assert_eq!(st.code(), Some(76), "{st}");
}

/// The command ends by itself while `distlock` is stopped past the lease's
/// validity: when `distlock` goes on, the command's exit and the lost lease
/// are both there, and it reports the loss (76), not the command's status.
async fn exit_and_loss_together_report_lost(ctx: Ctx) {
    let name = ctx.name("together");
    let pidfile = scratch(&ctx, "pid");
    let script = format!("echo $$ > {}; sleep 1", pidfile.display());
    let mut child = distlock(&ctx)
        .args(["run", "--ttl", "2s", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    pid_in(&pidfile).await;
    let id = child.id().unwrap();
    signal(id, nix::sys::signal::Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(4)).await;
    signal(id, nix::sys::signal::Signal::SIGCONT);
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("distlock went on")
        .unwrap();
    assert_eq!(st.code(), Some(76), "{st}");
}

/// The command's group (its supervisor too) is stopped while `distlock`
/// goes on renewing, so that heartbeats pile up unread; then `distlock` is
/// stopped past the lease's validity, and the group resumes first: the
/// heartbeats it reads late must not let the command run on.
async fn stale_heartbeats_never_outrun_the_deadline(ctx: Ctx) {
    stale_heartbeats_round(&ctx, 0).await;
}

async fn stale_heartbeats_round(ctx: &Ctx, round: u32) {
    use nix::sys::signal::Signal;
    let name = ctx.name(&format!("stale/{round}"));
    let marks = scratch(ctx, &format!("marks-{round}"));
    let pidfile = scratch(ctx, &format!("pid-{round}"));
    let script = format!(
        "echo $$ > {p}; while true; do date +%s%N >> {m}; sleep 0.01; done",
        p = pidfile.display(),
        m = marks.display()
    );
    let mut child = distlock(ctx)
        .args(["run", "--ttl", "2s", &name, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let group = group_of(pid_in(&pidfile).await);
    signal_group(group, Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let id = child.id().unwrap();
    signal(id, Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resumed = now_ns();
    signal_group(group, Signal::SIGCONT);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = std::fs::read_to_string(&marks).unwrap_or_default();
    let last: u128 = text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    signal(id, Signal::SIGCONT);
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(group), Signal::SIGKILL);
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("distlock went on")
        .unwrap();
    assert!(
        last <= resumed + 200_000_000,
        "the command ran on {} ms after resuming, with the lease gone",
        last.saturating_sub(resumed) / 1_000_000
    );
    assert_eq!(st.code(), Some(76), "{st}");
}

/// What the command started in the background, in its process group or in
/// a session of its own, does not outlive it: the lock is released only
/// once nothing of the command runs.
async fn nothing_the_command_started_outlives_it(ctx: Ctx) {
    let name = ctx.name("children");
    let (a, b) = (scratch(&ctx, "late-a"), scratch(&ctx, "late-b"));
    let script = format!(
        "(sleep 1; touch {a}) & setsid sh -c 'sleep 1; touch {b}' & exit 0",
        a = a.display(),
        b = b.display()
    );
    let st = distlock(&ctx)
        .args(["run", &name, "--", "sh", "-c", &script])
        .status()
        .await
        .unwrap();
    assert!(st.success(), "{st}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!a.exists(), "a background child of the command outlived it");
    assert!(
        !b.exists(),
        "a child in a session of its own outlived the command"
    );
}

/// SIGTERM while `distlock run` waits for a held lock: it exits 143 without
/// running the command and leaves nothing queued on the server (the next
/// holder gets the name right after the release).
async fn signal_while_waiting_leaves_nothing(ctx: Ctx) {
    let name = ctx.name("term-waiting");
    let holder = ctx.locker().await;
    let g = holder.lock(&name).await.unwrap();
    let ran = scratch(&ctx, "ran");
    let touch = format!("touch {}", ran.display());
    let mut child = distlock(&ctx)
        .args(["run", "--ttl", "30s", &name, "--", "sh", "-c", &touch])
        .spawn()
        .unwrap();
    // Let it queue (nothing to await from outside).
    tokio::time::sleep(Duration::from_secs(1)).await;
    signal(child.id().unwrap(), nix::sys::signal::Signal::SIGTERM);
    let st = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("distlock ended")
        .unwrap();
    assert_eq!(st.code(), Some(143), "{st}");
    assert!(!ran.exists(), "the command ran");
    g.release().await.unwrap();
    let next = ctx
        .locker()
        .await
        .lock_timeout(&name, Duration::from_secs(3))
        .await
        .expect("nothing was left queued by the signalled distlock");
    next.release().await.unwrap();
}

/// Run from a terminal (a pty from `script(1)`), the command can read the
/// terminal: it is not stopped by SIGTTIN in a background process group
/// while the lock is renewed forever.
async fn command_in_a_terminal_reads_it(ctx: Ctx) {
    let name = ctx.name("tty");
    let url = (spec(&ctx).url)(&ctx.config);
    let inner = format!(
        "DISTLOCK_URL='{url}' {} run {name} -- sh -c 'read x; echo got:$x'",
        bin()
    );
    let mut child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux");
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"hello\n")
        .await
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), async {
        let mut out = String::new();
        let mut stdout = child.stdout.take().unwrap();
        let mut buf = [0u8; 256];
        while !out.contains("got:hello") {
            let n = tokio::io::AsyncReadExt::read(&mut stdout, &mut buf)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        out
    })
    .await;
    drop(stdin);
    let _ = child.kill().await;
    let out = out.expect("the command never read the terminal (stopped in the background?)");
    assert!(out.contains("got:hello"), "{out}");
}

/// A wait on a server that stopped answering ends with 69 (unavailable),
/// not 75 (the lock is held): the two call for different actions.
async fn silent_server_is_unavailable_not_held(ctx: Ctx) {
    let server = spec(&ctx).server;
    let name = ctx.name("silent");
    let resume = UndoOnDrop::new("resume", &[server]);
    compose("pause", server).await;
    let t = Instant::now();
    let st = tokio::time::timeout(
        Duration::from_secs(30),
        distlock(&ctx)
            .args(["run", "--wait", "1s", &name, "--", "true"])
            .status(),
    )
    .await;
    drop(resume);
    let st = st.expect("distlock hung on a paused server").unwrap();
    assert_eq!(st.code(), Some(69), "{st} after {:?}", t.elapsed());
}

/// `distlock` with `args`, no URL from the environment: (exit code,
/// stdout, stderr).
async fn local(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("DISTLOCK_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("distlock runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Usage errors (an unknown flag, a missing name, a bad duration) exit 64
/// as `--help` says, not clap's 2; `--help` and `--version` exit 0.
async fn usage_errors_exit_64(_ctx: Ctx) {
    for args in [
        &["--url", "memory://", "inspect", "--no-such-flag", "x"][..],
        &["--url", "memory://", "inspect"],
        &[
            "--url",
            "redis://127.0.0.1:1",
            "run",
            "--ttl",
            "soon",
            "x",
            "--",
            "true",
        ],
        &["no-such-command"],
    ] {
        let (code, _, err) = local(args).await;
        assert_eq!(code, Some(64), "{args:?}: {err}");
    }
    for args in [&["--help"][..], &["--version"], &["run", "--help"]] {
        let (code, out, err) = local(args).await;
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!out.is_empty(), "{args:?} printed nothing");
    }
}

/// Output to a closed pipe ends quietly: no panic, no exit 101.
async fn closed_stdout_ends_quietly(_ctx: Ctx) {
    for args in [
        &["--url", "memory://", "inspect", "x"][..],
        &["--url", "memory://", "inspect", "--json", "x"],
    ] {
        let mut child = Command::new(bin())
            .args(args)
            .env_remove("DISTLOCK_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader goes away before anything is written.
        drop(child.stdout.take());
        let out = child.wait_with_output().await.expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {err}");
    }
}

/// `memory://` lives in one process: `run`, `elect` and `leader` refuse
/// it (exit 64, saying why); `inspect` keeps it.
async fn memory_is_refused_where_processes_meet(_ctx: Ctx) {
    for args in [
        &["--url", "memory://", "run", "x", "--", "true"][..],
        &[
            "--url",
            "MEMORY://",
            "elect",
            "--value",
            "v",
            "x",
            "--",
            "true",
        ],
        &["--url", "memory://", "leader", "x"],
        &[
            "--url",
            "migrate:memory://a|memory://b",
            "run",
            "x",
            "--",
            "true",
        ],
        &["--url", "memory:x", "run", "x", "--", "true"],
    ] {
        let (code, _, err) = local(args).await;
        assert_eq!(code, Some(64), "{args:?}: {err}");
        assert!(err.contains("one process"), "{args:?}: {err}");
    }
    let (code, _, err) = local(&["--url", "memory://", "inspect", "x"]).await;
    assert_eq!(code, Some(0), "{err}");
}

/// Every subcommand's `--help` has an example line.
async fn every_help_has_an_example(_ctx: Ctx) {
    for sub in [
        "run",
        "elect",
        "leader",
        "inspect",
        "ls",
        "bench",
        "completions",
        "man",
    ] {
        let (code, out, _) = local(&[sub, "--help"]).await;
        assert_eq!(code, Some(0));
        assert!(
            out.contains("Example") && out.contains("distlock "),
            "`distlock {sub} --help` has no example:\n{out}"
        );
    }
}

/// `bench --held-only` measures the held leases and nothing else.
async fn bench_held_only(_ctx: Ctx) {
    let (code, out, err) = local(&[
        "--url",
        "memory://",
        "bench",
        "--held-only",
        "--held",
        "200",
        "--duration",
        "300ms",
        "--json",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["held"]["leases"], 200, "{out}");
    assert_eq!(v["held"]["all_held"], true, "{out}");
    assert!(v.get("uncontended_1_task_pairs_per_s").is_none(), "{out}");
}

/// `bench --json --metrics` reports the library's metrics under the names
/// an exporter shows; `--metrics` without `--json` is a usage error.
async fn bench_metrics_use_the_library_names(_ctx: Ctx) {
    let args = [
        "--url",
        "memory://",
        "bench",
        "--duration",
        "200ms",
        "--held",
        "10",
    ];
    let (code, out, err) = local(&[&args[..], &["--json", "--metrics"]].concat()).await;
    if !cfg!(feature = "metrics") {
        assert!(err.contains("`metrics` feature"), "{err}");
        return;
    }
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let m = &v["metrics"];
    let granted = m[lockcore::observe::ACQUISITIONS]
        .as_array()
        .expect("acquisitions")
        .iter()
        .find(|s| s["labels"]["result"] == "granted" && s["labels"]["primitive"] == "lock")
        .expect("granted locks");
    assert_eq!(granted["labels"]["backend"], "memory", "{granted}");
    assert!(granted["value"].as_u64() > Some(0), "{granted}");
    let handoffs = &m[lockcore::observe::HANDOFFS][0]["value"];
    assert!(
        handoffs.as_u64() > Some(0),
        "the contended figure hands off: {m}"
    );
    let wait = &m[lockcore::observe::ACQUIRE_WAIT][0];
    assert!(
        wait["count"].as_u64() > Some(0) && wait["p99"].is_f64(),
        "{wait}"
    );

    let (code, _, err) = local(&[&args[..], &["--metrics"]].concat()).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--json"), "{err}");
}

/// Schemes are case-insensitive: the backend's URL with its scheme in
/// capitals works as it is.
async fn schemes_are_case_insensitive(ctx: Ctx) {
    let url = (spec(&ctx).url)(&ctx.config);
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let upper = format!("{}://{rest}", scheme.to_ascii_uppercase());
    let (code, out, err) = local(&["--url", &upper, "inspect", &ctx.name("caps")]).await;
    assert_eq!(code, Some(0), "{upper}: {out}{err}");
}

/// A name that starts with `-` is given with `--name` (every command) or
/// after `--` (`inspect`, `leader`).
async fn names_starting_with_a_dash(ctx: Ctx) {
    let name = format!("-{}", ctx.name("dash"));
    let out = distlock(&ctx)
        .args([
            "run",
            "--name",
            &name,
            "--",
            "sh",
            "-c",
            "echo \"$DISTLOCK_NAME\"",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), name);
    let holder = ctx.locker().await;
    let g = holder.lock(&name).await.unwrap();
    for args in [
        &["inspect", "--", &name][..],
        &["inspect", &format!("--name={name}")],
    ] {
        let out = distlock(&ctx).args(args).output().await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}");
        assert!(
            text.contains(&format!("{name:?}")) && !text.contains("free"),
            "{text}"
        );
    }
    g.release().await.unwrap();
}

/// `distlock inspect --json` of `name` on this target.
async fn inspect_json(ctx: &Ctx, args: &[&str]) -> serde_json::Value {
    let out = distlock(ctx)
        .arg("inspect")
        .arg("--json")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `distlock ls --json` on this target.
async fn ls_json(ctx: &Ctx, args: &[&str]) -> serde_json::Value {
    let out = distlock(ctx)
        .args(["ls", "--json"])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `inspect` shows every primitive on a name (the lock, a semaphore's
/// permits, a read-write lock's readers and writer, an election's leader
/// and term), with the tokens the server gave, and the remaining ttl where
/// leases have one; `ls` lists them under a prefix, bounded by `--limit`.
async fn inspect_and_ls_show_every_primitive(ctx: Ctx) {
    let (name, elected) = (ctx.name("every"), ctx.name("every-e"));
    let l = ctx.locker().await;
    let fenced = ctx.caps.has_fencing();
    let ttl_kept = ctx.caps.lease == distlock::LeaseKind::Ttl;
    let g = l.try_lock(&name).await.unwrap().expect("free");
    let sem = distlock::Semaphore::new(&l, &name, 3).unwrap();
    let p1 = sem.try_acquire().await.unwrap().expect("a permit");
    let p2 = sem.try_acquire().await.unwrap().expect("a permit");
    let rw = distlock::RwLock::new(&l, &name).unwrap();
    let r = rw.try_read().await.unwrap().expect("a reader");
    let v = inspect_json(&ctx, &["--permits", "3", &name]).await;
    assert_eq!(v["held"], true, "{v}");
    if fenced {
        assert_eq!(v["holder"]["fence"].as_u64(), g.fence(), "{v}");
    }
    assert_eq!(v["holder"]["ttl_remaining_ms"].is_u64(), ttl_kept, "{v}");
    assert_eq!(v["permits"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["permits_total"], 3, "{v}");
    let mut fences: Vec<_> = v["permits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["holder"]["fence"].as_u64())
        .collect();
    fences.sort();
    let mut want = vec![p1.fence(), p2.fence()];
    want.sort();
    // MySQL's native semaphore cannot tell which permit each holder has.
    if fenced && ctx.caps.semaphore_layout == distlock::Layout::Built {
        assert_eq!(fences, want, "{v}");
    }
    assert_eq!(v["readers"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(v["writer"].is_null(), "{v}");
    let text = distlock(&ctx)
        .args(["inspect", "--permits", "3", &name])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("permits: 2 of 3 held") && text.contains("readers: 1"),
        "{text}"
    );

    r.release().await.unwrap();
    let w = rw.try_write().await.unwrap().expect("no reader left");
    let v = inspect_json(&ctx, &[&name]).await;
    assert_eq!(v["writer"]["writing"], true, "{v}");
    // MySQL's native read-write lock cannot name its writer.
    if fenced
        && !(spec(&ctx).target == "cli-mysql" && ctx.caps.rw_layout == distlock::Layout::Native)
    {
        assert_eq!(v["writer"]["holder"]["fence"].as_u64(), w.fence(), "{v}");
    }
    assert_eq!(v["readers"].as_array().map(Vec::len), Some(0), "{v}");

    let election = distlock::Election::new(&l, &elected).unwrap();
    let lead = election.try_campaign("node-1").await.unwrap();
    if let Some(lead) = &lead {
        let v = inspect_json(&ctx, &[&elected]).await;
        assert_eq!(v["holder"]["value"], "node-1", "{v}");
        if fenced {
            assert_eq!(v["holder"]["fence"].as_u64(), lead.term(), "{v}");
        }
    }

    let prefix = ctx.name("every");
    let v = ls_json(&ctx, &[&prefix]).await;
    let kinds = |v: &serde_json::Value, n: &str| {
        let mut k: Vec<String> = v["held"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["name"] == n)
            .map(|h| h["kind"].as_str().unwrap().to_owned())
            .collect();
        k.sort();
        k
    };
    assert_eq!(
        kinds(&v, &name),
        ["lock", "permit", "permit", "writer"],
        "{v}"
    );
    if lead.is_some() {
        assert_eq!(kinds(&v, &elected), ["leader"], "{v}");
    }
    assert_eq!(v["truncated"], false, "{v}");
    let full = ls_json(&ctx, &[&prefix]).await;
    let v = ls_json(&ctx, &["--limit", "1", &prefix]).await;
    assert_eq!(v["truncated"], true, "{v}");
    assert_eq!(
        kinds(&v, &name),
        kinds(&full, &name),
        "a name cut short: {v}"
    );
    assert!(
        v["held"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["name"] == name),
        "one name: {v}"
    );

    for p in [p1, p2] {
        p.release().await.unwrap();
    }
    w.release().await.unwrap();
    g.release().await.unwrap();
    if let Some(lead) = lead {
        lead.resign().await.unwrap();
    }
    let v = inspect_json(&ctx, &[&name]).await;
    assert_eq!(v["held"], false, "{v}");
    let v = ls_json(&ctx, &[&prefix]).await;
    assert_eq!(v["held"].as_array().map(Vec::len), Some(0), "{v}");
}

/// Names that backends store specially (Redis: a leading `}`; etcd: `.`
/// and `..`) are inspected and listed like any other.
async fn odd_names_are_inspected_and_listed(ctx: Ctx) {
    let l = ctx.locker().await;
    let brace = format!("}}{}", ctx.name("brace"));
    for name in [brace.as_str(), ".", ".."] {
        let sem = distlock::Semaphore::new(&l, name, 3).unwrap();
        let p = sem.try_acquire().await.unwrap().expect("a permit");
        let rw = distlock::RwLock::new(&l, name).unwrap();
        let r = rw.try_read().await.unwrap().expect("a reader");
        let v = inspect_json(&ctx, &["--", name]).await;
        assert_eq!(
            v["permits"].as_array().map(Vec::len),
            Some(1),
            "{name:?}: {v}"
        );
        assert_eq!(
            v["readers"].as_array().map(Vec::len),
            Some(1),
            "{name:?}: {v}"
        );
        let listed = ls_json(&ctx, &["--", name]).await;
        assert!(
            listed["held"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["name"] == name),
            "{name:?} not listed: {listed}"
        );
        p.release().await.unwrap();
        r.release().await.unwrap();
    }
}

/// A key another program wrote that is not UTF-8 (Redis allows any bytes)
/// is passed over by `ls` and `inspect`, not an error.
async fn foreign_binary_keys_are_passed_over(ctx: Ctx) {
    if spec(&ctx).target != "cli-redis" {
        return;
    }
    let hp = host_port(&(spec(&ctx).url)(&ctx.config));
    let name = ctx.name("binary");
    let mut key = format!("lock:{{{name}").into_bytes();
    key.extend_from_slice(b"\xff\xfe}");
    redis_raw(&hp, &[b"SET", &key, b"x"]);
    let l = ctx.locker().await;
    let g = l.lock(&name).await.unwrap();
    let v = inspect_json(&ctx, &[&name]).await;
    assert_eq!(v["held"], true, "{v}");
    let v = ls_json(&ctx, &[&name]).await;
    assert_eq!(v["held"].as_array().map(Vec::len), Some(1), "{v}");
    g.release().await.unwrap();
    redis_raw(&hp, &[b"DEL", &key]);
}

/// One Redis command with binary arguments; the first line of the reply.
fn redis_raw(addr: &str, args: &[&[u8]]) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a);
        req.extend_from_slice(b"\r\n");
    }
    stream.write_all(&req).unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    line.trim_end().to_owned()
}

/// A stderr that is closed or full loses messages; the exit code stays
/// the one the table gives (no panic, no 101).
async fn closed_stderr_keeps_the_exit_code(ctx: Ctx) {
    let name = ctx.name("stderr");
    let l = ctx.locker().await;
    let g = l.lock(&name).await.unwrap();
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full");
    for (args, want) in [
        (vec!["run", "--no-wait", name.as_str(), "--", "true"], 75),
        (vec!["--url", "redis://127.0.0.1:1", "inspect", "x"], 69),
    ] {
        let mut c = distlock(&ctx);
        c.args(&args).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        drop(child.stderr.take());
        let st = child.wait().await.unwrap();
        assert_eq!(st.code(), Some(want), "{args:?}, stderr closed");
        if let Some(f) = full.as_ref().ok().and_then(|f| f.try_clone().ok()) {
            let st = distlock(&ctx).args(&args).stderr(f).status().await.unwrap();
            assert_eq!(st.code(), Some(want), "{args:?}, stderr full");
        }
    }
    g.release().await.unwrap();
}

/// MySQL keeps a row for every name ever used: a listing that stops
/// after its last page before a held name says it may be incomplete.
async fn a_listing_cut_short_says_so(ctx: Ctx) {
    if spec(&ctx).target != "cli-mysql" {
        return;
    }
    use sqlx::Connection;
    let prefix = ctx.name("rows");
    let mut db = sqlx::MySqlConnection::connect(&(spec(&ctx).url)(&ctx.config))
        .await
        .unwrap();
    // 2100 free rows (more than `ls --limit 1` reads: 32 pages of 64)
    // before the held one.
    sqlx::query(
        "INSERT IGNORE INTO lockcore_locks (name) \
         SELECT CONCAT(?, '-a', LPAD(a.d * 1000 + b.d * 100 + c.d * 10 + e.d, 5, '0')) \
         FROM (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2) a, \
         (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
          UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b, \
         (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
          UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c, \
         (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
          UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) e \
         WHERE a.d * 1000 + b.d * 100 + c.d * 10 + e.d < 2100",
    )
    .bind(&prefix)
    .execute(&mut db)
    .await
    .unwrap();
    let last = format!("{prefix}-z");
    let l = ctx.locker().await;
    let g = l.lock(&last).await.unwrap();
    let (rows,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM lockcore_locks WHERE name LIKE CONCAT(?, '-a%')")
            .bind(&prefix)
            .fetch_one(&mut db)
            .await
            .unwrap();
    assert_eq!(rows, 2100);
    let v = ls_json(&ctx, &["--limit", "1", &prefix]).await;
    let listed = v["held"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["name"] == last);
    assert!(
        listed || v["truncated"] == true,
        "held, not listed, not truncated: {v}"
    );
    g.release().await.unwrap();
    sqlx::query("DELETE FROM lockcore_locks WHERE name LIKE CONCAT(?, '-a%')")
        .bind(&prefix)
        .execute(&mut db)
        .await
        .unwrap();
}

/// `run -v` says who holds the name it waits for, and since when.
async fn run_verbose_says_who_holds(ctx: Ctx) {
    let name = ctx.name("who");
    let l = ctx.locker().await;
    let g = l.lock(&name).await.unwrap();
    let mut child = distlock(&ctx)
        .args(["-v", "run", "--wait", "30s", &name, "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stderr.take().unwrap()));
    let said = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("waiting for") {
                return line;
            }
        }
        panic!("distlock ended without saying who holds the name");
    })
    .await
    .expect("nothing said within 20 s");
    assert!(said.contains("held by"), "{said}");
    if let Some(f) = g.fence() {
        assert!(said.contains(&format!("fence {f}")), "{said}");
    }
    g.release().await.unwrap();
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("ran after the release")
        .unwrap();
    assert!(st.success(), "{st}");
}

/// The exit codes `distlock --help` lists (`cmd` for the command's own
/// status, `129-143` as written), in order.
async fn codes_in_help() -> Vec<String> {
    let (_, help, _) = local(&["--help"]).await;
    let table = help
        .split_once("Exit codes")
        .expect("an exit code table in --help")
        .1;
    table
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Every exit code of the table in `--help` (and the README's, the same)
/// is walked: each has a scenario that gives it, through the real binary
/// against Redis.
async fn every_exit_code_in_the_table(ctx: Ctx) {
    if spec(&ctx).target != "cli-redis" {
        return;
    }
    let codes = codes_in_help().await;
    assert!(codes.len() >= 10, "{codes:?}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let url = (spec(&ctx).url)(&ctx.config);
    let hp = host_port(&url);
    let l = ctx.locker().await;
    for code in &codes {
        assert!(
            readme.contains(&format!("| `{code}` |")),
            "exit code {code} of --help is not in the README's table"
        );
        let name = ctx.name(&format!("code-{code}"));
        let run = |args: &[&str]| {
            let mut c = distlock(&ctx);
            c.args(args);
            c
        };
        let got = match code.as_str() {
            "cmd" => run(&["run", &name, "--", "sh", "-c", "exit 7"])
                .status()
                .await
                .unwrap()
                .code()
                .map(|c| if c == 7 { 0 } else { c }),
            "0" => run(&["inspect", &name]).status().await.unwrap().code(),
            "64" => run(&["run", "--ttl", "soon", &name, "--", "true"])
                .status()
                .await
                .unwrap()
                .code(),
            "69" => with_url("redis://127.0.0.1:1", &["inspect", &name]).await.0,
            "70" => {
                // A fencing counter of the wrong type: the server refuses
                // the acquisition's script.
                let fence_key = format!("lock:{{{name}}}:fence");
                redis_cmds(&hp, &[&["LPUSH", &fence_key, "x"]]);
                let c = run(&["run", &name, "--", "true"])
                    .status()
                    .await
                    .unwrap()
                    .code();
                redis_cmds(&hp, &[&["DEL", &fence_key]]);
                c
            }
            "75" => {
                let g = l.lock(&name).await.unwrap();
                let c = run(&["run", "--no-wait", &name, "--", "true"])
                    .status()
                    .await
                    .unwrap()
                    .code();
                g.release().await.unwrap();
                c
            }
            "76" => {
                let ready = scratch(&ctx, "code-76");
                let script = format!("touch {}; exec sleep 30", ready.display());
                let mut child = run(&[
                    "run", "--ttl", "2s", "--grace", "1s", &name, "--", "sh", "-c", &script,
                ])
                .spawn()
                .unwrap();
                until_exists(&ready).await;
                // An operator takes the lock away: the renewal is refused.
                redis_cmds(&hp, &[&["DEL", &format!("lock:{{{name}}}")]]);
                tokio::time::timeout(Duration::from_secs(20), child.wait())
                    .await
                    .expect("lost")
                    .unwrap()
                    .code()
            }
            "77" => {
                with_url(&format!("redis://:wrong@{hp}"), &["inspect", &name])
                    .await
                    .0
            }
            "127" => run(&["run", &name, "--", "/nonexistent/command"])
                .status()
                .await
                .unwrap()
                .code(),
            "129-143" => {
                let g = l.lock(&name).await.unwrap();
                let mut child = run(&["-v", "run", &name, "--", "true"])
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
                    child.stderr.take().unwrap(),
                ));
                while let Some(line) = lines.next_line().await.unwrap() {
                    if line.contains("waiting for") {
                        break;
                    }
                }
                signal(child.id().unwrap(), nix::sys::signal::Signal::SIGTERM);
                let c = child.wait().await.unwrap().code();
                g.release().await.unwrap();
                c.filter(|c| (129..=143).contains(c)).map(|_| 129)
            }
            other => panic!("exit code {other} in --help has no scenario here"),
        };
        let want = match code.as_str() {
            "cmd" => 0,
            "129-143" => 129,
            n => n.parse().unwrap(),
        };
        assert_eq!(got, Some(want), "exit code {code}");
    }
}

/// `distlock completions SHELL` prints a script for bash, zsh and fish
/// (bash's parses), and `distlock man` a manual page with the exit codes.
async fn completions_and_man_page(_ctx: Ctx) {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = local(&["completions", shell]).await;
        assert_eq!(code, Some(0), "{shell}: {err}");
        assert!(
            out.contains("distlock") && out.contains("exclusive"),
            "{shell}: {out}"
        );
    }
    let (_, bash, _) = local(&["completions", "bash"]).await;
    let script =
        std::env::temp_dir().join(format!("distlock-completion-{}.bash", std::process::id()));
    std::fs::write(&script, bash).unwrap();
    let st = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .await
        .unwrap();
    let _ = std::fs::remove_file(&script);
    assert!(st.success(), "bash cannot parse the completion script");
    let (code, _, err) = local(&["completions", "tcsh"]).await;
    assert_eq!(code, Some(64), "{err}");
    let (code, page, err) = local(&["man"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        page.contains(".TH distlock 1") && page.contains("Exit codes") && page.contains("77"),
        "{page}"
    );
}

/// `host:port` of a `scheme://[user@]host:port[/...]` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?', ','])
        .next()
        .unwrap_or(rest)
        .to_owned()
}

/// Sends Redis commands on one connection (RESP, by hand) and returns the
/// first line of each reply.
fn redis_cmds(addr: &str, cmds: &[&[&str]]) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    cmds.iter()
        .map(|args| {
            let mut req = format!("*{}\r\n", args.len());
            for a in *args {
                req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
            }
            w.write_all(req.as_bytes()).unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            if let Some(n) = line
                .strip_prefix('$')
                .and_then(|n| n.trim().parse::<usize>().ok())
            {
                let mut body = vec![0; n + 2];
                std::io::Read::read_exact(&mut r, &mut body).unwrap();
                return String::from_utf8_lossy(&body[..n]).into_owned();
            }
            line.trim_end().to_owned()
        })
        .collect()
}

/// Puts the test Redis's default user back to no password, also when a
/// case fails while it has one.
struct DefaultUserOpen {
    addr: String,
    password: &'static str,
}

impl Drop for DefaultUserOpen {
    fn drop(&mut self) {
        let r = redis_cmds(
            &self.addr,
            &[
                &["AUTH", "default", self.password],
                &["ACL", "SETUSER", "default", "nopass"],
            ],
        );
        assert_eq!(r[1], "+OK", "the default user keeps a password: {r:?}");
    }
}

/// `distlock --url URL ARGS...` with nothing from the environment.
async fn with_url(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    local(&all).await
}

/// Credentials are checked when connecting: refused ones (a wrong
/// password, none where the server wants one, one the server does not
/// take) exit 77 on every backend, before anything is taken or run; a
/// MySQL URL without a user is refused (64).
async fn credentials_are_checked_at_connect(ctx: Ctx) {
    let target = spec(&ctx).target;
    let url = (spec(&ctx).url)(&ctx.config);
    let hp = host_port(&url);
    let name = ctx.name("auth");
    let ran = scratch(&ctx, "authran");
    let touch = format!("touch {}", ran.display());
    let refused: Vec<String> = match target {
        "cli-redis" => {
            // And a cluster's and RedLock's masters, where compose/ runs them.
            let mut urls = vec![format!("redis://:wrong@{hp}")];
            for var in ["LOCKTEST_REDIS_CLUSTER_URL", "LOCKTEST_REDLOCK_URL"] {
                if let Ok(u) = std::env::var(var) {
                    urls.push(u.replacen("://", "://:wrong@", 1));
                }
            }
            urls
        }
        "cli-etcd" => vec![format!("etcd://nobody:wrong@{hp}")],
        "cli-mysql" | "cli-postgres" => {
            vec![url.replacen("lockcore:lockcore@", "lockcore:wrong@", 1)]
        }
        // ZooKeeper's digest scheme takes any credentials: refusal is an
        // ACL's (NoAuth), mapped to 77 like the others.
        _ => vec![],
    };
    for bad in &refused {
        for args in [
            &["inspect", &name][..],
            &["run", &name, "--", "sh", "-c", &touch],
        ] {
            let (code, _, err) = with_url(bad, args).await;
            assert_eq!(code, Some(77), "{bad} {args:?}: {err}");
            let last = err.trim().lines().last().unwrap_or_default();
            assert!(last.contains("authentication refused"), "{err}");
            assert!(!err.contains("wrong"), "the password in {err}");
        }
    }
    assert!(!ran.exists(), "a command ran without authentication");
    if target == "cli-redis" {
        // A server that wants a password, given none: refused at connect,
        // not at the first lock.
        let _open = DefaultUserOpen {
            addr: hp.clone(),
            password: "cli-secret",
        };
        let r = redis_cmds(
            &hp,
            &[&["ACL", "SETUSER", "default", "resetpass", ">cli-secret"]],
        );
        assert_eq!(r[0], "+OK", "{r:?}");
        let (code, _, err) = with_url(&url, &["run", &name, "--", "sh", "-c", &touch]).await;
        assert_eq!(code, Some(77), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!ran.exists(), "ran without authentication");
        let (code, _, err) =
            with_url(&format!("redis://:cli-secret@{hp}"), &["inspect", &name]).await;
        assert_eq!(code, Some(0), "{err}");
    }
    if target == "cli-mysql" || target == "cli-postgres" {
        let scheme = url.split_once("://").map_or("mysql", |(s, _)| s);
        let no_user = format!("{scheme}://{hp}/lockcore");
        let (code, _, err) = with_url(&no_user, &["inspect", &name]).await;
        assert_eq!(code, Some(64), "{err}");
        assert!(err.contains("no user"), "{err}");
    }
}

/// User info is percent-decoded exactly once: a literal `+` stays `+`,
/// `%2B` is `+`, `%20` a space, `%40` an `@`, `%25` a `%`.
async fn user_info_is_decoded_once(ctx: Ctx) {
    let target = spec(&ctx).target;
    let hp = host_port(&(spec(&ctx).url)(&ctx.config));
    // The password `p+q r@s%t`, written two ways.
    let written = ["p+q%20r%40s%25t", "p%2Bq%20r%40s%25t"];
    let urls: Vec<String> = match target {
        "cli-redis" => {
            let r = redis_cmds(
                &hp,
                &[&[
                    "ACL",
                    "SETUSER",
                    "lockcore+cli",
                    "reset",
                    "on",
                    ">p+q r@s%t",
                    "~*",
                    "&*",
                    "+@all",
                ]],
            );
            assert_eq!(r[0], "+OK", "{r:?}");
            written
                .iter()
                .map(|p| format!("redis://lockcore+cli:{p}@{hp}"))
                .collect()
        }
        // compose/ creates this user (compose/local's bootstrap.sql and the
        // docker init scripts).
        "cli-mysql" => written
            .iter()
            .map(|p| format!("mysql://lockcore_plus:{p}@{hp}/lockcore"))
            .collect(),
        "cli-postgres" => written
            .iter()
            .map(|p| format!("postgres://lockcore_plus:{p}@{hp}/lockcore"))
            .collect(),
        _ => return,
    };
    for url in &urls {
        let (code, out, err) = with_url(url, &["inspect", &ctx.name("decode")]).await;
        assert_eq!(code, Some(0), "{url}: {out}{err}");
    }
    // Decoded twice, `%2540` would be `@`: it is `%40`, a wrong password.
    let twice = urls[0].replace("%40", "%2540");
    let (code, _, err) = with_url(&twice, &["inspect", "x"]).await;
    assert_eq!(code, Some(77), "{twice}: {err}");
    if target == "cli-redis" {
        redis_cmds(&hp, &[&["ACL", "DELUSER", "lockcore+cli"]]);
    }
}

/// etcd endpoints as the etcd client writes them (`http://host:2379`) are
/// taken; `etcd://http://...` is refused with the accepted forms.
async fn endpoints_as_etcd_writes_them(ctx: Ctx) {
    if spec(&ctx).target != "cli-etcd" {
        return;
    }
    let hp = host_port(&(spec(&ctx).url)(&ctx.config));
    for url in [format!("http://{hp}"), format!("HTTP://{hp}/")] {
        let (code, out, err) = with_url(&url, &["inspect", &ctx.name("endpoints")]).await;
        assert_eq!(code, Some(0), "{url}: {out}{err}");
        assert!(out.contains("(etcd)"), "{out}");
    }
    let (code, _, err) = with_url(&format!("etcd://http://{hp}"), &["inspect", "x"]).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("http://host:2379"), "{err}");
}

/// This backend's URL pointed at another backend's server: one line saying
/// the server did not answer as this protocol, exit 69, within the connect
/// timeout.
async fn another_protocol_says_so(ctx: Ctx) {
    let me = spec(&ctx);
    let scheme = (me.url)(&ctx.config)
        .split_once("://")
        .map(|(s, _)| s.to_owned())
        .unwrap();
    let others: Vec<String> = SPECS
        .iter()
        .filter(|s| s.target != me.target)
        .filter_map(|s| std::env::var(s.env).ok().map(|v| host_port(&(s.url)(&v))))
        .collect();
    assert!(!others.is_empty(), "no other server to point at");
    for hp in others {
        let url = match scheme.as_str() {
            "mysql" | "mariadb" | "postgres" | "postgresql" => format!("{scheme}://u:p@{hp}/db"),
            s => format!("{s}://{hp}"),
        };
        let t = Instant::now();
        let (code, _, err) = with_url(&url, &["inspect", "x"]).await;
        assert_eq!(code, Some(69), "{url}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{url}: not one line: {err}");
        assert!(
            err.contains("did not answer as") || err.contains("answered as"),
            "{url}: {err}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{url}: {:?}",
            t.elapsed()
        );
    }
}

/// `run --all a,b`: the command runs only with every name held (checked
/// on the server while it runs), not at all when one is held elsewhere
/// (exit 75, nothing taken); `--lock-delay` is passed on where the backend
/// enforces one and refused (64, nothing run) where it cannot.
async fn run_all_and_lock_delay(ctx: Ctx) {
    let (a, b) = (ctx.name("all/a"), ctx.name("all/b"));
    let list = format!("{b},{a}");
    let holder = ctx.locker().await;
    let g = holder.lock(&b).await.unwrap();
    let ran = scratch(&ctx, "ran-all");
    let touch = format!("touch {}", ran.display());
    let st = distlock(&ctx)
        .args(["run", "--no-wait", "--all", &list, "--", "sh", "-c", &touch])
        .status()
        .await
        .unwrap();
    assert_eq!(st.code(), Some(75));
    assert!(!ran.exists(), "the command ran without every name");
    // a was not left taken by the refused run.
    holder
        .try_lock(&a)
        .await
        .unwrap()
        .expect("a was left taken")
        .release()
        .await
        .unwrap();
    g.release().await.unwrap();
    let ready = scratch(&ctx, "ready-all");
    let done = scratch(&ctx, "done-all");
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        ready.display(),
        done.display()
    );
    let mut child = distlock(&ctx)
        .args(["run", "--all", &list, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    until_exists(&ready).await;
    for n in [&a, &b] {
        assert!(
            holder.try_lock(n).await.unwrap().is_none(),
            "{n} is not held while the command runs"
        );
    }
    std::fs::write(&done, b"").unwrap();
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
    let delay = distlock(&ctx)
        .args(["run", "--lock-delay", "2s", &a, "--", "true"])
        .output()
        .await
        .unwrap();
    if ctx.caps.lock_delay != distlock::LockDelay::Unsupported {
        assert_eq!(delay.status.code(), Some(0), "{delay:?}");
    } else {
        assert_eq!(delay.status.code(), Some(64), "{delay:?}");
        assert!(String::from_utf8_lossy(&delay.stderr).contains("lock-delay"));
    }
}

/// Behind Sentinel, a holder whose key is gone from the master (as a
/// failover to a replica that missed it loses it) learns it at its next
/// renewal: the command gets SIGTERM and distlock exits with the lost code.
#[cfg(feature = "redis")]
async fn sentinel_lost_stops_the_command(ctx: Ctx) {
    let url = ctx.config.clone();
    let name = ctx.name("lost");
    let ready = scratch(&ctx, "ready");
    let script = format!("touch {}; exec sleep 60", ready.display());
    let mut child = Command::new(bin())
        .args(["--url", &url, "run", "--ttl", "2s", "--grace", "1s", &name])
        .args(["--", "sh", "-c", &script])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    until_exists(&ready).await;
    let u = lockcore::raw::address::ServerUrl::parse(&url, 26379).unwrap();
    let sentinel = redis::Client::open(format!("redis://{}", u.hosts[0])).unwrap();
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(&u.path)
        .query_async(&mut sentinel.get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    let master = redis::Client::open(format!("redis://{host}:{port}")).unwrap();
    let deleted: i64 = redis::cmd("DEL")
        .arg(lockcore_redis::lock_key("lock:", &name))
        .query_async(&mut master.get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        deleted, 1,
        "the lock key was not on the master {host}:{port}"
    );
    let st = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("distlock did not stop the command")
        .unwrap();
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
            .hint(COMPOSE_HINT)
            .only_own_cases()
            .case("run_never_overlaps", |c| Box::pin(run_never_overlaps(c)))
            .case("exit_codes_and_environment", |c| {
                Box::pin(exit_codes_and_environment(c))
            })
            .case("run_all_and_lock_delay", |c| {
                Box::pin(run_all_and_lock_delay(c))
            })
            .case("permits_bound_the_copies", |c| {
                Box::pin(permits_bound_the_copies(c))
            })
            .case("shared_readers_run_together", |c| {
                Box::pin(shared_readers_run_together(c))
            })
            .case("exclusive_writers_exclude_everyone", |c| {
                Box::pin(exclusive_writers_exclude_everyone(c))
            })
            .case("elect_and_leader", |c| Box::pin(elect_and_leader(c)))
            .case("signals_pass_through", |c| {
                Box::pin(signals_pass_through(c))
            })
            .case("lost_lease_stops_the_command", |c| {
                Box::pin(lost_lease_stops_the_command(c))
            })
            .case("command_dies_with_distlock", |c| {
                Box::pin(command_dies_with_distlock(c))
            })
            .case("lock_delay_outlives_a_killed_distlock", |c| {
                Box::pin(lock_delay_outlives_a_killed_distlock(c))
            })
            .case("stalled_distlock_stops_the_command", |c| {
                Box::pin(stalled_distlock_stops_the_command(c))
            })
            .case("exit_and_loss_together_report_lost", |c| {
                Box::pin(exit_and_loss_together_report_lost(c))
            })
            .case("signal_while_waiting_leaves_nothing", |c| {
                Box::pin(signal_while_waiting_leaves_nothing(c))
            })
            .case("command_in_a_terminal_reads_it", |c| {
                Box::pin(command_in_a_terminal_reads_it(c))
            })
            .case("silent_server_is_unavailable_not_held", |c| {
                Box::pin(silent_server_is_unavailable_not_held(c))
            })
            .case("stale_heartbeats_never_outrun_the_deadline", |c| {
                Box::pin(stale_heartbeats_never_outrun_the_deadline(c))
            })
            .case("nothing_the_command_started_outlives_it", |c| {
                Box::pin(nothing_the_command_started_outlives_it(c))
            })
            .case("schemes_are_case_insensitive", |c| {
                Box::pin(schemes_are_case_insensitive(c))
            })
            .case("credentials_are_checked_at_connect", |c| {
                Box::pin(credentials_are_checked_at_connect(c))
            })
            .case("user_info_is_decoded_once", |c| {
                Box::pin(user_info_is_decoded_once(c))
            })
            .case("endpoints_as_etcd_writes_them", |c| {
                Box::pin(endpoints_as_etcd_writes_them(c))
            })
            .case("inspect_and_ls_show_every_primitive", |c| {
                Box::pin(inspect_and_ls_show_every_primitive(c))
            })
            .case("run_verbose_says_who_holds", |c| {
                Box::pin(run_verbose_says_who_holds(c))
            })
            .case("every_exit_code_in_the_table", |c| {
                Box::pin(every_exit_code_in_the_table(c))
            })
            .case("odd_names_are_inspected_and_listed", |c| {
                Box::pin(odd_names_are_inspected_and_listed(c))
            })
            .case("foreign_binary_keys_are_passed_over", |c| {
                Box::pin(foreign_binary_keys_are_passed_over(c))
            })
            .case("closed_stderr_keeps_the_exit_code", |c| {
                Box::pin(closed_stderr_keeps_the_exit_code(c))
            })
            .case("a_listing_cut_short_says_so", |c| {
                Box::pin(a_listing_cut_short_says_so(c))
            })
            .case("names_starting_with_a_dash", |c| {
                Box::pin(names_starting_with_a_dash(c))
            })
            .case("another_protocol_says_so", |c| {
                Box::pin(another_protocol_says_so(c))
            })
        })
        .collect::<Vec<_>>();
    let local = Target::new("cli-local", None, |_| async {
        Ok(UrlHarness::shared("memory://cli-local".to_owned(), |u| {
            Box::pin(async move { distlock::connect(&u).await })
        }))
    })
    .only_own_cases()
    .case("usage_errors_exit_64", |c| {
        Box::pin(usage_errors_exit_64(c))
    })
    .case("closed_stdout_ends_quietly", |c| {
        Box::pin(closed_stdout_ends_quietly(c))
    })
    .case("memory_is_refused_where_processes_meet", |c| {
        Box::pin(memory_is_refused_where_processes_meet(c))
    })
    .case("every_help_has_an_example", |c| {
        Box::pin(every_help_has_an_example(c))
    })
    .case("bench_held_only", |c| Box::pin(bench_held_only(c)))
    .case("bench_metrics_use_the_library_names", |c| {
        Box::pin(bench_metrics_use_the_library_names(c))
    })
    .case("completions_and_man_page", |c| {
        Box::pin(completions_and_man_page(c))
    });
    #[allow(unused_mut)]
    let mut targets = std::iter::once(local).chain(targets).collect::<Vec<_>>();
    #[cfg(feature = "redis")]
    targets.push(
        Target::new(
            "cli-sentinel",
            Some("LOCKTEST_REDIS_SENTINEL_URL"),
            |url| async move {
                Ok(UrlHarness::shared(url, |u| {
                    Box::pin(async move { distlock::connect(&u).await })
                }))
            },
        )
        .hint(COMPOSE_HINT)
        .only_own_cases()
        .case("sentinel_lost_stops_the_command", |c| {
            Box::pin(sentinel_lost_stops_the_command(c))
        }),
    );
    run_serial(targets)
}
