//! `distlock bench`: a backend's figures, as a table or JSON.

use std::fmt::Write as _;
use std::time::Duration;

use distlock::Locker;
use indicatif::{ProgressBar, ProgressStyle};
use lockcore::testing::bench as workload;
use lockcore::{Layout, LeaseKind};
use serde_json::json;

use crate::exit;

#[cfg(feature = "metrics")]
mod recorded;

/// Arguments of `distlock bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long each figure is measured.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Tasks for the uncontended figure on distinct names (one connection).
    #[arg(long, default_value_t = 64)]
    tasks: usize,
    /// Clients (each with its own connection) contending for one name.
    #[arg(long, default_value_t = 8)]
    contenders: usize,
    /// Names held at once with renewal, for the memory and CPU figure
    /// [default: 1000, or 100 where each held lock keeps a connection of
    /// its own (MySQL), to stay within the server's connection limit].
    #[arg(long)]
    held: Option<usize>,
    /// ttl of the held leases (renewed every ttl/3).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    held_ttl: Duration,
    /// Measure only the held leases' memory and CPU (for a series of
    /// counts: the process holds nothing else before them).
    #[arg(long)]
    held_only: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Record the library's metrics during the throughput and latency
    /// figures and add them to the JSON as `metrics`, under the names an
    /// exporter shows (`lockcore_acquisitions_total`,
    /// `lockcore_handoffs_total`, `lockcore_acquire_wait_seconds`, ...):
    /// per metric, a list of series with their labels and a value (a
    /// histogram's count, sum, p50, p99 and max, in seconds). Recording
    /// costs throughput, as an installed exporter does; the held leases'
    /// figure is measured with recording off. Needs `--json` and a build
    /// with the `metrics` feature.
    #[arg(long, requires = "json")]
    metrics: bool,
    /// A label for the results (default: the backend's name).
    #[arg(long)]
    label: Option<String>,
}

/// Leases held for the memory and CPU figure, by default.
const HELD: usize = 1000;
/// The same where each held lock keeps a server connection: MariaDB's and
/// MySQL's default `max_connections` is 151.
const HELD_ON_CONNECTIONS: usize = 100;

/// The permits of the semaphore the permit figure is measured on.
const BENCH_PERMITS: u32 = 4;

fn bar(phase: &str, run: Duration) -> ProgressBar {
    let pb = ProgressBar::new(u64::try_from(run.as_millis()).unwrap_or(u64::MAX));
    if let Ok(style) = ProgressStyle::with_template("{msg:40} [{bar:30}] {elapsed}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(phase.to_owned());
    let ticker = pb.clone();
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        while !ticker.is_finished() {
            ticker.set_position(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    pb
}

/// Runs the benchmark; returns the exit code.
pub(crate) async fn bench(locker: Locker, url: &str, args: Args) -> u8 {
    match measure(locker, url, &args).await {
        Ok(text) => crate::out::print(&text),
        Err(e) => {
            crate::out::warn_line!("distlock: bench: {e}");
            exit::for_error(&e)
        }
    }
}

/// The throughput and latency figures (everything but the held leases).
struct Flow {
    one: f64,
    many: f64,
    lat: Vec<Duration>,
    /// Permit pairs a second and the lock's pairs in alternating thirds,
    /// and the permit hand-off latencies.
    sem: Option<((f64, f64), Vec<Duration>)>,
    rw_lat: Option<Vec<Duration>>,
}

async fn flow(locker: &Locker, url: &str, ns: &str, args: &Args) -> distlock::Result<Flow> {
    let run = args.duration;

    let pb = bar("uncontended, 1 task", run);
    let one = workload::uncontended(locker, ns, 1, run).await?;
    pb.finish_and_clear();

    let pb = bar(&format!("uncontended, {} tasks", args.tasks), run);
    let many = workload::uncontended(locker, ns, args.tasks, run).await?;
    pb.finish_and_clear();

    let mut clients = Vec::new();
    for _ in 0..args.contenders {
        clients.push(distlock::connect(url).await?);
    }
    let pb = bar(&format!("contended, {} clients", args.contenders), run);
    let lat = workload::handoffs(clients, &format!("{ns}/contended"), run).await?;
    pb.finish_and_clear();

    // A migration between two semaphore layouts has none.
    let sem = if locker.capabilities().semaphore_layout == Layout::Unsupported {
        None
    } else {
        let pb = bar(
            &format!("semaphore of {BENCH_PERMITS} permits, 1 task"),
            run,
        );
        let pairs =
            workload::permit_pairs(locker, &format!("{ns}/permits"), BENCH_PERMITS, run).await?;
        pb.finish_and_clear();
        let pb = bar(
            &format!(
                "semaphore of {BENCH_PERMITS} permits, {} held, hand-offs of the last to a waiter",
                BENCH_PERMITS - 1
            ),
            run,
        );
        let (a, b) = (distlock::connect(url).await?, distlock::connect(url).await?);
        let lat = workload::permit_handoffs(
            locker,
            &a,
            &b,
            &format!("{ns}/permits-full"),
            BENCH_PERMITS,
            run,
        )
        .await?;
        pb.finish_and_clear();
        Some((pairs, lat))
    };

    // A migration between two read-write lock layouts has none.
    let rw_lat = if locker.capabilities().rw_layout == Layout::Unsupported {
        None
    } else {
        let pb = bar("read-write lock, 1 writer and 1 reader taking turns", run);
        let reader = distlock::connect(url).await?;
        let lat = workload::rw_handoffs(locker, &reader, &format!("{ns}/rw"), run).await?;
        pb.finish_and_clear();
        Some(lat)
    };
    Ok(Flow {
        one,
        many,
        lat,
        sem,
        rw_lat,
    })
}

/// The library's metrics recorded during the throughput and latency
/// figures, by their names in `lockcore::observe` (`null` without the
/// `metrics` feature).
fn library_metrics() -> Option<serde_json::Value> {
    #[cfg(feature = "metrics")]
    return recorded::report();
    #[cfg(not(feature = "metrics"))]
    None
}

async fn measure(locker: Locker, url: &str, args: &Args) -> distlock::Result<String> {
    let ns = format!("distlock-bench/{}", std::process::id());
    let run = args.duration;
    if args.metrics {
        #[cfg(feature = "metrics")]
        recorded::install();
        #[cfg(not(feature = "metrics"))]
        return Err(distlock::Error::invalid_config(
            "distlock",
            "--metrics needs a distlock built with the `metrics` feature",
        ));
    }
    let flow = if args.held_only {
        None
    } else {
        Some(flow(&locker, url, &ns, args).await?)
    };
    #[cfg(feature = "metrics")]
    recorded::pause();
    let held_n = args.held.unwrap_or(match locker.capabilities().lease {
        LeaseKind::Connection => HELD_ON_CONNECTIONS,
        _ => HELD,
    });
    let pb = bar(&format!("{held_n} leases held"), run);
    let held = workload::hold_many(&locker, &ns, held_n, args.held_ttl, run).await?;
    pb.finish_and_clear();

    let cpu_pct = 100.0 * held.cpu.as_secs_f64() / held.wall.as_secs_f64().max(1e-9);
    let held_json = json!({ "leases": held.leases, "all_held": held.all_held, "ttl_s": args.held_ttl.as_secs_f64(),
                            "rss_added_kib": held.rss_added_kib, "cpu_s": held.cpu.as_secs_f64(), "cpu_percent": cpu_pct });
    let held_row = format!(
        "| {} leases held with renewal (ttl {:?}) | +{} KiB resident, {:.2}% CPU{} |",
        held.leases,
        args.held_ttl,
        held.rss_added_kib,
        cpu_pct,
        if held.all_held {
            ""
        } else {
            " (some leases were lost!)"
        }
    );
    let label = args.label.as_deref().unwrap_or(locker.backend_name());
    let Some(flow) = flow else {
        if args.json {
            let out = json!({
                "backend": locker.backend_name(),
                "label": label,
                "duration_s": run.as_secs_f64(),
                "held": held_json,
            });
            return Ok(out.to_string());
        }
        return Ok(format!(
            "backend: {}\n| figure | value |\n|---|---|\n{held_row}",
            locker.backend_name()
        ));
    };
    let Flow {
        one,
        many,
        lat,
        sem,
        rw_lat,
    } = flow;
    let handoffs_per_s = lat.len() as f64 / run.as_secs_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50, p99, max) = (
        ms(workload::percentile(&lat, 0.5)),
        ms(workload::percentile(&lat, 0.99)),
        ms(workload::percentile(&lat, 1.0)),
    );
    let sem_handoff = sem.as_ref().map(|(_, lat)| {
        (
            lat.len(),
            ms(workload::percentile(lat, 0.5)),
            ms(workload::percentile(lat, 1.0)),
        )
    });
    let sem = sem.map(|(pairs, _)| pairs);
    let rw = rw_lat.as_ref().map(|lat| {
        (
            lat.len(),
            ms(workload::percentile(lat, 0.5)),
            ms(workload::percentile(lat, 0.99)),
        )
    });
    if args.json {
        let out = json!({
            "backend": locker.backend_name(),
            "label": label,
            "duration_s": run.as_secs_f64(),
            "uncontended_1_task_pairs_per_s": one,
            "uncontended_tasks": args.tasks,
            "uncontended_n_tasks_pairs_per_s": many,
            "contenders": args.contenders,
            "handoffs": lat.len(),
            "handoffs_per_s": handoffs_per_s,
            "handoff_latency_ms": { "p50": p50, "p99": p99, "max": max },
            "semaphore_permits": BENCH_PERMITS,
            "semaphore_1_task_permits_per_s": sem.map(|(permits, _)| permits),
            "semaphore_lock_floor_pairs_per_s": sem.map(|(_, floor)| floor),
            "semaphore_handoffs": sem_handoff.map(|(n, _, _)| n),
            "semaphore_handoff_latency_ms": sem_handoff.map(|(_, p50, max)| json!({ "p50": p50, "max": max })),
            "rw_handoffs": rw.map(|(n, _, _)| n),
            "rw_handoff_latency_ms": rw.map(|(_, p50, p99)| json!({ "p50": p50, "p99": p99 })),
            "held": held_json,
            "metrics": library_metrics(),
        });
        return Ok(out.to_string());
    }
    let mut o = String::new();
    let _ = writeln!(o, "backend: {}", locker.backend_name());
    let _ = writeln!(o, "| figure | value |");
    let _ = writeln!(o, "|---|---|");
    let _ = writeln!(
        o,
        "| uncontended acquire+release, 1 task | {one:.0} pairs/s |"
    );
    let _ = writeln!(
        o,
        "| uncontended acquire+release, {} tasks, distinct names | {many:.0} pairs/s |",
        args.tasks
    );
    let _ = writeln!(
        o,
        "| contended hand-offs, {} clients on one name | {handoffs_per_s:.0} /s |",
        args.contenders
    );
    let _ = writeln!(
        o,
        "| hand-off latency p50 / p99 / max | {p50:.3} / {p99:.3} / {max:.3} ms |"
    );
    match sem {
        Some((permits, permit_floor)) => {
            let _ = writeln!(
                o,
                "| semaphore of {BENCH_PERMITS} permits, acquire+release, 1 task | {permits:.0} permits/s ({:.2}× the lock's {permit_floor:.0} pairs/s in alternating thirds) |",
                permits / permit_floor.max(1e-9)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "| semaphore of {BENCH_PERMITS} permits | none: the two backends lay a semaphore out differently |"
            );
        }
    }
    if let Some((n, s50, smax)) = sem_handoff {
        let _ = writeln!(
            o,
            "| semaphore permit hand-off to a queued waiter, {} of {BENCH_PERMITS} held, p50 / max of {n} | {s50:.3} / {smax:.3} ms |",
            BENCH_PERMITS - 1
        );
    }
    match rw {
        Some((_, rw50, rw99)) => {
            let _ = writeln!(
                o,
                "| read-write hand-off (writer ↔ reader) p50 / p99 | {rw50:.3} / {rw99:.3} ms |"
            );
        }
        None => {
            let _ = writeln!(
                o,
                "| read-write hand-off (writer ↔ reader) | none: the two backends lay a read-write lock out differently |"
            );
        }
    }
    let _ = writeln!(o, "{held_row}");
    Ok(o.trim_end().to_owned())
}
