//! `distlock inspect`: who holds a lock.

use distlock::Locker;
use serde_json::json;

use crate::exit;

/// Arguments of `distlock inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The lock name.
    name: String,
}

/// Prints the holder and waiters of a lock; returns the exit code.
pub(crate) async fn inspect(locker: Locker, args: Args) -> u8 {
    let info = match locker.inspect(&args.name).await {
        Ok(Some(info)) => info,
        Ok(None) => {
            eprintln!(
                "distlock: the {} backend cannot inspect locks",
                locker.backend_name()
            );
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("distlock: {e}");
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
        let out = json!({
            "name": args.name,
            "backend": locker.backend_name(),
            "held": info.holder.is_some(),
            "holder": holder,
            "waiters": info.waiters,
        });
        println!("{out}");
        return 0;
    }
    println!("lock:    {:?} ({})", args.name, locker.backend_name());
    match &info.holder {
        None => println!("holder:  none (free)"),
        Some(h) => {
            println!("holder:  {}", h.owner.as_deref().unwrap_or("(unknown)"));
            match h.fence {
                Some(f) => println!("fence:   {f}"),
                None => println!("fence:   (none)"),
            }
            match h.ttl_remaining {
                Some(d) => println!("ttl:     {:.3}s remaining", d.as_secs_f64()),
                None => println!("ttl:     (kept alive by a session or connection)"),
            }
            if let Some(v) = &h.value {
                println!("value:   {v}");
            }
        }
    }
    match info.waiters {
        Some(n) => println!("waiters: {n}"),
        None => println!("waiters: (the backend cannot tell)"),
    }
    0
}
