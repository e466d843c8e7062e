//! `distlock run`: a command under a lock.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use distlock::{ErrorKind, LockOptions, Locker, Wait};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

/// Arguments of `distlock run`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Lease ttl; renewed at about ttl/3 while the command runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Wait at most this long for the lock (default: wait forever).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: fail at once when the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// When the lease is lost: time between SIGTERM and SIGKILL to the command.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Exit code when the lock could not be had.
    #[arg(long, default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// Exit code when the lease was lost while the command ran.
    #[arg(long, default_value_t = exit::LOST)]
    lost_exit_code: u8,
    /// The lock name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::SOFTWARE),
        (None, None) => exit::SOFTWARE,
    }
}

/// Sends `sig` to the command's process group (it runs in its own).
fn signal_group(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        if let Err(e) = killpg(Pid::from_raw(pid), sig) {
            tracing::debug!(%sig, error = %e, "could not signal the command");
        }
    }
}

/// Runs the command under the lock; returns the exit code.
pub(crate) async fn run(locker: Locker, args: Args) -> u8 {
    let wait = match (args.no_wait, args.wait) {
        (true, _) => Wait::Try,
        (false, Some(d)) => Wait::For(d),
        (false, None) => Wait::Forever,
    };
    let opts = LockOptions::new().ttl(args.ttl).wait(wait);
    let guard = match locker.acquire(&args.name, &opts).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            eprintln!(
                "distlock: {:?} is held by another owner; not running the command",
                args.name
            );
            return args.conflict_exit_code;
        }
        Err(e) if e.kind() == ErrorKind::Timeout => {
            eprintln!("distlock: {e}; not running the command");
            return args.conflict_exit_code;
        }
        Err(e) => {
            eprintln!("distlock: {e}");
            return exit::for_error(&e);
        }
    };
    tracing::info!(name = %args.name, fence = ?guard.fence(), "lock acquired");

    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return exit::USAGE,
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .env("DISTLOCK_NAME", &args.name)
        .process_group(0);
    match guard.fence() {
        Some(f) => command.env("DISTLOCK_FENCE", f.to_string()),
        None => command.env_remove("DISTLOCK_FENCE"),
    };
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("distlock: cannot run {program:?}: {e}");
            let _ = guard.release().await;
            return exit::NOT_STARTED;
        }
    };

    let (mut sigint, mut sigterm, mut sighup) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        _ => {
            eprintln!("distlock: cannot listen for signals");
            signal_group(&child, Signal::SIGKILL);
            let _ = child.wait().await;
            let _ = guard.release().await;
            return exit::SOFTWARE;
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                let code = match status {
                    Ok(s) => status_code(s),
                    Err(e) => {
                        eprintln!("distlock: waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                };
                if let Err(e) = guard.release().await {
                    eprintln!("distlock: the command finished but {e}");
                }
                return code;
            }
            () = &mut lost => {
                eprintln!(
                    "distlock: lease on {:?} lost ({}): stopping the command",
                    args.name,
                    guard.lost_reason().unwrap_or("unknown")
                );
                signal_group(&child, Signal::SIGTERM);
                if tokio::time::timeout(args.grace, child.wait()).await.is_err() {
                    signal_group(&child, Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                let _ = guard.release().await;
                return args.lost_exit_code;
            }
            _ = sigint.recv() => signal_group(&child, Signal::SIGINT),
            _ = sigterm.recv() => signal_group(&child, Signal::SIGTERM),
            _ = sighup.recv() => signal_group(&child, Signal::SIGHUP),
        }
    }
}
