//! `distlock inspect`: what the server holds on a name, in every primitive
//! (the lock or an election's leader, a semaphore's permits, a read-write
//! lock's readers and writer).

use std::fmt::Write as _;

use distlock::migrate::{Migrating, Sides};
use distlock::{ErrorKind, Holdings, Locker};
use serde_json::json;

use crate::{exit, show};

/// Arguments of `distlock inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print JSON (its fields are listed below).
    #[arg(long)]
    json: bool,
    /// The semaphore's count, to show the permits as "n of N" (a
    /// semaphore's count is the clients', not the server's).
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    #[command(flatten)]
    name: crate::NameArg,
}

/// Prints what is held on a name, and for a `migrate:` URL who holds it on
/// each backend (the check before phase 3); returns the exit code.
pub(crate) async fn inspect(locker: Locker, pair: Option<Migrating>, args: Args) -> u8 {
    let name = args.name.get();
    // `Err` when a backend cannot say who holds the name: no verdict.
    let sides = match &pair {
        Some(p) => Some(match p.sides(name).await {
            Ok(s) => Ok(s),
            Err(e) if e.kind() == ErrorKind::InvalidConfig => Err(e.to_string()),
            Err(e) => {
                crate::out::fail(&e);
                return exit::for_error(&e);
            }
        }),
        None => None,
    };
    if locker.inspect(name).await.is_ok_and(|i| i.is_none()) {
        crate::out::warn_line!(
            "distlock: the {} backend cannot inspect locks",
            locker.backend_name()
        );
        return exit::USAGE;
    }
    let h = match locker.holdings(name).await {
        Ok(h) => h,
        Err(e) => {
            crate::out::fail(&e);
            return exit::for_error(&e);
        }
    };
    let backend = locker.backend_name();
    if args.json {
        let mut out = json!({
            "name": name,
            "backend": backend,
            "held": !h.is_free(),
            "holder": h.lock.as_ref().map(show::json),
            "waiters": h.waiters,
            "permits": h.permits.iter().map(|p| json!({"slot": p.slot, "holder": show::json(&p.holder)})).collect::<Vec<_>>(),
            "permits_total": args.permits,
            "readers": h.readers.iter().map(show::json).collect::<Vec<_>>(),
            "writer": h.writer.as_ref().map(|w| json!({"holder": show::json(&w.holder), "writing": w.writing})),
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
    let mut o = text(&h, backend, args.permits);
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

/// The text report of `h`.
fn text(h: &Holdings, backend: &str, total: Option<u32>) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "name:    {:?} ({backend})", h.name);
    match &h.lock {
        None if h.is_free() => {
            let _ = writeln!(o, "holder:  none (free)");
        }
        None => {
            let _ = writeln!(o, "lock:    free");
        }
        Some(l) if l.value.is_some() => {
            let _ = writeln!(
                o,
                "leader:  {} (the election's leader; its term is the fence)",
                show::line(l)
            );
        }
        Some(l) => {
            let _ = writeln!(o, "lock:    {}", show::line(l));
        }
    }
    match h.waiters {
        Some(n) => {
            let _ = writeln!(o, "waiters: {n}");
        }
        None => {
            let _ = writeln!(o, "waiters: (the backend cannot tell)");
        }
    }
    if !h.permits.is_empty() || total.is_some() {
        let of = total.map(|n| format!(" of {n}")).unwrap_or_default();
        let _ = writeln!(o, "permits: {}{of} held (semaphore)", h.permits.len());
        for p in &h.permits {
            let slot = p.slot.map(|s| format!("slot {s:04}  ")).unwrap_or_default();
            let _ = writeln!(o, "  {slot}{}", show::line(&p.holder));
        }
    }
    if let Some(w) = &h.writer {
        let state = if w.writing {
            "writing"
        } else {
            "waiting for the readers inside"
        };
        let _ = writeln!(
            o,
            "writer:  {} ({state}; read-write lock)",
            show::line(&w.holder)
        );
    }
    if !h.readers.is_empty() {
        let _ = writeln!(o, "readers: {} (read-write lock)", h.readers.len());
        for r in &h.readers {
            let _ = writeln!(o, "  {}", show::line(r));
        }
    }
    o
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
