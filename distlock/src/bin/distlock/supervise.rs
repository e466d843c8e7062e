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
//! It is a child subreaper: descendants that leave the command's group or
//! lose their parent come to it, and when the command ends (or the group is
//! stopped) every one left is killed, so nothing the command started runs on
//! after the lock is released.
//!
//! Its exit status is the command's (128+N when a signal N ended it).
//!
//! The protocol on the socket, one line per message from `distlock run`:
//! `valid <ms>` (the lease is valid until that instant of the machine's
//! monotonic clock, in milliseconds: absolute, so a message read late never
//! extends anything), `stop <grace ms>` (the lease is lost), `signal <n>`
//! (pass signal n on).

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::time::{clock_gettime, ClockId};
use nix::unistd::{getpgrp, getpid, tcsetpgrp, Pid};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

/// The machine's monotonic clock in milliseconds: the same in every process
/// (0 if it cannot be read, which makes every deadline past).
pub(crate) fn monotonic_ms() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .ok()
        .and_then(|t| {
            let ms = i128::from(t.tv_sec()) * 1000 + i128::from(t.tv_nsec()) / 1_000_000;
            u64::try_from(ms).ok()
        })
        .unwrap_or(0)
}

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
    /// The lease is valid until this instant of the monotonic clock (ms).
    ValidUntil(u64),
    /// The lease is lost: SIGTERM now, SIGKILL after this grace.
    Stop(Duration),
    /// Pass this signal on to the command's group.
    Signal(i32),
}

impl Message {
    /// The line that carries it.
    pub(crate) fn line(self) -> String {
        match self {
            Message::ValidUntil(ms) => format!("valid {ms}\n"),
            Message::Stop(d) => format!("stop {}\n", d.as_millis()),
            Message::Signal(n) => format!("signal {n}\n"),
        }
    }

    fn parse(line: &str) -> Option<Message> {
        let (what, n) = line.trim().split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        match what {
            "valid" => Some(Message::ValidUntil(n)),
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

/// Kills every process of this group but this one, and every descendant
/// that came to this subreaper, until none is left (bounded), reaping them.
fn kill_the_rest() {
    kill_descendants(Some(getpgrp().as_raw()));
}

/// Kills every descendant of this process (and, with `group`, every other
/// process of that group), again and again while any is found (each kill
/// may hand an orphan to this subreaper), reaping what comes to it.
pub(crate) fn kill_descendants(group: Option<i32>) {
    let me = getpid().as_raw();
    for _ in 0..50 {
        let all = processes();
        // Descendants: every process whose chain of parents reaches here.
        let mut mine = vec![me];
        let mut grew = true;
        while grew {
            grew = false;
            for (pid, ppid, _) in &all {
                if mine.contains(ppid) && !mine.contains(pid) {
                    mine.push(*pid);
                    grew = true;
                }
            }
        }
        let mut found = false;
        for (pid, _, pgrp) in &all {
            if *pid != me && (mine.contains(pid) || Some(*pgrp) == group) {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                found = true;
            }
        }
        // Reap what came to us (the command itself was reaped already).
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status.pid().is_none() {
                break;
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// (pid, parent pid, process group) of every process, from /proc.
fn processes() -> Vec<(i32, i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command name (in parentheses): state, ppid, pgrp.
            let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
            let ppid = rest.next()?.parse().ok()?;
            let pgrp = rest.next()?.parse().ok()?;
            Some((pid, ppid, pgrp))
        })
        .collect()
}

/// Ends everything: the rest of the group and the descendants, then the
/// group with this process in it.
fn kill_all() {
    kill_the_rest();
    signal_group(Signal::SIGKILL);
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
            crate::out::warn_line!("distlock: cannot start the supervisor's runtime: {e}");
            return exit::SOFTWARE;
        }
    };
    rt.block_on(run(args))
}

/// The signals the command's group gets, caught here so that this process
/// goes on (the command gets its own default handling back when it starts).
struct Caught {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Caught {
    fn new() -> std::io::Result<Self> {
        Ok(Caught {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// Resolves at the next one (and ignores it).
    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
            _ = self.quit.recv() => {}
        }
    }
}

/// Hands the terminal back to `distlock run`'s group, if it was taken.
fn give_back(foreground: Option<i32>) {
    if let Some(pg) = foreground {
        set_foreground(Pid::from_raw(pg));
    }
}

async fn run(args: Args) -> u8 {
    let Ok(mut caught) = Caught::new() else {
        crate::out::warn_line!("distlock: the supervisor cannot catch signals");
        return exit::SOFTWARE;
    };
    let stream = match UnixStream::connect(&args.socket).await {
        Ok(s) => s,
        Err(e) => {
            crate::out::warn_line!("distlock: the supervisor cannot reach distlock run: {e}");
            return exit::SOFTWARE;
        }
    };
    let mut lines = BufReader::new(stream).lines();
    // Nothing runs before the lease is known valid.
    let deadline = match lines.next_line().await {
        Ok(Some(l)) => match Message::parse(&l) {
            Some(Message::ValidUntil(ms)) => ms,
            _ => return exit::SOFTWARE,
        },
        _ => return exit::SOFTWARE,
    };
    if deadline <= monotonic_ms() {
        return exit::LOST;
    }
    // Orphans of the command come to this process, to be killed at the end.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(error = %e, "cannot become a subreaper; the process group still is killed");
    }
    let foreground = args.foreground.filter(|_| std::io::stdin().is_terminal());
    if foreground.is_some() {
        set_foreground(getpgrp());
    }
    let (program, rest) = match args.command.split_first() {
        Some(split) => split,
        None => return exit::USAGE,
    };
    let child = match tokio::process::Command::new(program).args(rest).spawn() {
        Ok(c) => c,
        Err(e) => {
            give_back(foreground);
            crate::out::warn_line!("distlock: cannot run {program:?}: {e}");
            return exit::NOT_STARTED;
        }
    };
    watch(child, lines, deadline, foreground, &mut caught).await
}

/// Watches the running command: its exit, the lease's deadline, and the
/// messages of `distlock run`; returns the exit code.
async fn watch(
    mut child: tokio::process::Child,
    mut lines: tokio::io::Lines<BufReader<UnixStream>>,
    mut deadline: u64,
    foreground: Option<i32>,
    caught: &mut Caught,
) -> u8 {
    let give_back = || give_back(foreground);
    // After a lost lease: when the grace ends (monotonic ms).
    let mut stop_at: Option<u64> = None;
    let mut listening = true;
    loop {
        let kill_at = stop_at.map_or(deadline, |s| s.min(deadline));
        let left = Duration::from_millis(kill_at.saturating_sub(monotonic_ms()));
        tokio::select! {
            // The deadline first: nothing read late may outrun it.
            biased;
            () = tokio::time::sleep(left) => {
                if monotonic_ms() < kill_at {
                    continue;
                }
                // The lease's validity ran out without word of a renewal, or
                // the grace after a lost lease did.
                give_back();
                kill_all();
                return exit::LOST;
            }
            status = child.wait() => {
                give_back();
                kill_the_rest();
                return match status {
                    Ok(s) => status_code(s),
                    Err(e) => {
                        crate::out::warn_line!("distlock: waiting for the command: {e}");
                        exit::SOFTWARE
                    }
                };
            }
            line = lines.next_line(), if listening => match line.ok().flatten() {
                Some(l) => match Message::parse(&l) {
                    Some(Message::ValidUntil(ms)) => deadline = ms,
                    Some(Message::Stop(grace)) => {
                        signal_group(Signal::SIGTERM);
                        let grace = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
                        stop_at = Some(monotonic_ms().saturating_add(grace));
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
                    kill_all();
                }
            },
            () = caught.next() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        for m in [
            Message::ValidUntil(1234),
            Message::Stop(Duration::from_secs(10)),
            Message::Signal(15),
        ] {
            assert_eq!(Message::parse(&m.line()), Some(m));
        }
        assert_eq!(Message::parse("valid x"), None);
        assert_eq!(Message::parse("bogus 1"), None);
    }
}
