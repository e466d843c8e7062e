//! The cases of the contract, one public async function each, grouped by the
//! contract's sections: [`acquire`], [`hold`], [`lost`], [`owners`],
//! [`release`], [`fencing`],
//! [`names`], [`cancel`], [`unavailable`] and [`history`]; the lock-delay
//! and multi-name locks ([`delay`]); and the primitives built on the lock:
//! [`semaphore`], [`rwlock`] and [`election`].
//!
//! Time bounds are for a loaded 2-core machine: they tell a wake-up from a
//! poll or a lost wake-up, not fast from slow (speed is for benchmarks).
//!
//! What a case assumes of a backend, so that a new one knows what to meet:
//! - one client holds up to 100 names at once, and 40 waiters of one client
//!   queue on one name while that client still takes other names;
//! - ttls of 1 s are accepted (the contract's minimum);
//! - a lease's validity is counted from before the request that proved it
//!   was sent, less the drift allowance of
//!   [`lockcore::raw::validity_deadline`] for a server in another process;
//! - who holds a name is proven on the server (another client's `try`, or
//!   `inspect`), never by the holder's own `is_held()`.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use lockcore::{LockOptions, Locker, Wait};

use crate::Ctx;

pub mod acquire;
pub mod cancel;
pub mod delay;
pub mod election;
pub mod fencing;
pub mod history;
pub mod hold;
pub mod lost;
pub mod multi;
pub mod names;
pub mod owners;
pub mod release;
pub mod rwlock;
pub mod semaphore;
pub mod unavailable;

/// A case's body.
pub type CaseFn = fn(Ctx) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// One case of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The trial name (after `<target>::`).
    pub name: &'static str,
    /// The body.
    pub run: CaseFn,
    /// `Some(reason)` when the case does not apply to this backend.
    pub skip_unless: fn(&Ctx) -> Option<&'static str>,
}

macro_rules! case {
    ($m:ident :: $f:ident) => {
        case!($m::$f, |_| None)
    };
    ($m:ident :: $f:ident, $skip:expr) => {
        Case {
            name: stringify!($f),
            run: |ctx| Box::pin($m::$f(ctx)),
            skip_unless: $skip,
        }
    };
}

fn unless_revoke(c: &Ctx) -> Option<&'static str> {
    (!c.harness.can_revoke()).then_some("the harness cannot revoke a lease on the server")
}

fn unless_proxy(c: &Ctx) -> Option<&'static str> {
    (!c.harness.can_proxy()).then_some("the harness cannot route a client through a proxy")
}

fn unless_lock_delay(c: &Ctx) -> Option<&'static str> {
    (c.caps.lock_delay == lockcore::LockDelay::Unsupported)
        .then_some("the backend does not enforce a lock-delay")
}

fn unless_values(c: &Ctx) -> Option<&'static str> {
    (!(c.caps.values && c.caps.inspect))
        .then_some("the backend keeps no value beside a lease (no leader election)")
}

fn unless_semaphore(c: &Ctx) -> Option<&'static str> {
    (c.caps.semaphore_layout == lockcore::Layout::Unsupported)
        .then_some("the backends of this migration lay a semaphore out differently (no semaphore)")
}

fn unless_rwlock(c: &Ctx) -> Option<&'static str> {
    (c.caps.rw_layout == lockcore::Layout::Unsupported).then_some(
        "the backends of this migration lay a read-write lock out differently (no read-write lock)",
    )
}

/// Every case, in a stable order.
pub fn cases() -> Vec<Case> {
    vec![
        case!(acquire::basic_acquire_release),
        case!(acquire::holdings_name_every_primitive, |c| (!c
            .caps
            .inspect)
            .then_some("the backend cannot inspect")),
        case!(acquire::try_on_held_name_is_not_acquired),
        case!(acquire::wait_with_timeout_ends_near_deadline),
        case!(acquire::contention_names_the_holder),
        case!(acquire::release_wakes_waiter_quickly),
        case!(acquire::release_between_look_and_watch_wakes, unless_proxy),
        case!(acquire::fair_waiters_in_arrival_order, |c| (!(c.caps.fair
            && c.caps.inspect))
            .then_some(
                "the backend does not declare fair waiting with inspection"
            )),
        case!(acquire::no_herd_on_release, |c| (!c.caps.fair
            || c.harness.wakeups(&[]).is_none())
        .then_some(
            "the backend is not fair, or the harness counts no wake-ups"
        )),
        case!(acquire::waiters_do_not_starve_other_names),
        case!(hold::mutual_exclusion_exact_counter),
        case!(hold::ttl_expiry_after_holder_dies),
        case!(hold::renewal_keeps_lease_past_ttl),
        case!(lost::lost_fires_at_validity_deadline),
        case!(lost::lost_fires_on_time_when_renewal_fails, unless_proxy),
        case!(hold::server_ttl_follows_extend_and_renewals),
        case!(lost::lost_fires_when_lease_is_revoked, unless_revoke),
        case!(hold::validity_is_counted_from_before_the_request),
        case!(owners::guard_outlives_its_locker),
        case!(owners::tasks_sharing_one_locker_exclude),
        case!(owners::explicit_reentrancy_through_the_guard),
        case!(release::owner_checked_release_after_expiry),
        case!(release::stale_owner_cannot_renew_or_release, unless_revoke),
        case!(fencing::fencing_tokens_increase_across_holders, |c| (!c
            .caps
            .has_fencing())
        .then_some("the backend declares no fencing (Fencing::None)")),
        case!(names::odd_and_invalid_names),
        case!(names::odd_names_at_the_root),
        case!(names::many_names_held_at_once),
        case!(names::primitive_parts_are_apart_from_names, |c| {
            unless_rwlock(c).or_else(|| unless_semaphore(c))
        }),
        case!(cancel::cancel_safety_of_dropped_acquire),
        case!(cancel::dropped_at_random_points),
        case!(unavailable::server_absent_gives_unavailable, |c| (!c
            .caps
            .cross_process)
            .then_some("an in-process backend has no server to be absent")),
        case!(unavailable::server_stops_answering, unless_proxy),
        case!(history::history_of_a_contended_run_is_safe),
        case!(delay::lock_delay_after_an_unclean_end, unless_lock_delay),
        case!(
            delay::lock_delay_clean_release_frees_at_once,
            unless_lock_delay
        ),
        case!(
            delay::lock_delay_waited_grant_has_a_full_ttl,
            unless_lock_delay
        ),
        case!(delay::lock_delay_for_leaders_and_permits, unless_lock_delay),
        case!(delay::lock_delay_refused_where_not_enforced, |c| {
            (c.caps.lock_delay != lockcore::LockDelay::Unsupported)
                .then_some("the backend enforces a lock-delay")
        }),
        case!(multi::lock_all_in_opposite_orders_never_deadlocks),
        case!(multi::lock_all_is_all_or_none),
        case!(multi::lock_all_try_is_all_or_none),
        case!(multi::lock_all_dropped_at_random_points),
        case!(multi::lock_all_lost_when_any_lease_is, unless_revoke),
        case!(multi::lock_all_lost_while_waiting_is_refused, unless_revoke),
        case!(semaphore::semaphore_never_more_than_n, unless_semaphore),
        case!(semaphore::semaphore_full_on_the_server, unless_semaphore),
        case!(
            semaphore::semaphore_release_wakes_a_waiter,
            unless_semaphore
        ),
        case!(
            semaphore::semaphore_dropped_waits_leave_nothing,
            unless_semaphore
        ),
        case!(semaphore::semaphore_tokens_rise_across_permits, |c| {
            (!(c.caps.semaphore_layout == lockcore::Layout::Native && c.caps.has_fencing()))
                .then_some("only a native layout with fencing orders every permit")
        }),
        case!(semaphore::semaphore_concurrent_tries_share, |c| {
            (c.caps.semaphore_layout != lockcore::Layout::Native)
                .then_some("a try in the built layout may find a slot's lock busy for a moment")
        }),
        case!(semaphore::semaphore_mismatched_counts_are_an_error, |c| {
            unless_semaphore(c).or_else(|| {
                (c.caps.semaphore_layout == lockcore::Layout::Built && !c.caps.inspect)
                    .then_some("the built layout tells a mismatch by inspecting slots")
            })
        }),
        case!(semaphore::semaphore_refused_where_layouts_differ, |c| {
            (c.caps.semaphore_layout != lockcore::Layout::Unsupported)
                .then_some("the backend has a semaphore")
        }),
        case!(rwlock::rwlock_readers_share_writer_excludes, unless_rwlock),
        case!(rwlock::rwlock_writer_not_starved, unless_rwlock),
        case!(rwlock::rwlock_concurrent_try_reads_share, unless_rwlock),
        case!(
            rwlock::rwlock_writer_tokens_rise,
            |c| if c.caps.has_fencing() {
                unless_rwlock(c)
            } else {
                Some("the backend declares no fencing (Fencing::None)")
            }
        ),
        case!(rwlock::rwlock_dropped_write_leaves_nothing, unless_rwlock),
        case!(rwlock::rwlock_is_not_the_lock_of_its_name, unless_rwlock),
        case!(rwlock::rwlock_reader_tokens_sit_between_writers, |c| {
            (!(c.caps.rw_layout == lockcore::Layout::Native && c.caps.has_fencing()))
                .then_some("only a native layout with fencing orders readers among writers")
        }),
        case!(rwlock::rwlock_refused_where_layouts_differ, |c| {
            (c.caps.rw_layout != lockcore::Layout::Unsupported)
                .then_some("the backend has a read-write lock")
        }),
        case!(election::election_one_leader_on_the_server, unless_values),
        case!(election::election_exactly_one_leader, unless_values),
        case!(
            election::election_resign_hands_over_and_observers_see_it,
            unless_values
        ),
        case!(
            election::election_dropped_campaigns_leave_nothing,
            unless_values
        ),
        case!(election::election_value_too_long_is_refused, unless_values),
        case!(
            election::election_observers_never_name_a_vanished_leader,
            unless_values
        ),
        case!(election::election_revoked_leader_is_lost, |c| {
            unless_values(c).or_else(|| unless_revoke(c))
        }),
    ]
}

/// The shortest ttl the contract allows, for cases where time is the subject.
pub(crate) const SHORT_TTL: Duration = Duration::from_secs(1);
/// Slack for "soon" on a loaded 2-core machine.
pub(crate) const SLACK: Duration = Duration::from_secs(3);
/// The longest a `try` may take: well under the 1 s that a server-side lock
/// wait lasts at least, so a `try` that waits instead of failing at once is
/// caught.
pub(crate) const TRY_BOUND: Duration = Duration::from_millis(800);

pub(crate) fn opts(ttl: Duration, wait: Wait, renew: bool) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(wait).renew(renew)
}

/// Takes a free name with one `try`, or fails the case.
pub(crate) async fn must_try(l: &Locker, name: &str) -> lockcore::LockGuard {
    l.try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"))
        .unwrap_or_else(|| panic!("try_lock({name:?}) found the name held, expected it free"))
}

/// Takes every one of `names` (free, with `ttl` and renewal) at once, and
/// returns the guards in the order of the names: the leases' renewals then
/// come due together, however slow the machine. For a backend's own tests
/// of many held leases.
///
/// # Panics
///
/// When an acquire fails or finds its name held.
pub async fn hold_all(l: &Locker, names: &[String], ttl: Duration) -> Vec<lockcore::LockGuard> {
    let opts = LockOptions::new().ttl(ttl).wait(Wait::Try);
    let mut taking = tokio::task::JoinSet::new();
    for (i, name) in names.iter().enumerate() {
        let (l, name) = (l.clone(), name.clone());
        taking.spawn(async move {
            let g = l.acquire(&name, &opts).await;
            let g = g.unwrap_or_else(|e| panic!("acquire({name:?}) failed: {e}"));
            (
                i,
                g.unwrap_or_else(|| panic!("{name:?} was held, expected it free")),
            )
        });
    }
    let mut guards: Vec<_> = taking.join_all().await;
    guards.sort_by_key(|(i, _)| *i);
    guards.into_iter().map(|(_, g)| g).collect()
}

/// Proves on the server that `name` is held: `l` (another owner) cannot
/// take it, and says so at once. For a backend's own tests too.
///
/// # Panics
///
/// When the try fails, takes the name, or takes longer than a try may.
pub async fn must_be_held(l: &Locker, name: &str) {
    let t = Instant::now();
    let got = l
        .try_lock(name)
        .await
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {e}"));
    assert!(
        got.is_none(),
        "{name:?} was acquired by a second owner while held"
    );
    let took = t.elapsed();
    assert!(
        took < TRY_BOUND,
        "a try on held {name:?} took {took:?}: it must fail at once, not wait"
    );
}

/// Waits until acquired or `within` passes (for cleanups that run in the
/// background: the bound is the point).
pub(crate) async fn acquire_within(
    l: &Locker,
    name: &str,
    within: Duration,
) -> lockcore::LockGuard {
    match l.lock_timeout(name, within).await {
        Ok(g) => g,
        Err(e) => panic!("{name:?} was not free within {within:?}: {e}"),
    }
}

/// Waits until the backend reports `n` waiters on `name`, where it can tell;
/// otherwise gives the waiters a moment to queue (nothing to await then).
pub(crate) async fn until_waiters(l: &Locker, name: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = l.inspect(name).await.expect("inspect");
        let Some(waiters) = info.and_then(|i| i.waiters) else {
            // The backend cannot count waiters: nothing to await.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return;
        };
        if waiters >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} waiters never showed up on {name:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Proves on the server that nothing is left of `name`: another client
/// takes it within `within` (so no leftover lease or queue entry blocks it),
/// and, where the backend can inspect, no holder and no waiter remain after
/// that client released it.
pub(crate) async fn nothing_left(ctx: &Ctx, name: &str, within: Duration) {
    let l = ctx.locker().await;
    acquire_within(&l, name, within)
        .await
        .release()
        .await
        .expect("release");
    if !ctx.caps.inspect {
        return;
    }
    let deadline = Instant::now() + SLACK;
    loop {
        let info = l
            .inspect(name)
            .await
            .expect("inspect")
            .expect("the backend declares inspection");
        let waiters = info.waiters.unwrap_or(0);
        if info.holder.is_none() && waiters == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left on the server for {name:?}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
