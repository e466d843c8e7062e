//! `distlock leader`: who leads an election, once or as it changes.

use std::time::Duration;

use distlock::{Election, Leader, Locker};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;
use crate::out::{say, Said};

/// Arguments of `distlock leader`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Keep following: print a line at every change (another leader, or
    /// none) until interrupted.
    #[arg(long)]
    watch: bool,
    /// With --watch: how often to ask the server.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    every: Duration,
    #[command(flatten)]
    name: crate::NameArg,
}

/// One line per observation: `term=<N|-> <value>` (`term=<N|->` for an
/// empty value), or `none`. Control characters in the value are escaped
/// (`\n`), so one observation is always one line.
fn line(leader: Option<&Leader>) -> String {
    match leader {
        None => "none".to_owned(),
        Some(l) => {
            let term = l.term.map_or_else(|| "-".to_owned(), |t| t.to_string());
            if l.value.is_empty() {
                return format!("term={term}");
            }
            let mut value = String::with_capacity(l.value.len());
            for c in l.value.chars() {
                if c.is_control() {
                    value.extend(c.escape_default());
                } else {
                    value.push(c);
                }
            }
            format!("term={term} {value}")
        }
    }
}

/// Whether stdout's reader has gone (a pipe's write end reports an error
/// then), found without writing; false where stdout cannot tell (a file).
fn reader_gone() -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let out = std::io::stdout();
    let mut fds = [PollFd::new(out.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// Prints the leader (and, with `--watch`, each change); returns the exit
/// code.
pub(crate) async fn leader(locker: Locker, args: Args) -> u8 {
    let election = match Election::new(&locker, args.name.get()) {
        Ok(e) => e,
        Err(e) => {
            crate::out::fail(&e);
            return exit::for_error(&e);
        }
    };
    if !args.watch {
        return match election.leader().await {
            Ok(l) => match say(&line(l.as_ref())) {
                Said::Yes | Said::Closed => 0,
                Said::Failed(code) => code,
            },
            Err(e) => {
                crate::out::fail(&e);
                exit::for_error(&e)
            }
        };
    }
    let signals = (|| {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ))
    })();
    let (mut int, mut term, mut hup) = match signals {
        Ok(s) => s,
        Err(e) => {
            crate::out::warn_line!("distlock: cannot listen for signals: {e}");
            return exit::SOFTWARE;
        }
    };
    // A signal ends the watch even while a write blocks on a full pipe.
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        std::process::exit(0);
    });
    // A reader that went away ends the watch too, with no change to print
    // (checked beside the observer, which is never interrupted for it).
    let every = args.every;
    tokio::spawn(async move {
        let mut look = tokio::time::interval(every.max(Duration::from_millis(10)));
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            look.tick().await;
            if reader_gone() {
                std::process::exit(0);
            }
        }
    });
    let mut observer = election.observe().every(args.every);
    loop {
        match observer.changed().await {
            Ok(l) => match say(&line(l.as_ref())) {
                Said::Yes => {}
                Said::Closed => return 0,
                Said::Failed(code) => return code,
            },
            Err(e) => {
                crate::out::fail(&e);
                return exit::for_error(&e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(value: &str, term: Option<u64>) -> Leader {
        Leader {
            value: value.to_owned(),
            term,
        }
    }

    #[test]
    fn one_observation_is_one_line() {
        assert_eq!(line(None), "none");
        assert_eq!(line(Some(&leader("host-a", Some(7)))), "term=7 host-a");
        assert_eq!(line(Some(&leader("", None))), "term=-");
        assert_eq!(line(Some(&leader("a\nb été", Some(1)))), "term=1 a\\nb été");
    }
}
