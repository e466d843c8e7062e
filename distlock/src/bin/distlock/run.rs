//! `distlock run`: a command under a lock (or a permit, or a read lock);
//! `distlock elect`: a command while leading an election.
//!
//! The command never runs without a live lease behind it. It runs under a
//! supervisor (`distlock __supervise`, see `supervise.rs`) that leads its
//! process group and kills the whole group if this process dies or stops
//! renewing: this process tells it over a private socket, several times per
//! ttl, how long the lease is valid, and tells it at once when the lease is
//! lost. Signals (INT, TERM, HUP) are caught from the start: one that arrives
//! while the lock is awaited ends the wait and leaves nothing queued; later
//! ones are passed to the command.

use std::io::IsTerminal;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use distlock::{
    Election, ErrorKind, Leadership, LockGuard, LockOptions, Locker, Permit, ReadGuard, RwLock,
    Semaphore, Wait, WriteGuard,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{getpgrp, tcgetpgrp, Pid};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;
use crate::supervise::{monotonic_ms, set_foreground, status_code, Message};

/// How long a message to the supervisor may take to go out: longer means
/// it no longer reads (stopped, stuck), and the command's group is killed.
const SEND_LIMIT: Duration = Duration::from_secs(2);

/// How long cleanups (a dropped acquisition, a release) may take before
/// the process exits.
const FLUSH: Duration = Duration::from_secs(5);

/// What `run` and `elect` share: the lease, the wait, the exit codes, the
/// name and the command.
#[derive(Debug, clap::Args)]
pub(crate) struct Common {
    /// Lease ttl; renewed at about ttl/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Wait at most this long for the lock (default: wait forever).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: fail at once when the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// When the lease is lost before its validity deadline: time between
    /// SIGTERM and SIGKILL to the command (cut short at the deadline; once
    /// the deadline passes the command is killed at once).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Exit code when the lock could not be had.
    #[arg(long, default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// Exit code when the lease was lost while the command ran.
    #[arg(long, default_value_t = exit::LOST)]
    lost_exit_code: u8,
    #[command(flatten)]
    name: crate::NameArg,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// Arguments of `distlock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Take one of N permits of the semaphore NAME instead of the lock: at
    /// most N copies run at once (like `consul lock -n N`). No
    /// DISTLOCK_FENCE is exported (N hold at once: a permit's token fences
    /// nothing).
    #[arg(long, value_name = "N", conflicts_with_all = ["shared", "exclusive"])]
    permits: Option<u32>,
    /// Take a reader of the read-write lock NAME (as `flock -s`): readers
    /// run together, and wait while a writer (`--exclusive`) holds or
    /// waits. No DISTLOCK_FENCE is exported.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    shared: bool,
    /// Take the writer of the read-write lock NAME (as `flock -x`): it
    /// waits for the readers inside, excludes readers and other writers,
    /// and new readers wait behind it. The plain `run NAME` is another lock
    /// (the lock NAME) and does not exclude readers of the read-write lock.
    #[arg(short = 'x', long)]
    exclusive: bool,
    #[command(flatten)]
    common: Common,
}

/// Arguments of `distlock elect`.
#[derive(Debug, clap::Args)]
pub(crate) struct ElectArgs {
    /// This candidate's value, shown to observers while it leads (`distlock
    /// leader NAME`), e.g. the host name.
    #[arg(long)]
    value: String,
    #[command(flatten)]
    common: Common,
}

/// What the command runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Take {
    /// The lock NAME.
    Lock,
    /// One of N permits of the semaphore NAME.
    Permits(u32),
    /// A reader of the read-write lock NAME.
    Shared,
    /// The writer of the read-write lock NAME.
    Exclusive,
    /// The leadership of the election NAME, campaigning with this value.
    Elect(String),
}

impl Take {
    /// Whether the guard's token is a fence for the resource: the lock's
    /// and a leader's term are; a permit's or a reader's is held beside
    /// others.
    fn exports_fence(&self) -> bool {
        matches!(self, Take::Lock | Take::Exclusive | Take::Elect(_))
    }
}

/// What the command runs under: one lease, or a writer's (several leases
/// in the built layout, trusted only while every one is).
enum Lease {
    /// A lock, a permit, a reader or a leadership.
    One(LockGuard),
    /// The writer of a read-write lock.
    Write(WriteGuard),
}

impl Lease {
    fn fence(&self) -> Option<u64> {
        match self {
            Lease::One(g) => g.fence(),
            Lease::Write(w) => w.fence(),
        }
    }

    fn is_held(&self) -> bool {
        match self {
            Lease::One(g) => g.is_held(),
            Lease::Write(w) => w.is_held(),
        }
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        match self {
            Lease::One(g) => g.valid_until(),
            Lease::Write(w) => w.valid_until(),
        }
    }

    fn lost_reason(&self) -> Option<&'static str> {
        match self {
            Lease::One(g) => g.lost_reason(),
            Lease::Write(w) => w.lost_reason(),
        }
    }

    fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        match self {
            Lease::One(g) => Box::pin(g.lost()),
            Lease::Write(w) => Box::pin(w.lost()),
        }
    }

    async fn release(self) -> distlock::Result<()> {
        match self {
            Lease::One(g) => g.release().await,
            Lease::Write(w) => w.release().await,
        }
    }
}

/// INT, TERM and HUP, caught from the start of `run`.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal caught.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// Runs the command under the lock; returns the exit code.
/// `tell`: say who holds the name while waiting for it (`--verbose`; also
/// when stderr is a terminal).
pub(crate) async fn run(locker: Locker, args: Args, tell: bool) -> u8 {
    let take = match (args.permits, args.shared, args.exclusive) {
        (Some(n), _, _) => Take::Permits(n),
        (None, true, _) => Take::Shared,
        (None, false, true) => Take::Exclusive,
        (None, false, false) => Take::Lock,
    };
    supervised(locker, &args.common, &take, tell).await
}

/// Runs the command while leading the election; returns the exit code.
pub(crate) async fn elect(locker: Locker, args: ElectArgs, tell: bool) -> u8 {
    supervised(locker, &args.common, &Take::Elect(args.value), tell).await
}

/// Runs the command under what `take` says; returns the exit code.
async fn supervised(locker: Locker, args: &Common, take: &Take, tell: bool) -> u8 {
    let tell = tell || std::io::stderr().is_terminal();
    let code = run_inner(locker, args, take, tell).await;
    // Undo what a dropped acquisition or guard left, before the runtime goes.
    distlock::cleanup::flush(FLUSH).await;
    code
}

async fn run_inner(locker: Locker, args: &Common, take: &Take, tell: bool) -> u8 {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            crate::out::warn_line!("distlock: cannot listen for signals: {e}");
            return exit::SOFTWARE;
        }
    };
    let wait = match (args.no_wait, args.wait) {
        (true, _) => Wait::Try,
        (false, Some(d)) => Wait::For(d),
        (false, None) => Wait::Forever,
    };
    let opts = LockOptions::new().ttl(args.ttl).wait(wait);
    let taking = async {
        match take {
            Take::Permits(n) => {
                let sem = Semaphore::new(&locker, args.name.get(), *n)?;
                Ok(sem
                    .acquire(&opts)
                    .await?
                    .map(|p| Lease::One(Permit::into_guard(p))))
            }
            Take::Shared => {
                let rw = RwLock::new(&locker, args.name.get())?;
                Ok(rw
                    .read(&opts)
                    .await?
                    .map(|g| Lease::One(ReadGuard::into_guard(g))))
            }
            Take::Exclusive => {
                let rw = RwLock::new(&locker, args.name.get())?;
                Ok(rw.write(&opts).await?.map(Lease::Write))
            }
            Take::Elect(value) => {
                let election = Election::new(&locker, args.name.get())?;
                Ok(election
                    .campaign_with(value, &opts)
                    .await?
                    .map(|l| Lease::One(Leadership::into_guard(l))))
            }
            Take::Lock => Ok::<_, distlock::Error>(
                locker
                    .acquire(args.name.get(), &opts)
                    .await?
                    .map(Lease::One),
            ),
        }
    };
    // Once the name is found held, say by whom (and since when).
    let notice = async {
        if !tell || wait == Wait::Try {
            return std::future::pending().await;
        }
        tokio::time::sleep(NOTICE_AFTER).await;
        notice_holder(&locker, args.name.get(), take).await;
    };
    tokio::pin!(taking, notice);
    let mut noticed = false;
    let acquired = loop {
        tokio::select! {
            r = &mut taking => break r,
            sig = signals.recv() => {
                // Dropping the acquisition undoes it (flushed before exit).
                crate::out::warn_line!("distlock: {sig} while waiting for {:?}; not running the command", args.name.get());
                return signal_exit(sig);
            }
            () = &mut notice, if !noticed => noticed = true,
        }
    };
    let guard = match acquired {
        Ok(Some(g)) => g,
        Ok(None) => {
            match take {
                Take::Shared => crate::out::warn_line!(
                    "distlock: a writer holds {:?} or waits for it; not running the command",
                    args.name.get()
                ),
                Take::Exclusive => crate::out::warn_line!(
                    "distlock: readers or a writer hold {:?}; not running the command",
                    args.name.get()
                ),
                Take::Lock => crate::out::warn_line!(
                    "distlock: {:?} is held by another owner; not running the command",
                    args.name.get()
                ),
                Take::Permits(n) => crate::out::warn_line!(
                    "distlock: all {n} permits of {:?} are held; not running the command",
                    args.name.get()
                ),
                Take::Elect(_) => crate::out::warn_line!(
                    "distlock: another candidate leads {:?}; not running the command",
                    args.name.get()
                ),
            }
            return args.conflict_exit_code;
        }
        Err(e) if e.kind() == ErrorKind::Timeout => {
            crate::out::warn_line!("distlock: {e}; not running the command");
            return args.conflict_exit_code;
        }
        Err(e) => {
            crate::out::fail(&e);
            return exit::for_error(&e);
        }
    };
    tracing::info!(name = %args.name.get(), fence = ?guard.fence(), "lock acquired");
    let code = under_lease(&guard, args, take, &mut signals).await;
    if let Err(e) = guard.release().await {
        if code != args.lost_exit_code {
            crate::out::warn_line!("distlock: the command finished but {e}");
        }
    }
    code
}

/// How long an acquisition runs before `--verbose` says who holds the name.
const NOTICE_AFTER: Duration = Duration::from_millis(300);

/// Says on stderr who holds what `take` waits for on `name`, and since
/// when, as the server tells.
async fn notice_holder(locker: &Locker, name: &str, take: &Take) {
    let h = match locker.holdings(name).await {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(error = %e, "could not read who holds the name");
            return;
        }
    };
    let who = match take {
        Take::Lock | Take::Elect(_) => h.lock.as_ref().map(crate::show::line),
        Take::Permits(n) => h.permits.first().map(|p| {
            format!(
                "{} of {n} permits held, the first by {}",
                h.permits.len(),
                crate::show::line(&p.holder)
            )
        }),
        Take::Shared => h
            .writer
            .as_ref()
            .map(|w| format!("the writer {}", crate::show::line(&w.holder))),
        Take::Exclusive => match (&h.writer, h.readers.first()) {
            (Some(w), _) => Some(format!("the writer {}", crate::show::line(&w.holder))),
            (None, Some(r)) => Some(format!(
                "{} readers, the first {}",
                h.readers.len(),
                crate::show::line(r)
            )),
            (None, None) => None,
        },
    };
    match who {
        Some(who) => crate::out::warn_line!("distlock: waiting for {name:?}: held by {who}"),
        None => {
            crate::out::warn_line!(
                "distlock: waiting for {name:?} (its holder was not readable or just left)"
            )
        }
    }
}

/// 128 + the signal's number, as a shell reports it.
fn signal_exit(sig: Signal) -> u8 {
    u8::try_from(128 + sig as i32).unwrap_or(exit::SOFTWARE)
}

/// A private directory (mode 0700) for the supervisor's socket.
fn private_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "distlock-{}-{}",
        std::process::id(),
        distlock::raw::OwnerToken::random()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Removes the socket and its directory (the connection stays).
fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills the supervisor's whole group (the command's): also what is left
/// of it after the supervisor ended.
fn kill_group(group: Option<Pid>) {
    if let Some(g) = group {
        let _ = killpg(g, Signal::SIGKILL);
    }
}

/// Until when the lease is valid, on the monotonic clock shared with the
/// supervisor; `None` once lost.
fn valid_until(guard: &Lease) -> Option<Message> {
    let left = guard
        .valid_until()?
        .saturating_duration_since(std::time::Instant::now());
    let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
    Some(Message::ValidUntil(monotonic_ms().saturating_add(left)))
}

/// How a message to the supervisor went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// It is on its way.
    Yes,
    /// The supervisor closed its end: it is ending (its exit status tells).
    Closed,
    /// It did not go out in time: the supervisor no longer reads.
    Stuck,
}

/// Sends `m` to the supervisor.
async fn send(conn: &mut UnixStream, m: Message) -> Sent {
    match tokio::time::timeout(SEND_LIMIT, conn.write_all(m.line().as_bytes())).await {
        Ok(Ok(())) => Sent::Yes,
        Ok(Err(_)) => Sent::Closed,
        Err(_) => Sent::Stuck,
    }
}

/// The supervisor stopped reading (stopped, stuck): no one could stop the
/// command when the lease goes, so it is killed now.
async fn stuck(group: Option<Pid>, child: &mut Child) -> u8 {
    crate::out::warn_line!(
        "distlock: the command's supervisor stopped answering; the command was killed"
    );
    kill_group(group);
    let _ = child.wait().await;
    exit::SOFTWARE
}

/// A started supervisor: its process, its group, and its socket.
struct Supervisor {
    child: Child,
    group: Option<Pid>,
    conn: UnixStream,
    /// The group distlock gave the terminal away from, if it did.
    foreground: Option<Pid>,
}

/// Starts the supervisor (the command waits for its first message) and
/// takes its connection on a socket in a private directory; the error is
/// the exit code, after a message.
async fn start_supervisor(guard: &Lease, args: &Common, take: &Take) -> Result<Supervisor, u8> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        crate::out::warn_line!("distlock: {what}: {e}");
        exit::SOFTWARE
    };
    // In a terminal's foreground, the command's group takes the terminal.
    let stdin = std::io::stdin();
    let foreground =
        (stdin.is_terminal() && tcgetpgrp(&stdin).ok() == Some(getpgrp())).then(getpgrp);
    let dir = private_dir()
        .map_err(|e| failed("cannot make a private directory for the supervisor", &e))?;
    let socket = dir.join("s");
    let started = async {
        let listener = UnixListener::bind(&socket)
            .map_err(|e| failed("cannot listen for the supervisor", &e))?;
        let exe = std::env::current_exe().map_err(|e| {
            failed(
                "cannot find its own executable to supervise the command",
                &e,
            )
        })?;
        let mut command = tokio::process::Command::new(exe);
        command.arg("__supervise").arg("--socket").arg(&socket);
        if let Some(pg) = foreground {
            command.arg("--foreground").arg(pg.as_raw().to_string());
        }
        command
            .arg("--")
            .args(&args.command)
            .env("DISTLOCK_NAME", args.name.get())
            .process_group(0);
        // A permit's or a reader's token is held beside others: not a fence
        // for the resource, so none is exported then. A leader's is its term.
        match guard.fence().filter(|_| take.exports_fence()) {
            Some(f) => command.env("DISTLOCK_FENCE", f.to_string()),
            None => command.env_remove("DISTLOCK_FENCE"),
        };
        let child = command
            .spawn()
            .map_err(|e| failed("cannot start the supervisor", &e))?;
        let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept()).await;
        Ok::<_, u8>((child, accepted))
    }
    .await;
    remove_dir(&dir);
    let (mut child, accepted) = started?;
    // The supervisor leads the group (its pid is the group's id).
    let group = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw);
    let conn = match accepted {
        Ok(Ok((conn, _)))
            if conn
                .peer_cred()
                .ok()
                .and_then(|c| c.pid())
                .and_then(|p| u32::try_from(p).ok())
                == child.id() =>
        {
            conn
        }
        other => {
            kill_group(group);
            let _ = child.wait().await;
            let why = match other {
                Ok(Ok(_)) => "an unexpected process answered on the supervisor's socket",
                _ => "the supervisor did not start",
            };
            crate::out::warn_line!("distlock: {why}");
            return Err(exit::SOFTWARE);
        }
    };
    Ok(Supervisor {
        child,
        group,
        conn,
        foreground,
    })
}

/// Runs the command under its supervisor while the lease lives; returns
/// the exit code.
async fn under_lease(guard: &Lease, args: &Common, take: &Take, signals: &mut Signals) -> u8 {
    // Should the supervisor die first, what the command started comes here
    // (not to init), to be killed at the end.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(error = %e, "cannot become a subreaper");
    }
    let Supervisor {
        mut child,
        group,
        mut conn,
        foreground,
    } = match start_supervisor(guard, args, take).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The command starts once the supervisor hears the lease is valid.
    let first = match valid_until(guard) {
        Some(m) => send(&mut conn, m).await,
        None => Sent::Closed,
    };
    if first != Sent::Yes {
        kill_group(group);
        let _ = child.wait().await;
        crate::out::warn_line!(
            "distlock: the lease on {:?} was lost before the command started",
            args.name.get()
        );
        return args.lost_exit_code;
    }
    let tick = (args.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut heartbeat = tokio::time::interval(tick);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lost = guard.lost();
    // Whether the supervisor still reads (it closes its end as it exits).
    let mut open = true;
    let code = loop {
        tokio::select! {
            biased;
            () = &mut lost => {
                crate::out::warn_line!(
                    "distlock: lease on {:?} lost ({}): stopping the command",
                    args.name.get(),
                    guard.lost_reason().unwrap_or("unknown")
                );
                // The supervisor kills the group by the grace or the
                // deadline; should it not take the message, or not do it,
                // do it here.
                let sent = send(&mut conn, Message::Stop(args.grace)).await;
                if sent == Sent::Stuck || tokio::time::timeout(args.grace + Duration::from_secs(5), child.wait()).await.is_err() {
                    kill_group(group);
                    let _ = child.wait().await;
                }
                break args.lost_exit_code;
            }
            status = child.wait() => {
                // The supervisor dies by SIGKILL only with its group, when
                // the lease ran out (or it was killed): the command was
                // stopped for want of a lease. And a lease not held now may
                // have been lost while the command ran.
                break match status {
                    Ok(s) if s.signal() == Some(Signal::SIGKILL as i32) || !guard.is_held() => {
                        args.lost_exit_code
                    }
                    Ok(s) => status_code(s),
                    Err(e) => {
                        crate::out::warn_line!("distlock: waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                };
            }
            sig = signals.recv(), if open => {
                match send(&mut conn, Message::Signal(sig as i32)).await {
                    Sent::Yes => {}
                    Sent::Closed => open = false,
                    Sent::Stuck => break stuck(group, &mut child).await,
                }
            }
            _ = heartbeat.tick(), if open => {
                if let Some(m) = valid_until(guard) {
                    match send(&mut conn, m).await {
                        Sent::Yes => {}
                        Sent::Closed => open = false,
                        Sent::Stuck => break stuck(group, &mut child).await,
                    }
                }
            }
        }
    };
    // Whatever the command left in its group goes with it, and every
    // descendant that escaped the group (`setsid`, a double fork) and came
    // to this process when the supervisor ended.
    kill_group(group);
    crate::supervise::kill_descendants(None);
    if foreground.is_some() {
        // Should the supervisor have died holding the terminal.
        set_foreground(getpgrp());
    }
    code
}
