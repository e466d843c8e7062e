//! Many client processes against one backend, under faults, and the history
//! checker over all of them.
//!
//! A [`Soak`] starts client processes (the test binary itself, run again in
//! worker mode: [`run`](crate::run) and [`run_serial`](crate::run_serial)
//! turn into a worker when `LOCKTEST_WORKER` is set), each contending for a
//! few names with tries, timed and unbounded waits, cancelled
//! acquisitions, holds that outlive their ttl, releases, drops and
//! abandons. Each worker faults its own client at random (its connections
//! blackholed, delayed or reset through its own [`Proxies`], its renewals
//! paused as by a GC pause), the soak kills and replaces whole workers, and
//! pauses servers. Every worker journals each lease as it is granted and as
//! it ends, stamped with the machine's monotonic clock (`CLOCK_MONOTONIC`,
//! shared by every process), so a killed worker's open leases are known too
//! (they end when it died). At the end the journals go through
//! [`lockcore::testing::history::check`]: no two valid leases on a name overlapped
//! and tokens rose. Then the harness reports what is left on the server
//! ([`crate::Harness::leftovers`]): nothing may be.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockcore::testing::history::{LeaseRecord, Summary};
use lockcore::{LockOptions, Locker, Wait};

use crate::{ClientPause, Ctx, Dir, Harness, Proxies};

/// The environment variable that turns a test binary into a worker: the
/// target's name.
pub const WORKER_VAR: &str = "LOCKTEST_WORKER";
const PLAN_VAR: &str = "LOCKTEST_WORKER_PLAN";

/// Nanoseconds on the machine's monotonic clock, the same in every process.
pub fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => {
            let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
            secs.saturating_mul(1_000_000_000).saturating_add(nanos)
        }
        Err(_) => 0,
    }
}

/// Converts between this process's `Instant`s and [`monotonic_ns`].
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    ns: u64,
    at: Instant,
}

impl Clock {
    /// The conversion as of now.
    pub fn now() -> Self {
        let at = lockcore::raw::now();
        Clock {
            ns: monotonic_ns(),
            at,
        }
    }

    /// `t` on the machine's clock.
    pub fn ns(&self, t: Instant) -> u64 {
        if t >= self.at {
            self.ns
                .saturating_add(u64::try_from((t - self.at).as_nanos()).unwrap_or(u64::MAX))
        } else {
            self.ns
                .saturating_sub(u64::try_from((self.at - t).as_nanos()).unwrap_or(u64::MAX))
        }
    }

    /// The machine's clock reading `ns` as an `Instant` of this process.
    pub fn instant(&self, ns: u64) -> Instant {
        if ns >= self.ns {
            self.at + Duration::from_nanos(ns - self.ns)
        } else {
            self.at
                .checked_sub(Duration::from_nanos(self.ns - ns))
                .unwrap_or(self.at)
        }
    }
}

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

struct Journal {
    leases: Vec<(String, Option<u64>, u64, Option<u64>)>,
    lost: usize,
    errors: u64,
    samples: Vec<String>,
}

/// Reads a worker's journal: `A id name fence ns`, `E id ns how`, `X errors`.
/// Leases still open in a killed worker end when it was killed.
fn read_journal(path: &Path, killed: Option<u64>) -> Journal {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut j = Journal {
        leases: Vec::new(),
        lost: 0,
        errors: 0,
        samples: Vec::new(),
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f.as_slice() {
            ["A", id, name, fence, ns] => {
                let (Ok(id), Ok(ns)) = (id.parse(), ns.parse()) else {
                    continue;
                };
                open.insert(id, j.leases.len());
                j.leases
                    .push(((*name).to_owned(), fence.parse().ok(), ns, None));
            }
            ["E", id, ns, how] => {
                let (Ok(id), Ok(ns)) = (id.parse::<u64>(), ns.parse()) else {
                    continue;
                };
                if let Some(i) = open.remove(&id) {
                    j.leases[i].3 = Some(ns);
                }
                if how.starts_with("lost") {
                    j.lost += 1;
                }
            }
            ["X", n] => j.errors = n.parse().unwrap_or(0),
            ["R", kind, msg] => j.samples.push(format!("{kind}: {msg}")),
            _ => {}
        }
    }
    for (_, i) in open {
        // A lease still open: its worker died (then it ended at the kill)
        // or never ended it, which the check reports as an overlap.
        j.leases[i].3 = killed;
    }
    j
}

struct JournalFile {
    file: Mutex<std::fs::File>,
    clock: Clock,
    next: AtomicU64,
}

impl JournalFile {
    fn line(&self, s: &str) {
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = f.write_all(s.as_bytes());
    }
}

/// A worker process's body: `LOCKTEST_WORKER` names the target whose
/// harness `harness` is; the plan comes from `LOCKTEST_WORKER_PLAN`.
pub(crate) async fn worker(harness: Arc<dyn Harness>) -> Result<(), String> {
    let plan_text = std::env::var(PLAN_VAR).map_err(|_| format!("{PLAN_VAR} is unset"))?;
    let plan: HashMap<&str, &str> = plan_text
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let get = |k: &str| {
        plan.get(k)
            .copied()
            .ok_or_else(|| format!("the plan has no {k}"))
    };
    let num = |k: &str| -> Result<u64, String> {
        get(k)?.parse().map_err(|e| format!("the plan's {k}: {e}"))
    };
    let run_for = Duration::from_millis(num("secs")?);
    let ttl = Duration::from_millis(num("ttl_ms")?);
    let seed = num("seed")?;
    let faults = num("faults")? == 1;
    let names: Vec<String> = get("names")?.split(',').map(str::to_owned).collect();
    let file = std::fs::File::create(get("journal")?).map_err(|e| e.to_string())?;
    let journal = Arc::new(JournalFile {
        file: Mutex::new(file),
        clock: Clock::now(),
        next: AtomicU64::new(0),
    });
    let until = Instant::now() + run_for;
    let proxies = Proxies::new();
    let pause = ClientPause::new();
    let base = if faults && harness.can_proxy() {
        match harness.connect_via(&proxies).await {
            Some(Ok(l)) => l,
            Some(Err(e)) => return Err(format!("connecting through a proxy: {e}")),
            None => harness.connect().await.map_err(|e| e.to_string())?,
        }
    } else {
        harness.connect().await.map_err(|e| e.to_string())?
    };
    let locker = if faults { pause.wrap(&base) } else { base };
    let errors = Arc::new(AtomicU64::new(0));
    let rng = Arc::new(AtomicU64::new(seed));
    let mut tasks = Vec::new();
    for t in 0..3u64 {
        tasks.push(tokio::spawn(contend(
            locker.clone(),
            names.clone(),
            ttl,
            until,
            seed.wrapping_add(t),
            journal.clone(),
            errors.clone(),
        )));
    }
    if faults {
        let (proxies, pause, rng) = (proxies.clone(), pause.clone(), rng.clone());
        // A connection-kept lease ends on the server the moment its
        // connection is reset, before its holder can know (the known limit
        // of LeaseKind::Connection): no resets there.
        let resets = locker.capabilities().lease != lockcore::LeaseKind::Connection;
        tasks.push(tokio::spawn(async move {
            inject(&proxies, &pause, ttl, until, &rng, resets).await;
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("a worker task failed: {e}"))?;
    }
    proxies.heal();
    pause.resume();
    lockcore::cleanup::flush(Duration::from_secs(10)).await;
    journal.line(&format!("X\t{}\n", errors.load(Ordering::Relaxed)));
    Ok(())
}

fn next(rng: &AtomicU64) -> u64 {
    let state = rng
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn millis(rng: &AtomicU64, max: u64) -> Duration {
    Duration::from_millis(next(rng) % (max + 1))
}

/// Faults this worker's own client now and then.
async fn inject(
    proxies: &Proxies,
    pause: &ClientPause,
    ttl: Duration,
    until: Instant,
    rng: &AtomicU64,
    resets: bool,
) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2000) + millis(rng, 4000)).await;
        let span = millis(rng, ttl_ms * 2);
        match next(rng) % 4 {
            0 => {
                proxies.blackhole(Dir::Both);
                tokio::time::sleep(span).await;
                proxies.heal();
            }
            1 => {
                proxies.delay(Dir::Down, Duration::from_millis(50) + millis(rng, 250));
                tokio::time::sleep(span).await;
                proxies.heal();
            }
            2 if resets => proxies.reset(),
            _ => {
                pause.pause();
                tokio::time::sleep(span).await;
                pause.resume();
            }
        }
    }
}

/// One contending task of a worker.
async fn contend(
    locker: Locker,
    names: Vec<String>,
    ttl: Duration,
    until: Instant,
    seed: u64,
    journal: Arc<JournalFile>,
    errors: Arc<AtomicU64>,
) {
    let rng = AtomicU64::new(seed);
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    while Instant::now() < until {
        let name = &names[usize::try_from(next(&rng) % names.len() as u64).unwrap_or(0)];
        let wait = match next(&rng) % 3 {
            0 => Wait::Try,
            1 => Wait::For(millis(&rng, 2000)),
            _ => Wait::For(until.saturating_duration_since(Instant::now()) + ttl),
        };
        let opts = LockOptions::new().ttl(ttl).wait(wait);
        let acquire = locker.acquire(name, &opts);
        let outcome = if next(&rng).is_multiple_of(5) {
            // Cut off at a random point.
            match tokio::time::timeout(millis(&rng, 500), acquire).await {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            acquire.await
        };
        let guard = match outcome {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) if e.kind() == lockcore::ErrorKind::Timeout => continue,
            Err(e) => {
                if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    journal.line(&format!(
                        "R\t{:?}\t{}\n",
                        e.kind(),
                        e.to_string().replace(['\t', '\n'], " ")
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acquired = lockcore::raw::now();
        let id = journal.next.fetch_add(1, Ordering::Relaxed);
        let fence = guard
            .fence()
            .map_or_else(|| "-".to_owned(), |f| f.to_string());
        journal.line(&format!(
            "A\t{id}\t{name}\t{fence}\t{}\n",
            journal.clock.ns(acquired)
        ));
        // Mostly short holds, now and then one past several renewals.
        let hold = if next(&rng).is_multiple_of(5) {
            millis(&rng, ttl_ms * 2)
        } else {
            millis(&rng, 30)
        };
        let lost = tokio::select! {
            () = guard.lost() => true,
            () = tokio::time::sleep(hold) => false,
        };
        let ended = guard.validity_end(lockcore::raw::now());
        let how = if lost || !guard.is_held() {
            format!("lost: {}", guard.lost_reason().unwrap_or("?"))
        } else {
            "released".to_owned()
        };
        journal.line(&format!("E\t{id}\t{}\t{how}\n", journal.clock.ns(ended)));
        match next(&rng) % 4 {
            0 => drop(guard),
            1 => guard.abandon(),
            _ => {
                let _ = guard.release().await;
            }
        }
    }
}
