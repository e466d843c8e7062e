//! What an operator graphs: the metrics every lock operation emits through
//! the [`metrics`](https://docs.rs/metrics) facade, behind the `metrics`
//! cargo feature, so that any exporter (Prometheus, StatsD,
//! OpenTelemetry) installed by the application collects them. Without the
//! feature, or without an installed recorder, nothing is recorded.
//!
//! Every metric has the label `backend`; the lock's name is a label
//! (`name`) only when asked, with [`LockOptions::metrics_name`] (on a
//! [`Locker`](crate::Locker)'s defaults for all its locks): names are
//! unbounded, and so would be the series.
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | [`ACQUISITIONS`] | counter | `primitive`, `result` (`granted`, `contended`, `timed_out`, `error`), `kind` (for an error) | acquisitions by outcome |
//! | [`ACQUIRE_WAIT`] | histogram | `primitive`, `result` | seconds from asking to the outcome |
//! | [`HANDOFFS`] | counter | `primitive` | grants that came after waiting behind a holder (on a backend that says so: all but MySQL) |
//! | [`LEASES_HELD`] | gauge | | leases held now (granted, not yet released, lost or abandoned) |
//! | [`HOLD`] | histogram | | seconds a lease was held, at its release, loss or abandon |
//! | [`RENEWALS`] | counter | `result` (`ok`, `error`), `kind` | renewals |
//! | [`LEASES_LOST`] | counter | `reason` | leases lost, by reason (a fixed set of texts) |
//! | [`SERVER_CALL`] | histogram | `operation` (`acquire`, `renew`, `release`, `inspect`) | seconds of each call to the backend (an acquisition's includes its wait) |
//!
//! Spans and events go through `tracing` whatever the feature: an
//! acquisition is the span `lockcore.acquire` (fields `backend`, `name`,
//! `primitive`, `owner` (its first 8 characters: a release compares the whole token), and
//! `fence` and `result` once known), a release
//! the span `lockcore.release` (`backend`, `name`, `fence`); a renewal is
//! a `DEBUG` event, a loss a `WARN` event, each with `backend`, `name`
//! and `fence`. Inside an application's request span, a lock wait shows
//! as a child span of the request in a trace.
//!
//! [`LockOptions::metrics_name`]: crate::LockOptions::metrics_name

use std::future::Future;
use std::time::Duration;

use tracing::Instrument;

use crate::error::{ErrorKind, Result};
use crate::info::short_owner;
use crate::options::LockOptions;
use crate::raw::{Mode, OwnerToken};

/// Acquisitions by outcome (counter).
pub const ACQUISITIONS: &str = "lockcore_acquisitions_total";
/// Seconds from asking for a lock to the outcome (histogram).
pub const ACQUIRE_WAIT: &str = "lockcore_acquire_wait_seconds";
/// Grants that came after waiting behind a holder (counter): the backend
/// found the name held, waited and was granted it. Counted on the backends
/// that say so through [`raw::waiting`](crate::raw::waiting): all of this
/// workspace's but MySQL's, whose waits happen inside the server.
pub const HANDOFFS: &str = "lockcore_handoffs_total";
/// Leases held now (gauge).
pub const LEASES_HELD: &str = "lockcore_leases_held";
/// Seconds a lease was held, recorded when it ends (histogram).
pub const HOLD: &str = "lockcore_hold_seconds";
/// Renewals by outcome (counter).
pub const RENEWALS: &str = "lockcore_renewals_total";
/// Leases lost, by reason (counter).
pub const LEASES_LOST: &str = "lockcore_leases_lost_total";
/// Seconds of each call to the backend, by operation (histogram).
pub const SERVER_CALL: &str = "lockcore_server_call_seconds";

/// The `primitive` label of an acquisition's mode.
pub(crate) fn primitive(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "lock",
        Mode::Read => "read",
        Mode::Write => "write",
        Mode::Permit { .. } => "permit",
    }
}

/// The `kind` label of an error kind.
pub(crate) fn kind(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Timeout => "timeout",
        ErrorKind::Lost => "lost",
        ErrorKind::InvalidName => "invalid_name",
        ErrorKind::InvalidConfig => "invalid_config",
        ErrorKind::Unauthorized => "unauthorized",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Indeterminate => "indeterminate",
        ErrorKind::Backend => "backend",
    }
}

/// Runs `acquiring`, the acquisition of `name` by `owner`, in its span,
/// and counts its outcome and wait.
///
/// # Cancel safety
///
/// As `acquiring`'s (a dropped acquisition is not counted).
pub(crate) async fn acquisition<G>(
    backend: &'static str,
    name: &str,
    (mode, owner): (Mode, OwnerToken),
    opts: &LockOptions,
    acquiring: impl Future<Output = Result<Option<G>>>,
    fence: impl Fn(&G) -> Option<u64>,
) -> Result<Option<G>> {
    let owner = owner.to_string();
    let span = tracing::info_span!("lockcore.acquire", backend, name, primitive = primitive(mode), owner = %short_owner(&owner), fence = tracing::field::Empty, result = tracing::field::Empty);
    let began = crate::raw::now();
    let (got, waited) = crate::raw::watch(acquiring).instrument(span.clone()).await;
    let got = got.map_err(|e| e.or_operation("acquire"));
    let result = match &got {
        Ok(Some(g)) => {
            span.record("fence", fence(g));
            "granted"
        }
        Ok(None) => "contended",
        Err(e) if e.kind() == ErrorKind::Timeout => "timed_out",
        Err(_) => "error",
    };
    span.record("result", result);
    let at = Labels::of(backend, name, opts);
    let labels = [("primitive", primitive(mode)), ("result", result)];
    seconds(ACQUIRE_WAIT, at, &labels, began.elapsed());
    match &got {
        Err(e) if result == "error" => {
            let labels = [labels[0], labels[1], ("kind", kind(e.kind()))];
            count(ACQUISITIONS, at, &labels);
        }
        _ => count(ACQUISITIONS, at, &labels),
    }
    if waited && result == "granted" {
        count(HANDOFFS, at, &labels[..1]);
    }
    got
}

/// Where a metric goes: its backend, and the lock's name when asked for.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Labels<'a> {
    pub(crate) backend: &'static str,
    pub(crate) name: Option<&'a str>,
}

#[cfg(feature = "metrics")]
mod emit {
    use metrics::Label;

    use std::sync::Mutex;

    use metrics::Key;

    use super::{Labels, RENEWALS, SERVER_CALL};
    use crate::raw::sync::lock;

    /// What the `metrics` macros of this module's parent give the recorder
    /// (its module path as target, level INFO).
    pub(super) static METADATA: metrics::Metadata<'static> = metrics::Metadata::new(
        "lockcore::observe",
        metrics::Level::INFO,
        Some("lockcore::observe"),
    );

    /// The keys of a successful renewal on `backend`, without the lock's
    /// name: the `renew` server call and the `ok` renewal. Made at the
    /// first renewal on that backend and kept for the process (one pair a
    /// backend name, of which a program has a few).
    pub(super) fn renewal_keys(backend: &'static str) -> &'static (Key, Key) {
        type Keys = Vec<(&'static str, &'static (Key, Key))>;
        static KEYS: Mutex<Keys> = Mutex::new(Vec::new());
        let mut keys = lock(&KEYS);
        if let Some((_, k)) = keys.iter().find(|(b, _)| *b == backend) {
            return k;
        }
        let at = Labels {
            backend,
            name: None,
        };
        let made: &'static (Key, Key) = Box::leak(Box::new((
            Key::from_parts(SERVER_CALL, labels(at, &[("operation", "renew")])),
            Key::from_parts(RENEWALS, labels(at, &[("result", "ok")])),
        )));
        keys.push((backend, made));
        made
    }

    /// The labels of `at` and `more`.
    pub(super) fn labels(at: Labels<'_>, more: &[(&'static str, &'static str)]) -> Vec<Label> {
        let mut out = Vec::with_capacity(2 + more.len());
        out.push(Label::from_static_parts("backend", at.backend));
        if let Some(n) = at.name {
            out.push(Label::new("name", n.to_owned()));
        }
        out.extend(more.iter().map(|(k, v)| Label::from_static_parts(k, v)));
        out
    }
}

impl<'a> Labels<'a> {
    /// The labels of `name` on `backend`, taken with `opts`.
    pub(crate) fn of(backend: &'static str, name: &'a str, opts: &LockOptions) -> Self {
        Labels {
            backend,
            name: opts.get_metrics_name().then_some(name),
        }
    }
}

/// Records a call to the backend for `operation` that took `took`.
pub(crate) fn server_call(at: Labels<'_>, operation: &'static str, took: Duration) {
    seconds(SERVER_CALL, at, &[("operation", operation)], took);
}

/// Adds one to a counter.
#[allow(unused_variables)]
pub(crate) fn count(metric: &'static str, at: Labels<'_>, more: &[(&'static str, &'static str)]) {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric, emit::labels(at, more)).increment(1);
}

/// Records seconds in a histogram.
#[allow(unused_variables)]
pub(crate) fn seconds(
    metric: &'static str,
    at: Labels<'_>,
    more: &[(&'static str, &'static str)],
    took: Duration,
) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(metric, emit::labels(at, more)).record(took.as_secs_f64());
}

/// Moves a gauge by `by`.
#[allow(unused_variables)]
pub(crate) fn gauge(metric: &'static str, at: Labels<'_>, by: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(metric, emit::labels(at, &[])).increment(by);
}

/// Records a successful renewal of a lease at `at` whose server call took
/// `took`: the same as [`server_call`] (`renew`) and [`count`] of
/// [`RENEWALS`] (`ok`). Without the lock's name among the labels (the
/// default), their keys are made once per backend and kept, rather than
/// made (two label lists, two hashes) at every renewal.
#[allow(unused_variables)]
pub(crate) fn renewed(at: Labels<'_>, took: Duration) {
    #[cfg(feature = "metrics")]
    match at.name {
        None => {
            let (call, ok) = emit::renewal_keys(at.backend);
            metrics::with_recorder(|r| {
                r.register_histogram(call, &emit::METADATA)
                    .record(took.as_secs_f64());
                r.register_counter(ok, &emit::METADATA).increment(1);
            });
        }
        Some(_) => {
            server_call(at, "renew", took);
            count(RENEWALS, at, &[("result", "ok")]);
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::{renewed, Labels};

    /// One registration: the metric, its labels, and its metadata's
    /// target, level and module path.
    type Registration = (
        String,
        Vec<(String, String)>,
        String,
        String,
        Option<String>,
    );

    /// A recorder that keeps what it is handed at each registration.
    #[derive(Default)]
    struct Seen(Mutex<Vec<Registration>>);

    impl Seen {
        fn keep(&self, key: &Key, m: &Metadata<'_>) {
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            crate::raw::sync::lock(&self.0).push((
                key.name().to_owned(),
                labels,
                m.target().to_owned(),
                format!("{:?}", m.level()),
                m.module_path().map(str::to_owned),
            ));
        }

        fn take(&self) -> Vec<Registration> {
            std::mem::take(&mut *crate::raw::sync::lock(&self.0))
        }
    }

    impl Recorder for Seen {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
            self.keep(key, m);
            Counter::noop()
        }
        fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
            self.keep(key, m);
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
            self.keep(key, m);
            Histogram::noop()
        }
    }

    /// An unnamed renewal's kept keys and metadata are what the macros
    /// give a named one, less the name: a recorder that filters by target
    /// or level sees both alike.
    #[test]
    fn kept_renewal_keys_match_the_macros() {
        let seen = Seen::default();
        let took = Duration::from_millis(1);
        metrics::with_local_recorder(&seen, || {
            renewed(
                Labels {
                    backend: "memory",
                    name: Some("x"),
                },
                took,
            );
        });
        let mut named = seen.take();
        for r in &mut named {
            r.1.retain(|(k, _)| k != "name");
        }
        metrics::with_local_recorder(&seen, || {
            renewed(
                Labels {
                    backend: "memory",
                    name: None,
                },
                took,
            );
        });
        let unnamed = seen.take();
        assert_eq!(named.len(), 2, "{named:?}");
        assert_eq!(unnamed, named);
    }
}
