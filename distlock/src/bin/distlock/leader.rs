//! `distlock leader`: who leads an election, once or as it changes.

use std::time::Duration;

use distlock::{Election, Leader, Locker};
use tokio::signal::unix::{signal, SignalKind};

use crate::exit;

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
    /// The election's name.
    name: String,
}

/// One line per observation: `term=<N|-> <value>`, or `none`.
fn line(leader: Option<&Leader>) -> String {
    match leader {
        None => "none".to_owned(),
        Some(l) => {
            let term = l.term.map_or_else(|| "-".to_owned(), |t| t.to_string());
            format!("term={term} {}", l.value)
        }
    }
}

/// Prints the leader (and, with `--watch`, each change); returns the exit
/// code.
pub(crate) async fn leader(locker: Locker, args: Args) -> u8 {
    let election = match Election::new(&locker, &args.name) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("distlock: {e}");
            return exit::for_error(&e);
        }
    };
    if !args.watch {
        return match election.leader().await {
            Ok(l) => {
                println!("{}", line(l.as_ref()));
                0
            }
            Err(e) => {
                eprintln!("distlock: {e}");
                exit::for_error(&e)
            }
        };
    }
    let mut interrupt = match signal(SignalKind::interrupt()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("distlock: cannot listen for signals: {e}");
            return exit::SOFTWARE;
        }
    };
    let mut observer = election.observe().every(args.every);
    loop {
        tokio::select! {
            changed = observer.changed() => match changed {
                Ok(l) => println!("{}", line(l.as_ref())),
                Err(e) => {
                    eprintln!("distlock: {e}");
                    return exit::for_error(&e);
                }
            },
            _ = interrupt.recv() => return 0,
        }
    }
}
