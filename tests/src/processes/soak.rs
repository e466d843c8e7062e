//! A soak: its settings, its workers and its report.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockcore::testing::history::{LeaseRecord, Summary};

use crate::Ctx;

use super::clock::*;
use super::journal::*;

/// A server fault the soak applies now and then.
#[derive(Debug, Clone)]
pub enum ServerFault {
    /// `compose/local pause` the server for a while, then resume it.
    Pause {
        /// The compose server.
        server: String,
        /// How long it stays paused.
        for_: Duration,
    },
}

/// A soak: client processes on a few names, faults, and the checks.
#[derive(Debug, Clone)]
pub struct Soak {
    /// Worker processes at once (16 by default).
    pub processes: usize,
    /// Names they contend for (3).
    pub names: usize,
    /// How long it runs (`LOCKTEST_SOAK_SECS`, 15 s by default).
    pub duration: Duration,
    /// Leases' ttl (2 s).
    pub ttl: Duration,
    /// Whether workers fault their own clients (blackhole, delay, reset,
    /// pause), where the harness can proxy.
    pub client_faults: bool,
    /// Whether the soak kills and replaces workers now and then.
    pub kill_workers: bool,
    /// Server faults, applied in turn.
    pub server_faults: Vec<ServerFault>,
    /// The targets of this binary the workers connect through, in turn
    /// (empty: the case's own target). Workers of several targets on one
    /// set of names: a migration's phases.
    pub workers_of: Vec<String>,
    /// Whether tokens must rise across the whole history (not when the
    /// workers' tokens come from different backends).
    pub check_tokens: bool,
}

impl Default for Soak {
    fn default() -> Self {
        let secs = std::env::var("LOCKTEST_SOAK_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(15);
        Soak {
            processes: 16,
            names: 3,
            duration: Duration::from_secs(secs),
            ttl: Duration::from_secs(2),
            client_faults: true,
            kill_workers: true,
            server_faults: Vec::new(),
            workers_of: Vec::new(),
            check_tokens: true,
        }
    }
}

/// What a soak saw.
#[derive(Debug, Clone)]
pub struct SoakReport {
    /// Leases granted, over all workers.
    pub leases: usize,
    /// Leases that ended by their lost signal.
    pub lost: usize,
    /// Workers started (including replacements of killed ones).
    pub workers: usize,
    /// Workers killed.
    pub killed: usize,
    /// Server faults applied.
    pub server_faults: usize,
    /// Acquisitions that failed with an error other than a timeout
    /// (unavailable, indeterminate: the faults at work).
    pub errors: u64,
    /// A few of those errors, as examples.
    pub error_samples: Vec<String>,
    /// The history check's summary.
    pub summary: Summary,
}

struct Worker {
    child: tokio::process::Child,
    journal: PathBuf,
}

impl Soak {
    /// Runs the soak against `ctx`'s backend, its workers started from this
    /// test binary for `ctx`'s target.
    ///
    /// # Panics
    ///
    /// When two leases overlapped, tokens did not rise, a worker failed, or
    /// something was left on the server.
    pub async fn run(&self, ctx: &Ctx) -> SoakReport {
        let dir = std::env::temp_dir().join(format!(
            "lockcore-soak-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let names: Vec<String> = (0..self.names)
            .map(|i| ctx.name(&format!("soak/{i}")))
            .collect();
        let until = Instant::now() + self.duration;
        let mut started = 0usize;
        let mut killed_at: HashMap<PathBuf, u64> = HashMap::new();
        let mut workers = Vec::new();
        for _ in 0..self.processes {
            workers.push(self.spawn(&ctx.target, &names, &dir, started, until));
            started += 1;
        }
        let mut faults_applied = 0;
        let mut next_fault = 0usize;
        while Instant::now() < until {
            let pause = Duration::from_millis(1500 + rand::random::<u64>() % 2000);
            tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now()))).await;
            if Instant::now() >= until {
                break;
            }
            if self.kill_workers && rand::random::<bool>() {
                let i = rand::random::<u32>() as usize % workers.len();
                let mut w = workers.swap_remove(i);
                let _ = w.child.start_kill();
                let _ = w.child.wait().await;
                killed_at.insert(w.journal, monotonic_ns());
                workers.push(self.spawn(&ctx.target, &names, &dir, started, until));
                started += 1;
            } else if !self.server_faults.is_empty() {
                let f = &self.server_faults[next_fault % self.server_faults.len()];
                next_fault += 1;
                faults_applied += 1;
                match f {
                    ServerFault::Pause { server, for_ } => {
                        let _undo = crate::UndoOnDrop::new("resume", &[server.as_str()]);
                        crate::compose("pause", server).await;
                        tokio::time::sleep(*for_).await;
                        crate::compose("resume", server).await;
                    }
                }
            }
        }
        let grace = self.ttl * 4 + Duration::from_secs(30);
        for mut w in workers {
            match tokio::time::timeout(grace, w.child.wait()).await {
                Ok(Ok(status)) => assert!(
                    status.success(),
                    "a worker failed ({status}); its journal: {}",
                    w.journal.display()
                ),
                Ok(Err(e)) => panic!("waiting for a worker: {e}"),
                Err(_) => {
                    let _ = w.child.start_kill();
                    panic!("a worker did not finish within {grace:?} of the soak's end");
                }
            }
        }
        let clock = Clock::now();
        let mut records = Vec::new();
        let mut lost = 0;
        let mut errors = 0;
        let mut error_samples = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.map(|e| e.path()).unwrap_or_default();
            let j = read_journal(&path, killed_at.get(&path).copied());
            lost += j.lost;
            errors += j.errors;
            if error_samples.len() < 8 {
                error_samples.extend(j.samples.into_iter().take(2));
            }
            records.extend(
                j.leases
                    .into_iter()
                    .map(|(name, fence, from, to)| LeaseRecord {
                        name,
                        fence,
                        acquired: clock.instant(from),
                        ended: to.map(|t| clock.instant(t)),
                    }),
            );
        }
        let summary = lockcore::testing::history::check(&records)
            .unwrap_or_else(|v| panic!("the soak's history (journals in {}): {v}", dir.display()));
        // Leases of killed workers end by their ttl (or session); then
        // nothing of the soak may be left on the server.
        tokio::time::sleep(self.ttl * 2 + Duration::from_secs(1)).await;
        if let Some(left) = ctx.harness.leftovers(&names).await {
            assert!(
                left.is_empty(),
                "left on the server after the soak: {left:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
        SoakReport {
            leases: records.len(),
            lost,
            workers: started,
            killed: killed_at.len(),
            server_faults: faults_applied,
            errors,
            error_samples,
            summary,
        }
    }

    fn spawn(
        &self,
        target: &str,
        names: &[String],
        dir: &Path,
        n: usize,
        until: Instant,
    ) -> Worker {
        let journal = dir.join(format!("worker-{n}.journal"));
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test binary's path: {e}"));
        let mut plan = String::new();
        let _ = write!(
            plan,
            "secs={};ttl_ms={};seed={};faults={};journal={};names={}",
            until.saturating_duration_since(Instant::now()).as_millis(),
            self.ttl.as_millis(),
            rand::random::<u64>(),
            u8::from(self.client_faults),
            journal.display(),
            names.join(",")
        );
        let child = tokio::process::Command::new(exe)
            .env(WORKER_VAR, target)
            .env(PLAN_VAR, plan)
            .env("RUST_BACKTRACE", "0")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting a worker: {e}"));
        Worker { child, journal }
    }
}

/// The soak every backend's fault tests run: sixteen client processes on
/// three names for `LOCKTEST_SOAK_SECS` (15 s by default), each faulting
/// its own client at random (blackhole, delay, reset, pause), workers
/// killed and replaced, `server` (a `compose/local` service) paused for
/// 1.5 s now and then; then the history of every process is checked (no
/// overlap, rising tokens) and nothing may be left on the server.
pub async fn soak_pausing(ctx: Ctx, server: &'static str) {
    let report = Soak {
        server_faults: vec![ServerFault::Pause {
            server: server.to_owned(),
            for_: Duration::from_millis(1500),
        }],
        ..Soak::default()
    }
    .run(&ctx)
    .await;
    eprintln!("{}::soak: {report:?}", ctx.target);
    assert!(report.leases > 0, "the soak granted nothing");
}
