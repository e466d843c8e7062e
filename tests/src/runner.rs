//! Turns targets and cases into named trials, with visible skips.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

use crate::cases::{cases, Case, CaseFn};
use crate::{Ctx, Harness};

type MakeFuture = Pin<Box<dyn Future<Output = lockcore::Result<Arc<dyn Harness>>> + Send>>;
type Make = Box<dyn Fn(String) -> MakeFuture + Send + Sync>;

/// How long one case may run before it counts as hung.
const CASE_LIMIT: Duration = Duration::from_secs(180);
/// How long setting up a target may take.
const SETUP_LIMIT: Duration = Duration::from_secs(60);

/// What to tell a user whose server is missing or unreachable, for this
/// workspace's backends (servers from its `compose/`).
pub const COMPOSE_HINT: &str =
    "start the servers with `compose/local up` and `eval \"$(compose/local env)\"` (see compose/README.md)";

/// One backend configuration under test.
pub struct Target {
    name: String,
    env: Option<String>,
    make: Make,
    extra: Vec<Case>,
    shared: bool,
    hint: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A target called `name` (e.g. `"redis-cluster"`) whose server address
    /// is in the environment variable `env` (`None`: no server needed).
    /// `make` gets that variable's value (or `""`) and builds the harness.
    pub fn new<F, Fut>(name: &str, env: Option<&str>, make: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = lockcore::Result<Arc<dyn Harness>>> + Send + 'static,
    {
        Target {
            name: name.to_owned(),
            env: env.map(str::to_owned),
            make: Box::new(move |cfg| Box::pin(make(cfg))),
            extra: Vec::new(),
            shared: true,
            hint: "start the server and set the variable to its lock URL".to_owned(),
        }
    }

    /// What to tell a user whose server is missing or unreachable (how to
    /// start it): shown in the skip line and in a failed `available` trial.
    #[must_use]
    pub fn hint(mut self, hint: &str) -> Self {
        self.hint = hint.to_owned();
        self
    }

    /// Runs only the cases added with [`case`](Target::case), not the shared
    /// suite (for a separate fault-injection binary).
    #[must_use]
    pub fn only_own_cases(mut self) -> Self {
        self.shared = false;
        self
    }

    /// Adds a case specific to this target (fault injection, interop), run
    /// and skipped like the shared ones.
    #[must_use]
    pub fn case(mut self, name: &'static str, run: CaseFn) -> Self {
        self.extra.push(Case {
            name,
            run,
            skip_unless: |_| None,
        });
        self
    }
}

/// Adds cases of its own to a [`Target`], each an `async fn(Ctx)` named as
/// its trial: `own_cases!(target, first_case, second_case)` is
/// `target.case("first_case", |ctx| Box::pin(first_case(ctx)))...`.
#[macro_export]
macro_rules! own_cases {
    ($target:expr, $($case:ident),+ $(,)?) => {
        $target$(.case(stringify!($case), |ctx| Box::pin($case(ctx))))+
    };
}

fn required(target: &str) -> bool {
    std::env::var("LOCKTEST_REQUIRE").is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|t| t == "all" || t == target)
    })
}

fn namespace() -> String {
    format!("lct-{:016x}", rand::random::<u64>())
}

fn failing(name: String, message: String) -> Trial {
    Trial::test(name, move || Err(Failed::from(message)))
}

fn ignored(target: &str, case: &Case, why: &str) -> Trial {
    let why = why.to_owned();
    Trial::test(format!("{target}::{}", case.name), move || {
        Err(Failed::from(why))
    })
    .with_ignored_flag(true)
}

/// Runs every case that applies, against every target, as trials named
/// `<target>::<case>`; returns the process exit code.
///
/// Command-line arguments are those of `cargo test` (a filter, `--exact`,
/// `--ignored`, `--test-threads`, `--list`, ...).
///
/// With `LOCKTEST_WORKER` set, the binary is a worker process of a
/// [`Soak`](crate::Soak) instead (see [`crate::processes`]).
pub fn run(targets: Vec<Target>) -> ExitCode {
    if let Some(code) = worker_mode(&targets) {
        return code;
    }
    run_with(Arguments::from_args(), targets)
}

/// Like [`run`], one trial at a time (for cases that stop and start the
/// servers other cases use).
pub fn run_serial(targets: Vec<Target>) -> ExitCode {
    if let Some(code) = worker_mode(&targets) {
        return code;
    }
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    run_with(args, targets)
}

/// Runs this process as a soak worker for the target `LOCKTEST_WORKER`
/// names, if it names one.
fn worker_mode(targets: &[Target]) -> Option<ExitCode> {
    let name = std::env::var(crate::processes::WORKER_VAR).ok()?;
    let Some(target) = targets.iter().find(|t| t.name == name) else {
        eprintln!("worker: no target called {name:?} in this binary");
        return Some(ExitCode::FAILURE);
    };
    let config = target
        .env
        .as_ref()
        .and_then(|v| std::env::var(v).ok())
        .unwrap_or_default();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("worker: cannot start a tokio runtime: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let outcome = rt.block_on(async {
        let harness = (target.make)(config).await.map_err(|e| e.to_string())?;
        crate::processes::worker(harness).await
    });
    Some(match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worker for {name}: {e}");
            ExitCode::FAILURE
        }
    })
}

fn run_with(args: Arguments, targets: Vec<Target>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if targets.is_empty() {
        eprintln!(
            "no targets: run() was given no Target, so there are no cases to {}",
            if args.list { "list" } else { "run" }
        );
    }
    let ns = namespace();
    let mut trials = Vec::new();
    for target in targets {
        trials.extend(target_trials(&rt, &target, &ns, &args));
    }
    libtest_mimic::run(&args, trials).exit_code()
}

/// Whether the command line's filter and skips select the trial `name`,
/// as libtest decides it.
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |pattern: &str| {
        if args.exact {
            name == pattern
        } else {
            name.contains(pattern)
        }
    };
    args.filter.as_deref().is_none_or(matches) && !args.skip.iter().any(|s| matches(s))
}

fn target_trials(
    rt: &Arc<tokio::runtime::Runtime>,
    target: &Target,
    ns: &str,
    args: &Arguments,
) -> Vec<Trial> {
    let mut all = if target.shared { cases() } else { Vec::new() };
    all.extend(target.extra.iter().copied());
    let config = match &target.env {
        None => String::new(),
        Some(var) => match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => v,
            _ => {
                let why = format!("{var} is unset: {}", target.hint);
                if required(&target.name) {
                    return vec![failing(
                        format!("{}::available", target.name),
                        format!(
                            "backend {} is required by LOCKTEST_REQUIRE but {why}",
                            target.name
                        ),
                    )];
                }
                if !args.list {
                    eprintln!("SKIPPED {}: {why}", target.name);
                }
                return all.iter().map(|c| ignored(&target.name, c, &why)).collect();
            }
        },
    };
    if args.list {
        // Listing needs no server.
        return all
            .iter()
            .map(|c| Trial::test(format!("{}::{}", target.name, c.name), || Ok(())))
            .collect();
    }
    let made = rt
        .block_on(async { tokio::time::timeout(SETUP_LIMIT, (target.make)(config.clone())).await });
    let var = target.env.as_deref().unwrap_or("(none)");
    let shown = lockcore::raw::address::redact(&config);
    let harness = match made {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            return vec![failing(
                format!("{}::available", target.name),
                format!("backend {} ({var}={shown}) could not be set up: {e}. Is the server up? {}", target.name, target.hint),
            )]
        }
        Err(_) => {
            return vec![failing(
                format!("{}::available", target.name),
                format!("backend {} ({var}={shown}) did not answer within {SETUP_LIMIT:?}. Is the server up? {}", target.name, target.hint),
            )]
        }
    };
    let caps = match rt.block_on(harness.connect()) {
        Ok(l) => l.capabilities(),
        Err(e) => {
            return vec![failing(
                format!("{}::available", target.name),
                format!(
                "backend {} ({var}={shown}): a client could not connect: {e}. Is the server up? {}",
                target.name, target.hint
            ),
            )]
        }
    };
    let ctx = Ctx {
        harness,
        caps,
        namespace: format!("{ns}/{}", target.name),
        config,
        target: target.name.clone(),
    };
    all.into_iter()
        .map(|case| {
            if let Some(why) = (case.skip_unless)(&ctx) {
                let name = format!("{}::{}", target.name, case.name);
                // Under `--ignored` libtest runs it, and its failure says why.
                if !args.list && !args.ignored && !args.include_ignored && selected(args, &name) {
                    // libtest prints an ignored trial's name only: say why.
                    eprintln!("ignored {name}: {why}");
                }
                return ignored(&target.name, &case, why);
            }
            let rt = rt.clone();
            let ctx = ctx.clone();
            let run = case.run;
            Trial::test(format!("{}::{}", target.name, case.name), move || {
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    rt.block_on(async { tokio::time::timeout(CASE_LIMIT, run(ctx)).await })
                }));
                match outcome {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) => Err(Failed::from(format!(
                        "the case did not finish within {CASE_LIMIT:?}"
                    ))),
                    Err(panic) => {
                        let msg = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_else(|| "the case panicked".to_owned());
                        Err(Failed::from(msg))
                    }
                }
            })
        })
        .collect()
}
