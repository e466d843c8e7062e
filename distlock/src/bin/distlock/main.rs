//! `distlock`: run a command under a distributed lock, a semaphore's permit,
//! a read lock or an election's leadership; inspect a lock, follow an
//! election's leader, and benchmark a backend, from a shell.
//!
//! The backend is chosen by URL (`--url` or `DISTLOCK_URL`); a scheme whose
//! backend was not compiled in fails with a message naming the cargo feature.
//! Exit codes are listed in `distlock --help` and in [`exit`].

#[cfg(not(target_os = "linux"))]
compile_error!(
    "the distlock command line needs Linux: its supervisor relies on PR_SET_CHILD_SUBREAPER and /proc \
     to stop everything a command started; the library (lockcore, distlock without the `cli` feature) is portable"
);

mod bench;
mod exit;
mod inspect;
mod leader;
mod ls;
mod out;
mod run;
mod show;
mod supervise;
mod taking;
mod under;

use std::process::ExitCode;

use clap::{ArgAction, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Distributed locks from the shell: like flock(1), across hosts.
#[derive(Debug, Parser)]
#[command(
    name = "distlock",
    version,
    after_help = exit::HELP,
    arg_required_else_help = true
)]
struct Cli {
    /// The lock backend, e.g. redis://127.0.0.1:6379, redis+sentinel://s1:26379,s2:26379/MASTER,
    /// zk://h1:2181,h2:2181/app,
    /// etcd://127.0.0.1:2379, mysql://user:pass@host/db, postgres://user:pass@host/db,
    /// memory:// (this process only),
    /// migrate:OLD|NEW[#fence_offset=N] (both at once, while a fleet moves from OLD to NEW).
    #[arg(long, env = "DISTLOCK_URL", global = true, hide_env_values = true)]
    url: Option<String>,

    /// More logging on stderr (-v: info, -vv: debug); RUST_LOG takes precedence.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock, renewing it; stop the command if the lease is lost.
    #[command(
        after_help = "Examples:\n  distlock --url redis://127.0.0.1:6379 run --wait 30s nightly-report -- ./report.sh\n  distlock run --permits 4 crawlers -- ./crawl.sh      (DISTLOCK_URL set)\n  distlock run -s config -- ./read-config.sh      (a reader of the read-write lock config)\n  distlock run -x config -- ./write-config.sh     (its writer)\n  distlock run --name -odd-name -- ./job.sh       (a name that starts with -)"
    )]
    Run(run::Args),
    /// Run a command while leading an election, with a value observers see; stop it when leadership is lost.
    #[command(
        after_help = "Example:\n  distlock --url zk://127.0.0.1:2181 elect --value \"$(hostname)\" scheduler -- ./scheduler"
    )]
    Elect(run::ElectArgs),
    /// Print who leads an election (`term=N VALUE`, or `none`); --watch follows the changes.
    #[command(
        after_help = "Examples:\n  distlock --url zk://127.0.0.1:2181 leader scheduler\n  distlock leader --watch scheduler      (DISTLOCK_URL set)"
    )]
    Leader(leader::Args),
    /// Show what is held on a name: the lock or leader, a semaphore's permits, a read-write lock's readers and writer.
    #[command(
        after_help = "Examples:\n  distlock --url redis://127.0.0.1:6379 inspect nightly-report\n  distlock inspect --permits 4 crawlers      (DISTLOCK_URL set)\n  distlock --url 'migrate:redis://r:6379|zk://z:2181' inspect --json nightly-report   (the phase-3 check)\n\nJSON (--json): {name, backend, held (anything held), holder (the lock's or the leader's, or null),\n  waiters, permits: [{slot, holder}], permits_total (--permits), readers: [holder],\n  writer: {holder, writing} or null, migration (migrate: URLs only)}; a holder is {owner, fence,\n  ttl_remaining_ms, value, since_unix_ms, age_ms}, each null where the backend cannot tell."
    )]
    Inspect(inspect::Args),
    /// List the names held on the backend (lock, leader, permit, reader, writer), with owner, fence, age and ttl.
    #[command(
        after_help = "Examples:\n  distlock --url redis://127.0.0.1:6379 ls\n  distlock ls --limit 20 --json jobs/      (DISTLOCK_URL set)"
    )]
    Ls(ls::Args),
    /// Measure a backend: uncontended and contended throughput, hand-off latency, many leases held.
    #[command(
        after_help = "Examples:\n  distlock --url redis://127.0.0.1:6379 bench --duration 3s --json\n  distlock --url redis://127.0.0.1:6379 bench --held-only --held 10000 --duration 60s   (CPU and memory of 10,000 held leases)"
    )]
    Bench(bench::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  distlock completions bash > /etc/bash_completion.d/distlock\n  distlock completions zsh > \"${fpath[1]}/_distlock\"\n  distlock completions fish > ~/.config/fish/completions/distlock.fish"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from this help.
    #[command(
        after_help = "Example:\n  distlock man > /usr/local/share/man/man1/distlock.1 && man distlock"
    )]
    Man,
    /// (Internal) the supervisor `run` starts the command under.
    #[command(name = "__supervise", hide = true)]
    Supervise(supervise::Args),
}

/// The name a command works on: as the argument, or after `--name` (also
/// one that starts with `-`).
#[derive(Debug, clap::Args)]
pub(crate) struct NameArg {
    /// The name (one that starts with `-`: give it with --name).
    #[arg(value_name = "NAME", required_unless_present = "name")]
    positional: Option<String>,
    /// The name, also one that starts with `-` (`--name -x` or `--name=-x`).
    #[arg(
        long = "name",
        value_name = "NAME",
        conflicts_with = "positional",
        allow_hyphen_values = true
    )]
    name: Option<String>,
}

impl NameArg {
    /// The name given.
    pub(crate) fn get(&self) -> &str {
        self.name
            .as_deref()
            .or(self.positional.as_deref())
            .unwrap_or_default()
    }
}

/// Prints the completion script for `shell`; returns the exit code.
fn completions(shell: clap_complete::Shell) -> u8 {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "distlock", &mut script);
    out::print(String::from_utf8_lossy(&script).trim_end())
}

/// Prints the manual page; returns the exit code.
fn man() -> u8 {
    use clap::CommandFactory;
    let mut page = Vec::new();
    if let Err(e) = clap_mangen::Man::new(Cli::command()).render(&mut page) {
        out::fail(&e);
        return exit::SOFTWARE;
    }
    out::print(String::from_utf8_lossy(&page).trim_end())
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    // The ZooKeeper client warns of every host it could not reach; the
    // error that follows says it once.
    let default = if verbose < 2 {
        format!("{default},zookeeper_client=error")
    } else {
        default.to_owned()
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with 0; a usage error to stderr
            // with 64 (EX_USAGE), as the exit codes in --help say.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    init_logging(cli.verbose);
    match cli.command {
        Command::Supervise(args) => return ExitCode::from(supervise::supervise(args)),
        Command::Completions { shell } => return ExitCode::from(completions(shell)),
        Command::Man => return ExitCode::from(man()),
        _ => {}
    }
    let Some(url) = cli.url else {
        crate::out::warn_line!("distlock: no backend: pass --url URL or set DISTLOCK_URL (e.g. redis://127.0.0.1:6379)");
        return ExitCode::from(exit::USAGE);
    };
    // memory:// itself, or as either half of a migrate: pair.
    let pair = url
        .get(..8)
        .filter(|h| h.eq_ignore_ascii_case("migrate:"))
        .map_or(url.as_str(), |_| &url[8..]);
    let in_process = pair.split('|').any(|u| {
        u.split_once(':')
            .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("memory"))
    });
    if in_process
        && matches!(
            cli.command,
            Command::Run(_) | Command::Elect(_) | Command::Leader(_)
        )
    {
        crate::out::warn_line!("distlock: memory:// lives in one process and cannot exclude other processes: give run, elect and leader a server's URL (redis://, zk://, etcd://, mysql://, postgres://)");
        return ExitCode::from(exit::USAGE);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            crate::out::warn_line!("distlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = rt.block_on(async move {
        // `inspect` on a migration also tells who holds the name on each
        // backend: it keeps the pair, connected once.
        let migration = matches!(cli.command, Command::Inspect(_))
            && url
                .get(..8)
                .is_some_and(|h| h.eq_ignore_ascii_case("migrate:"));
        let connected = if migration {
            distlock::connect_migration(&url)
                .await
                .map(|p| (distlock::Locker::new(p.clone()), Some(p)))
        } else {
            distlock::connect(&url).await.map(|l| (l, None))
        };
        let (locker, pair) = match connected {
            Ok(c) => c,
            Err(e) => {
                crate::out::fail(&e);
                return exit::for_error(&e);
            }
        };
        match cli.command {
            Command::Run(args) => run::run(locker, args, cli.verbose > 0).await,
            Command::Elect(args) => run::elect(locker, args, cli.verbose > 0).await,
            Command::Leader(args) => leader::leader(locker, args).await,
            Command::Inspect(args) => inspect::inspect(locker, pair, args).await,
            Command::Ls(args) => ls::ls(locker, args).await,
            Command::Bench(args) => bench::bench(locker, &url, args).await,
            Command::Supervise(_) | Command::Completions { .. } | Command::Man => exit::SOFTWARE,
        }
    });
    ExitCode::from(code)
}
