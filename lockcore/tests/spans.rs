//! Spans and events of lock operations on the memory backend, seen by a
//! `tracing` layer that keeps them (one case: the subscriber is the
//! process's).

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockcore::{LockOptions, Locker, Wait};

/// What the layer saw: spans by name with their fields, and events'
/// messages with their fields.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<Record>>>);

/// A span's or an event's name (an event's message) and its fields.
type Record = (String, HashMap<String, String>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_owned(), v.to_owned());
    }

    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_owned(), format!("{v:?}"));
    }
}

impl<S> tracing_subscriber::Layer<S> for Seen
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut f = HashMap::new();
        f.insert("span.id".to_owned(), format!("{}", id.into_u64()));
        attrs.record(&mut Fields(&mut f));
        self.0
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), f));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut seen = self.0.lock().unwrap();
        let id = format!("{}", id.into_u64());
        if let Some((_, f)) = seen
            .iter_mut()
            .rev()
            .find(|(_, f)| f.get("span.id") == Some(&id))
        {
            values.record(&mut Fields(f));
        }
    }

    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut f = HashMap::new();
        e.record(&mut Fields(&mut f));
        let message = f.get("message").cloned().unwrap_or_default();
        self.0.lock().unwrap().push((message, f));
    }
}

#[tokio::test]
async fn acquire_renew_release_and_loss_are_spans_and_events() {
    use tracing_subscriber::layer::SubscriberExt;
    // The process's subscriber: the lease's renewals run in the watchdog's
    // task, wherever its runtime runs it.
    let seen = Seen::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(seen.clone()))
        .expect("the only subscriber");
    let l = Locker::memory();
    let n = "observe/traced";
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Wait::Try);
    let g = l.acquire(n, &opts).await.unwrap().expect("free");
    let fence = g.fence().expect("a token").to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|(m, f)| m == "lease renewal" && f.get("name").is_some_and(|v| v == n))
    {
        assert!(Instant::now() < deadline, "no renewal event");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    g.release().await.unwrap();
    let lapsing = opts.renew(false);
    let g = l.acquire(n, &lapsing).await.unwrap().expect("free");
    g.lost().await;
    drop(g);

    let seen = seen.0.lock().unwrap().clone();
    let of = |what: &str| -> Vec<HashMap<String, String>> {
        seen.iter()
            .filter(|(m, f)| m == what && f.get("name").is_some_and(|v| v == n))
            .map(|(_, f)| f.clone())
            .collect()
    };
    let acquires = of("lockcore.acquire");
    assert_eq!(acquires.len(), 2, "{seen:?}");
    let first = &acquires[0];
    assert_eq!(first.get("backend").map(String::as_str), Some("memory"));
    assert_eq!(first.get("result").map(String::as_str), Some("granted"));
    assert_eq!(first.get("fence"), Some(&fence));
    assert_eq!(
        first.get("owner").map(|o| o.chars().count()),
        Some(9),
        "{first:?}"
    );
    let renewal = &of("lease renewal")[0];
    assert_eq!(renewal.get("fence"), Some(&format!("Some({fence})")));
    let release = &of("lockcore.release")
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert_eq!(release.get("fence"), Some(&format!("Some({fence})")));
    let lost = of("lock lease lost");
    assert_eq!(lost.len(), 1, "{seen:?}");
    assert!(lost[0].contains_key("reason"), "{lost:?}");
}
