//! `distlock ls`: the names held on a backend, with who holds them.

use std::fmt::Write as _;

use distlock::{HolderInfo, Locker};
use serde_json::{json, Value};

use crate::{exit, show};

/// Arguments of `distlock ls`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print JSON: an array of {name, kind, slot, holder} (holder as in
    /// `inspect --json`), and `truncated`.
    #[arg(long)]
    json: bool,
    /// List at most this many names.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Only names that start with this (default: every name).
    #[arg(default_value = "", allow_hyphen_values = true)]
    prefix: String,
}

/// One holder of a listed name: (name, kind, slot, holder).
type Row<'a> = (&'a str, &'static str, Option<u32>, &'a HolderInfo);

/// Lists the names held; returns the exit code.
pub(crate) async fn ls(locker: Locker, args: Args) -> u8 {
    if args.limit == 0 {
        crate::out::warn_line!("distlock: --limit must be at least 1");
        return exit::USAGE;
    }
    let found = match locker.held(&args.prefix, args.limit).await {
        Ok(Some(h)) => h,
        Ok(None) => {
            crate::out::warn_line!(
                "distlock: the {} backend cannot list names",
                locker.backend_name()
            );
            return exit::USAGE;
        }
        Err(e) => {
            crate::out::fail(&e);
            return exit::for_error(&e);
        }
    };
    let (held, truncated) = (&found.names, found.truncated);
    let mut rows: Vec<Row<'_>> = Vec::new();
    for h in held {
        if let Some(l) = &h.lock {
            let kind = if l.value.is_some() { "leader" } else { "lock" };
            rows.push((&h.name, kind, None, l));
        }
        for p in &h.permits {
            rows.push((&h.name, "permit", p.slot, &p.holder));
        }
        if let Some(w) = &h.writer {
            let kind = if w.writing {
                "writer"
            } else {
                "writer-waiting"
            };
            rows.push((&h.name, kind, None, &w.holder));
        }
        for r in &h.readers {
            rows.push((&h.name, "reader", None, r));
        }
    }
    if args.json {
        let items: Vec<Value> = rows
            .iter()
            .map(|(name, kind, slot, holder)| {
                json!({"name": name, "kind": kind, "slot": slot, "holder": show::json(holder)})
            })
            .collect();
        let out = json!({"backend": locker.backend_name(), "held": items, "truncated": truncated});
        return crate::out::print(&out.to_string());
    }
    let mut o = String::new();
    for (name, kind, slot, holder) in &rows {
        let kind = match slot {
            Some(s) => format!("{kind}[{s}]"),
            None => (*kind).to_owned(),
        };
        let _ = writeln!(
            o,
            "{}  {kind}  {}",
            show::printable(name),
            show::line(holder)
        );
    }
    if rows.is_empty() {
        let _ = writeln!(o, "(nothing held)");
    }
    if truncated {
        crate::out::warn_line!(
            "distlock: the first {} names; more may be held (--limit)",
            args.limit
        );
    }
    crate::out::print(o.trim_end())
}
