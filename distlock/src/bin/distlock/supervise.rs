//! `distlock __supervise`: the process between `distlock run` and the
//! command, so that the command never runs without a live lease behind it.
//!
//! It leads the command's process group and starts the command only once
//! `distlock run` has said the lease is valid. It stops the whole group with
//! SIGKILL the moment it can no longer know that a live lease stands behind
//! it:
//!
//! - `distlock run` is gone: its socket closed (killed with SIGKILL, killed
//!   for memory, crashed);
//! - the lease's validity deadline passed without word of a renewal
//!   (`distlock run` stopped or stalled, or the renewal failed).
//!
//! When `distlock run` saw the lease lost before its deadline (renewal
//! refused, session expired) the group gets SIGTERM, then SIGKILL after the
//! grace or at the deadline, whichever is first. Signals forwarded by
//! `distlock run` go to the group (this process catches them and goes on).
//! Run from a terminal's foreground, the group takes the terminal while the
//! command runs, so that the command can read it, and gives it back.
//!
//! Its exit status is the command's (128+N when a signal N ended it).
//!
//! The protocol on the socket, one line per message from `distlock run`:
//! `valid <ms>` (the lease is valid for that long from now), `stop
//! <grace ms>` (the lease is lost), `signal <n>` (pass signal n on).

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{getpgrp, tcsetpgrp, Pid};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::exit;

/// How much earlier than told the supervisor counts a deadline (the message
/// took time to arrive).
const MARGIN: Duration = Duration::from_millis(5);

/// Arguments of `distlock __supervise` (started by `distlock run` only).
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The socket of `distlock run` to connect to.
    #[arg(long)]
    socket: PathBuf,
    /// Take the terminal's foreground for the command, and give it back to
    /// this process group at the end.
    #[arg(long)]
    foreground: Option<i32>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// A message from `distlock run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Message {
    /// The lease is valid for this long from now.
    Valid(Duration),
    /// The lease is lost: SIGTERM now, SIGKILL after this grace.
    Stop(Duration),
    /// Pass this signal on to the command's group.
    Signal(i32),
}

impl Message {
    /// The line that carries it.
    pub(crate) fn line(self) -> String {
        match self {
            Message::Valid(d) => format!("valid {}\n", d.as_millis()),
            Message::Stop(d) => format!("stop {}\n", d.as_millis()),
            Message::Signal(n) => format!("signal {n}\n"),
        }
    }

    fn parse(line: &str) -> Option<Message> {
        let (what, n) = line.trim().split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        match what {
            "valid" => Some(Message::Valid(Duration::from_millis(n))),
            "stop" => Some(Message::Stop(Duration::from_millis(n))),
            "signal" => i32::try_from(n).ok().map(Message::Signal),
            _ => None,
        }
    }
}

/// The exit code for a command's status.
pub(crate) fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::SOFTWARE),
        (None, None) => exit::SOFTWARE,
    }
}

/// Sends `sig` to this process's group (the command's).
fn signal_group(sig: Signal) {
    if let Err(e) = killpg(getpgrp(), sig) {
        tracing::debug!(%sig, error = %e, "could not signal the command's group");
    }
}

/// Makes `pgrp` the terminal's foreground group (the terminal on stdin).
/// SIGTTOU is blocked meanwhile: a background group may then take the
/// terminal instead of being stopped.
pub(crate) fn set_foreground(pgrp: Pid) {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_err() {
        return;
    }
    if let Err(e) = tcsetpgrp(std::io::stdin(), pgrp) {
        tracing::debug!(error = %e, "could not hand the terminal over");
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
}

/// Runs the supervisor; returns its exit code.
pub(crate) fn supervise(args: Args) -> u8 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("distlock: cannot start the supervisor's runtime: {e}");
            return exit::SOFTWARE;
        }
    };
    rt.block_on(run(args))
}

async fn run(args: Args) -> u8 {
    // The group's signals reach this process too: catch them (the command
    // gets its own default handling back when it starts).
    let caught = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::quit()),
    );
    let (Ok(mut sigint), Ok(mut sigterm), Ok(mut sighup), Ok(mut sigquit)) = caught else {
        eprintln!("distlock: the supervisor cannot catch signals");
        return exit::SOFTWARE;
    };
    let stream = match UnixStream::connect(&args.socket).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("distlock: the supervisor cannot reach distlock run: {e}");
            return exit::SOFTWARE;
        }
    };
    let mut lines = BufReader::new(stream).lines();
    // Nothing runs before the lease is known valid.
    let mut deadline = match lines.next_line().await {
        Ok(Some(l)) => match Message::parse(&l) {
            Some(Message::Valid(d)) => Instant::now() + d.saturating_sub(MARGIN),
            _ => return exit::SOFTWARE,
        },
        _ => return exit::SOFTWARE,
    };
    let foreground = args.foreground.filter(|_| std::io::stdin().is_terminal());
    if foreground.is_some() {
        set_foreground(getpgrp());
    }
    let give_back = || {
        if let Some(pg) = foreground {
            set_foreground(Pid::from_raw(pg));
        }
    };
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return exit::USAGE,
    };
    let mut child = match tokio::process::Command::new(program).args(rest).spawn() {
        Ok(c) => c,
        Err(e) => {
            give_back();
            eprintln!("distlock: cannot run {program:?}: {e}");
            return exit::NOT_STARTED;
        }
    };
    // After a lost lease: when the grace ends.
    let mut stop_at: Option<Instant> = None;
    let mut listening = true;
    loop {
        let kill_at = stop_at.map_or(deadline, |s| s.min(deadline));
        tokio::select! {
            status = child.wait() => {
                give_back();
                return match status {
                    Ok(s) => status_code(s),
                    Err(e) => {
                        eprintln!("distlock: waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                };
            }
            line = lines.next_line(), if listening => match line.ok().flatten() {
                Some(l) => match Message::parse(&l) {
                    Some(Message::Valid(d)) => {
                        deadline = Instant::now() + d.saturating_sub(MARGIN);
                    }
                    Some(Message::Stop(grace)) => {
                        signal_group(Signal::SIGTERM);
                        stop_at = Some(Instant::now() + grace);
                    }
                    Some(Message::Signal(n)) => {
                        if let Ok(sig) = Signal::try_from(n) {
                            signal_group(sig);
                        }
                    }
                    None => {}
                },
                None => {
                    // distlock run is gone: no one keeps the lease.
                    listening = false;
                    give_back();
                    signal_group(Signal::SIGKILL);
                }
            },
            () = tokio::time::sleep_until(kill_at) => {
                // The lease's validity ran out without word of a renewal, or
                // the grace after a lost lease did.
                give_back();
                signal_group(Signal::SIGKILL);
                deadline = Instant::now() + Duration::from_secs(3600);
                stop_at = None;
            }
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
            _ = sighup.recv() => {}
            _ = sigquit.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for m in [
            Message::Valid(Duration::from_millis(1234)),
            Message::Stop(Duration::from_secs(10)),
            Message::Signal(15),
        ] {
            assert_eq!(Message::parse(&m.line()), Some(m));
        }
        assert_eq!(Message::parse("valid x"), None);
        assert_eq!(Message::parse("bogus 1"), None);
    }
}
