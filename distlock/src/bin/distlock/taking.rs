//! What `run` and `elect` take and hold: their arguments, the lease, the
//! signals caught from the start.

use std::time::Duration;

use distlock::{LockGuard, MultiGuard, WriteGuard};
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

/// How long a message to the supervisor may take to go out: longer means
/// it no longer reads (stopped, stuck), and the command's group is killed.
pub(crate) const SEND_LIMIT: Duration = Duration::from_secs(2);

/// How long cleanups (a dropped acquisition, a release) may take before
/// the process exits.
pub(crate) const FLUSH: Duration = Duration::from_secs(5);

/// What `run` and `elect` share: the lease, the wait, the exit codes, the
/// name and the command.
#[derive(Debug, clap::Args)]
pub(crate) struct Common {
    /// Lease ttl; renewed at about ttl/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) ttl: Duration,
    /// Wait at most this long for the lock (default: wait forever).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    pub(crate) wait: Option<Duration>,
    /// Do not wait: fail at once when the lock is held.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// When the lease is lost before its validity deadline: time between
    /// SIGTERM and SIGKILL to the command (cut short at the deadline; once
    /// the deadline passes the command is killed at once).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) grace: Duration,
    /// A lock-delay (as Chubby's and Consul's): if this process dies or is
    /// cut off without releasing, nobody may take the name for this long
    /// after its lease ends, kept by the server (a clean end frees it at
    /// once). Refused by backends whose lease is a session or connection.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) lock_delay: Option<Duration>,
    /// Exit code when the lock could not be had.
    #[arg(long, default_value_t = exit::NOT_ACQUIRED)]
    pub(crate) conflict_exit_code: u8,
    /// Exit code when the lease was lost while the command ran.
    #[arg(long, default_value_t = exit::LOST)]
    pub(crate) lost_exit_code: u8,
    #[command(flatten)]
    pub(crate) name: crate::NameArg,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

/// Arguments of `distlock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Take one of N permits of the semaphore NAME instead of the lock: at
    /// most N copies run at once (like `consul lock -n N`). No
    /// DISTLOCK_FENCE is exported (N hold at once: a permit's token fences
    /// nothing).
    #[arg(long, value_name = "N", conflicts_with_all = ["shared", "exclusive"])]
    pub(crate) permits: Option<u32>,
    /// Take a reader of the read-write lock NAME (as `flock -s`): readers
    /// run together, and wait while a writer (`--exclusive`) holds or
    /// waits. No DISTLOCK_FENCE is exported.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    pub(crate) shared: bool,
    /// Take the writer of the read-write lock NAME (as `flock -x`): it
    /// waits for the readers inside, excludes readers and other writers,
    /// and new readers wait behind it. The plain `run NAME` is another lock
    /// (the lock NAME) and does not exclude readers of the read-write lock.
    #[arg(short = 'x', long)]
    pub(crate) exclusive: bool,
    /// NAME is a comma-separated list of lock names, taken all or none
    /// (as Redisson's MultiLock): in sorted order, so that two runs over
    /// overlapping lists never deadlock; the command runs once all are
    /// held and is stopped when any is lost. Each name is taken as given
    /// between the commas (spaces included). DISTLOCK_NAME is the list as
    /// given; no DISTLOCK_FENCE is exported (one token per name).
    #[arg(long, conflicts_with_all = ["permits", "shared", "exclusive"])]
    pub(crate) all: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// Arguments of `distlock elect`.
#[derive(Debug, clap::Args)]
pub(crate) struct ElectArgs {
    /// This candidate's value, shown to observers while it leads (`distlock
    /// leader NAME`), e.g. the host name.
    #[arg(long)]
    pub(crate) value: String,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// What the command runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
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
    /// Every lock of a list, all or none.
    All(Vec<String>),
}

impl Take {
    /// Whether the guard's token is a fence for the resource: the lock's
    /// and a leader's term are; a permit's or a reader's is held beside
    /// others.
    pub(crate) fn exports_fence(&self) -> bool {
        matches!(self, Take::Lock | Take::Exclusive | Take::Elect(_))
    }
}

/// What the command runs under: one lease, or a writer's (several leases
/// in the built layout, trusted only while every one is).
pub(crate) enum Lease {
    /// A lock, a permit, a reader or a leadership.
    One(LockGuard),
    /// The writer of a read-write lock.
    Write(WriteGuard),
    /// Several locks, held all or none.
    Multi(MultiGuard),
}

impl Lease {
    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Lease::One(g) => g.fence(),
            Lease::Write(w) => w.fence(),
            Lease::Multi(_) => None,
        }
    }

    pub(crate) fn is_held(&self) -> bool {
        match self {
            Lease::One(g) => g.is_held(),
            Lease::Write(w) => w.is_held(),
            Lease::Multi(m) => m.is_held(),
        }
    }

    pub(crate) fn valid_until(&self) -> Option<std::time::Instant> {
        match self {
            Lease::One(g) => g.valid_until(),
            Lease::Write(w) => w.valid_until(),
            Lease::Multi(m) => m.valid_until(),
        }
    }

    pub(crate) fn lost_reason(&self) -> Option<&'static str> {
        match self {
            Lease::One(g) => g.lost_reason(),
            Lease::Write(w) => w.lost_reason(),
            Lease::Multi(m) => m.guards().iter().find_map(LockGuard::lost_reason),
        }
    }

    pub(crate) fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        match self {
            Lease::One(g) => Box::pin(g.lost()),
            Lease::Write(w) => Box::pin(w.lost()),
            Lease::Multi(m) => Box::pin(m.lost()),
        }
    }

    pub(crate) async fn release(self) -> distlock::Result<()> {
        match self {
            Lease::One(g) => g.release().await,
            Lease::Write(w) => w.release().await,
            Lease::Multi(m) => m.release().await,
        }
    }
}

/// INT, TERM and HUP, caught from the start of `run`.
pub(crate) struct Signals {
    pub(crate) int: tokio::signal::unix::Signal,
    pub(crate) term: tokio::signal::unix::Signal,
    pub(crate) hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal caught.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}
