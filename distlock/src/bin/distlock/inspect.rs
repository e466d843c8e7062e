//! `distlock inspect`: who holds a lock.

use std::fmt::Write as _;

use distlock::migrate::{Migrating, Sides};
use distlock::{ErrorKind, Locker};
use serde_json::json;

use crate::exit;

/// Arguments of `distlock inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    name: crate::NameArg,
}

/// Prints the holder and waiters of a lock, and for a `migrate:` URL who
/// holds it on each backend (the check before phase 3); returns the exit
/// code.
pub(crate) async fn inspect(locker: Locker, pair: Option<Migrating>, args: Args) -> u8 {
    // `Err` when a backend cannot say who holds the name: no verdict.
    let sides = match &pair {
        Some(p) => Some(match p.sides(args.name.get()).await {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == ErrorKind::InvalidConfig => Err(e.to_string()),
            Err(e) => {
                crate::out::fail(&e);
                return exit::for_error(&e);
            }
        }),
        None => None,
    };
    let info = match locker.inspect(args.name.get()).await {
        Ok(Some(info)) => info,
        Ok(None) => {
            eprintln!(
                "distlock: the {} backend cannot inspect locks",
                locker.backend_name()
            );
            return exit::USAGE;
        }
        Err(e) => {
            crate::out::fail(&e);
            return exit::for_error(&e);
        }
    };
    if args.json {
        let holder = info.holder.as_ref().map(|h| {
            json!({
                "owner": h.owner,
                "fence": h.fence,
                "ttl_remaining_ms": h.ttl_remaining.map(|d| d.as_millis() as u64),
                "value": h.value,
            })
        });
        let mut out = json!({
            "name": args.name.get(),
            "backend": locker.backend_name(),
            "held": info.holder.is_some(),
            "holder": holder,
            "waiters": info.waiters,
        });
        match &sides {
            Some(Ok(s)) => {
                let (old, new) = owners(s);
                out["migration"] = json!({
                    "verdict": s.verdict(),
                    "meaning": s.meaning(),
                    "old_owner": old,
                    "new_owner": new,
                });
            }
            Some(Err(why)) => {
                out["migration"] = json!({
                    "verdict": "cannot_tell",
                    "meaning": why,
                    "old_owner": null,
                    "new_owner": null,
                });
            }
            None => {}
        }
        return crate::out::print(&out.to_string());
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "lock:    {:?} ({})",
        args.name.get(),
        locker.backend_name()
    );
    match &info.holder {
        None => {
            let _ = writeln!(o, "holder:  none (free)");
        }
        Some(h) => {
            let _ = writeln!(o, "holder:  {}", h.owner.as_deref().unwrap_or("(unknown)"));
            match h.fence {
                Some(f) => {
                    let _ = writeln!(o, "fence:   {f}");
                }
                None => {
                    let _ = writeln!(o, "fence:   (none)");
                }
            }
            match h.ttl_remaining {
                Some(d) => {
                    let _ = writeln!(o, "ttl:     {:.3}s remaining", d.as_secs_f64());
                }
                None => {
                    let _ = writeln!(o, "ttl:     (kept alive by a session or connection)");
                }
            }
            if let Some(v) = &h.value {
                let _ = writeln!(o, "value:   {v}");
            }
        }
    }
    match info.waiters {
        Some(n) => {
            let _ = writeln!(o, "waiters: {n}");
        }
        None => {
            let _ = writeln!(o, "waiters: (the backend cannot tell)");
        }
    }
    match &sides {
        Some(Ok(s)) => {
            let (old, new) = owners(s);
            let shown = |o: Option<&str>| o.unwrap_or("(none)").to_owned();
            let _ = writeln!(o, "phase 3: {} ({})", s.verdict(), s.meaning());
            let _ = writeln!(o, "  old:   {}", shown(old));
            let _ = writeln!(o, "  new:   {}", shown(new));
        }
        Some(Err(why)) => {
            let _ = writeln!(o, "phase 3: cannot tell ({why})");
        }
        None => {}
    }
    crate::out::print(o.trim_end())
}

/// The holders on the old and the new backend.
fn owners(s: &Sides) -> (Option<&str>, Option<&str>) {
    match s {
        Sides::Migrating { owner } => (Some(owner), Some(owner)),
        Sides::OldOnly { owner } => (owner.as_deref().or(Some("(unknown)")), None),
        Sides::NewOnly { owner } => (None, owner.as_deref().or(Some("(unknown)"))),
        Sides::Split { old, new } | Sides::Unknown { old, new } => (
            old.as_deref().or(Some("(unknown)")),
            new.as_deref().or(Some("(unknown)")),
        ),
        _ => (None, None),
    }
}
