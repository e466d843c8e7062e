//! `distlock run`: a command under a lock (or a permit, or a read lock);
//! `distlock elect`: a command while leading an election.
//!
//! The command never runs without a live lease behind it. It runs under a
//! supervisor (`distlock __supervise`, see `supervise.rs`) that leads its
//! process group and kills the whole group if this process dies or stops
//! renewing: this process tells it over a private socket, several times per
//! ttl, how long the lease is valid, and tells it at once when the lease is
//! lost. Signals (INT, TERM, HUP) are caught from the start: one that arrives
//! while the lock is awaited ends the wait and leaves nothing queued; later
//! ones are passed to the command.

use std::io::IsTerminal;
use std::time::Duration;

use distlock::{
    Election, ErrorKind, Leadership, LockOptions, Locker, Permit, ReadGuard, RwLock, Semaphore,
    Wait,
};

use crate::exit;
use crate::taking::*;
use crate::under::*;

pub(crate) use crate::taking::{Args, ElectArgs};

/// Runs the command under the lock; returns the exit code.
/// `tell`: say who holds the name while waiting for it (`--verbose`; also
/// when stderr is a terminal).
pub(crate) async fn run(locker: Locker, args: Args, tell: bool) -> u8 {
    let take = match (args.permits, args.shared, args.exclusive) {
        _ if args.all => Take::All(
            args.common
                .name
                .get()
                .split(',')
                .map(str::to_owned)
                .collect(),
        ),
        (Some(n), _, _) => Take::Permits(n),
        (None, true, _) => Take::Shared,
        (None, false, true) => Take::Exclusive,
        (None, false, false) => Take::Lock,
    };
    supervised(locker, &args.common, &take, tell).await
}

/// Runs the command while leading the election; returns the exit code.
pub(crate) async fn elect(locker: Locker, args: ElectArgs, tell: bool) -> u8 {
    supervised(locker, &args.common, &Take::Elect(args.value), tell).await
}

/// Runs the command under what `take` says; returns the exit code.
async fn supervised(locker: Locker, args: &Common, take: &Take, tell: bool) -> u8 {
    let tell = tell || std::io::stderr().is_terminal();
    let code = run_inner(locker, args, take, tell).await;
    // Undo what a dropped acquisition or guard left, before the runtime goes.
    distlock::cleanup::flush(FLUSH).await;
    code
}

async fn run_inner(locker: Locker, args: &Common, take: &Take, tell: bool) -> u8 {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            crate::out::warn_line!("distlock: cannot listen for signals: {e}");
            return exit::SOFTWARE;
        }
    };
    let wait = match (args.no_wait, args.wait) {
        (true, _) => Wait::Try,
        (false, Some(d)) => Wait::For(d),
        (false, None) => Wait::Forever,
    };
    let opts = LockOptions::new()
        .ttl(args.ttl)
        .wait(wait)
        .lock_delay(args.lock_delay.unwrap_or_default());
    let taking = async {
        match take {
            Take::Permits(n) => {
                let sem = Semaphore::new(&locker, args.name.get(), *n)?;
                Ok(sem
                    .acquire(&opts)
                    .await?
                    .map(|p| Lease::One(Permit::into_guard(p))))
            }
            Take::Shared => {
                let rw = RwLock::new(&locker, args.name.get())?;
                Ok(rw
                    .read(&opts)
                    .await?
                    .map(|g| Lease::One(ReadGuard::into_guard(g))))
            }
            Take::Exclusive => {
                let rw = RwLock::new(&locker, args.name.get())?;
                Ok(rw.write(&opts).await?.map(Lease::Write))
            }
            Take::Elect(value) => {
                let election = Election::new(&locker, args.name.get())?;
                Ok(election
                    .campaign_with(value, &opts)
                    .await?
                    .map(|l| Lease::One(Leadership::into_guard(l))))
            }
            Take::All(names) => Ok(locker.acquire_all(names, &opts).await?.map(Lease::Multi)),
            Take::Lock => Ok::<_, distlock::Error>(
                locker
                    .acquire(args.name.get(), &opts)
                    .await?
                    .map(Lease::One),
            ),
        }
    };
    // Once the name is found held, say by whom (and since when).
    let notice = async {
        if !tell || wait == Wait::Try || matches!(take, Take::All(_)) {
            return std::future::pending().await;
        }
        tokio::time::sleep(NOTICE_AFTER).await;
        notice_holder(&locker, args.name.get(), take).await;
    };
    tokio::pin!(taking, notice);
    let mut noticed = false;
    let acquired = loop {
        tokio::select! {
            r = &mut taking => break r,
            sig = signals.recv() => {
                // Dropping the acquisition undoes it (flushed before exit).
                crate::out::warn_line!("distlock: {sig} while waiting for {:?}; not running the command", args.name.get());
                return signal_exit(sig);
            }
            () = &mut notice, if !noticed => noticed = true,
        }
    };
    let guard = match acquired {
        Ok(Some(g)) => g,
        Ok(None) => {
            match take {
                Take::Shared => crate::out::warn_line!(
                    "distlock: a writer holds {:?} or waits for it; not running the command",
                    args.name.get()
                ),
                Take::Exclusive => crate::out::warn_line!(
                    "distlock: readers or a writer hold {:?}; not running the command",
                    args.name.get()
                ),
                Take::Lock => crate::out::warn_line!(
                    "distlock: {:?} is held by another owner; not running the command",
                    args.name.get()
                ),
                Take::Permits(n) => crate::out::warn_line!(
                    "distlock: all {n} permits of {:?} are held; not running the command",
                    args.name.get()
                ),
                Take::Elect(_) => crate::out::warn_line!(
                    "distlock: another candidate leads {:?}; not running the command",
                    args.name.get()
                ),
                Take::All(names) => crate::out::warn_line!(
                    "distlock: one of {names:?} is held by another owner; not running the command"
                ),
            }
            return args.conflict_exit_code;
        }
        Err(e) if e.kind() == ErrorKind::Timeout => {
            crate::out::warn_line!("distlock: {e}; not running the command");
            return args.conflict_exit_code;
        }
        Err(e) => {
            crate::out::fail(&e);
            return exit::for_error(&e);
        }
    };
    tracing::info!(name = %args.name.get(), fence = ?guard.fence(), "lock acquired");
    let code = under_lease(&guard, args, take, &mut signals).await;
    if let Err(e) = guard.release().await {
        if code != args.lost_exit_code {
            crate::out::warn_line!("distlock: the command finished but {e}");
        }
    }
    code
}

/// How long an acquisition runs before `--verbose` says who holds the name.
const NOTICE_AFTER: Duration = Duration::from_millis(300);

/// Says on stderr who holds what `take` waits for on `name`, and since
/// when, as the server tells.
async fn notice_holder(locker: &Locker, name: &str, take: &Take) {
    let h = match locker.holdings(name).await {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!(error = %e, "could not read who holds the name");
            return;
        }
    };
    let who = match take {
        Take::Lock | Take::Elect(_) => h.lock.as_ref().map(crate::show::line),
        Take::All(_) => None,
        Take::Permits(n) => h.permits.first().map(|p| {
            format!(
                "{} of {n} permits held, the first by {}",
                h.permits.len(),
                crate::show::line(&p.holder)
            )
        }),
        Take::Shared => h
            .writer
            .as_ref()
            .map(|w| format!("the writer {}", crate::show::line(&w.holder))),
        Take::Exclusive => match (&h.writer, h.readers.first()) {
            (Some(w), _) => Some(format!("the writer {}", crate::show::line(&w.holder))),
            (None, Some(r)) => Some(format!(
                "{} readers, the first {}",
                h.readers.len(),
                crate::show::line(r)
            )),
            (None, None) => None,
        },
    };
    match who {
        Some(who) => crate::out::warn_line!("distlock: waiting for {name:?}: held by {who}"),
        None => {
            crate::out::warn_line!(
                "distlock: waiting for {name:?} (its holder was not readable or just left)"
            )
        }
    }
}
