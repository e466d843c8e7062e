//! The command under a held lease: the supervisor it runs under, the
//! messages that keep it going, the end of the command's group.

use std::io::IsTerminal;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::{getpgrp, tcgetpgrp, Pid};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::Child;

use crate::exit;
use crate::supervise::{monotonic_ms, set_foreground, status_code, Message};
use crate::taking::*;

/// 128 + the signal's number, as a shell reports it.
pub(crate) fn signal_exit(sig: Signal) -> u8 {
    u8::try_from(128 + sig as i32).unwrap_or(exit::SOFTWARE)
}

/// A private directory (mode 0700) for the supervisor's socket.
pub(crate) fn private_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "distlock-{}-{}",
        std::process::id(),
        distlock::raw::OwnerToken::random()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Removes the socket and its directory (the connection stays).
pub(crate) fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills the supervisor's whole group (the command's): also what is left
/// of it after the supervisor ended.
pub(crate) fn kill_group(group: Option<Pid>) {
    if let Some(g) = group {
        let _ = killpg(g, Signal::SIGKILL);
    }
}

/// Until when the lease is valid, on the monotonic clock shared with the
/// supervisor; `None` once lost.
pub(crate) fn valid_until(guard: &Lease) -> Option<Message> {
    let left = guard
        .valid_until()?
        .saturating_duration_since(std::time::Instant::now());
    let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
    Some(Message::ValidUntil(monotonic_ms().saturating_add(left)))
}

/// How a message to the supervisor went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// It is on its way.
    Yes,
    /// The supervisor closed its end: it is ending (its exit status tells).
    Closed,
    /// It did not go out in time: the supervisor no longer reads.
    Stuck,
}

/// Sends `m` to the supervisor.
pub(crate) async fn send(conn: &mut UnixStream, m: Message) -> Sent {
    match tokio::time::timeout(SEND_LIMIT, conn.write_all(m.line().as_bytes())).await {
        Ok(Ok(())) => Sent::Yes,
        Ok(Err(_)) => Sent::Closed,
        Err(_) => Sent::Stuck,
    }
}

/// The supervisor stopped reading (stopped, stuck): no one could stop the
/// command when the lease goes, so it is killed now.
pub(crate) async fn stuck(group: Option<Pid>, child: &mut Child) -> u8 {
    crate::out::warn_line!(
        "distlock: the command's supervisor stopped answering; the command was killed"
    );
    kill_group(group);
    let _ = child.wait().await;
    exit::SOFTWARE
}

/// A started supervisor: its process, its group, and its socket.
pub(crate) struct Supervisor {
    pub(crate) child: Child,
    pub(crate) group: Option<Pid>,
    pub(crate) conn: UnixStream,
    /// The group distlock gave the terminal away from, if it did.
    pub(crate) foreground: Option<Pid>,
}

/// Starts the supervisor (the command waits for its first message) and
/// takes its connection on a socket in a private directory; the error is
/// the exit code, after a message.
pub(crate) async fn start_supervisor(
    guard: &Lease,
    args: &Common,
    take: &Take,
) -> Result<Supervisor, u8> {
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
pub(crate) async fn under_lease(
    guard: &Lease,
    args: &Common,
    take: &Take,
    signals: &mut Signals,
) -> u8 {
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
