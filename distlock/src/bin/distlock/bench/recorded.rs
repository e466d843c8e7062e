//! The library's own metrics during a bench, under the names of
//! `lockcore::observe` (`lockcore_acquisitions_total`, ...): the `metrics`
//! object of `distlock bench --json`, so that a bench and an application's
//! dashboards speak of the same series. Recorded while the throughput and
//! latency figures run; off while the held leases' CPU is measured, so that
//! the figure does not count the recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lockcore::raw::sync::lock;
use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use serde_json::{json, Map, Value};

/// Every series recorded so far, by kind.
#[derive(Default)]
struct Series {
    counters: HashMap<Key, Arc<AtomicU64>>,
    gauges: HashMap<Key, Arc<AtomicU64>>,
    histograms: HashMap<Key, Arc<Samples>>,
}

/// A histogram's samples, kept whole (a bench's are few enough).
#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        lock(&self.0).push(value);
    }
}

/// The process's recorder: on or off, and what it kept.
#[derive(Default)]
struct Recorded {
    on: AtomicBool,
    series: Mutex<Series>,
}

/// The installed recorder, if installing it worked.
static RECORDED: OnceLock<&'static Recorded> = OnceLock::new();

/// The recorder as `metrics` takes it: a reference to the static one.
struct Installed(&'static Recorded);

impl Recorder for Installed {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if !self.0.on.load(Ordering::Relaxed) {
            return Counter::noop();
        }
        let mut s = lock(&self.0.series);
        Counter::from_arc(s.counters.entry(key.clone()).or_default().clone())
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        if !self.0.on.load(Ordering::Relaxed) {
            return Gauge::noop();
        }
        let mut s = lock(&self.0.series);
        Gauge::from_arc(s.gauges.entry(key.clone()).or_default().clone())
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if !self.0.on.load(Ordering::Relaxed) {
            return Histogram::noop();
        }
        let mut s = lock(&self.0.series);
        Histogram::from_arc(s.histograms.entry(key.clone()).or_default().clone())
    }
}

/// Installs the recorder, recording from now on. Does nothing if another
/// recorder is installed (the `metrics` object is then left out).
pub(super) fn install() {
    let recorded: &'static Recorded = Box::leak(Box::default());
    recorded.on.store(true, Ordering::Relaxed);
    if metrics::set_global_recorder(Installed(recorded)).is_ok() {
        let _ = RECORDED.set(recorded);
    }
}

/// Stops recording (what was recorded is kept).
pub(super) fn pause() {
    if let Some(r) = RECORDED.get() {
        r.on.store(false, Ordering::Relaxed);
    }
}

/// The series' labels as a JSON object.
fn labels(key: &Key) -> Value {
    let m: Map<String, Value> = key
        .labels()
        .map(|l| (l.key().to_owned(), Value::from(l.value())))
        .collect();
    Value::Object(m)
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let last = v.len().saturating_sub(1);
    // Rounded to the nearest rank: q is in [0, 1], so is the index's range.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((last as f64) * q).round() as usize;
    v.get(i.min(last)).copied().unwrap_or(0.0)
}

/// What was recorded, by metric name: a list of series, each with its
/// labels and its value (a counter's count, a gauge's value, a histogram's
/// count, sum, p50, p99 and max in its unit, seconds). `None` if the
/// recorder is not installed.
pub(super) fn report() -> Option<Value> {
    let r = RECORDED.get()?;
    let s = lock(&r.series);
    let mut out: Map<String, Value> = Map::new();
    let mut put = |key: &Key, v: Value| {
        let entry = out
            .entry(key.name().to_owned())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = entry {
            list.push(v);
        }
    };
    for (key, c) in &s.counters {
        put(
            key,
            json!({ "labels": labels(key), "value": c.load(Ordering::Relaxed) }),
        );
    }
    for (key, g) in &s.gauges {
        let v = f64::from_bits(g.load(Ordering::Relaxed));
        put(key, json!({ "labels": labels(key), "value": v }));
    }
    for (key, h) in &s.histograms {
        let mut v = lock(&h.0).clone();
        v.sort_by(f64::total_cmp);
        put(
            key,
            json!({ "labels": labels(key), "count": v.len(), "sum": v.iter().sum::<f64>(),
                    "p50": quantile(&v, 0.5), "p99": quantile(&v, 0.99), "max": quantile(&v, 1.0) }),
        );
    }
    Some(Value::Object(out))
}
