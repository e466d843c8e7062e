//! How `inspect` and `ls` show a holder: one line of text, or JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::HolderInfo;
use serde_json::{json, Value};

/// Milliseconds of `d`, saturated.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration as people read it: `850ms`, `12.3s`, `4m05s`, `3h12m`.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s < 1 {
        format!("{}ms", d.as_millis())
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// How long ago `since` was, by this machine's clock (zero for a time
/// ahead of it).
pub(crate) fn age(since: SystemTime) -> Duration {
    SystemTime::now().duration_since(since).unwrap_or_default()
}

/// The holder's fields, as text: `OWNER  fence F  held AGE  ttl T`.
pub(crate) fn line(h: &HolderInfo) -> String {
    let mut out = h
        .owner
        .as_deref()
        .map_or_else(|| "(unknown owner)".to_owned(), printable);
    match h.fence {
        Some(f) => out.push_str(&format!("  fence {f}")),
        None => out.push_str("  fence -"),
    }
    match h.since {
        Some(s) => out.push_str(&format!("  held {}", human(age(s)))),
        None => out.push_str("  held ?"),
    }
    match h.ttl_remaining {
        Some(t) => out.push_str(&format!("  ttl {}", human(t))),
        None => out.push_str("  ttl - (session or connection)"),
    }
    if let Some(v) = &h.value {
        out.push_str(&format!("  value {v:?}"));
    }
    out
}

/// The holder's fields, as JSON: `owner`, `fence`, `ttl_remaining_ms`,
/// `value`, `since_unix_ms`, `age_ms` (each `null` where the backend
/// cannot tell).
pub(crate) fn json(h: &HolderInfo) -> Value {
    json!({
        "owner": h.owner,
        "fence": h.fence,
        "ttl_remaining_ms": h.ttl_remaining.map(ms),
        "value": h.value,
        "since_unix_ms": h.since.and_then(|s| s.duration_since(UNIX_EPOCH).ok()).map(ms),
        "age_ms": h.since.map(|s| ms(age(s))),
    })
}

/// `s` with control characters escaped (`\n`), so that a line stays one.
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}
