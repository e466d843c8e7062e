//! Leader election ([`lockcore::Election`]): one leader at a time as the
//! server tells it, observers see the changes, resigning hands over
//! promptly, terms rise, and dropped campaigns leave nothing behind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockcore::{Election, Leader, LockOptions, Wait};

use super::{must_be_held, must_try, until_waiters, SLACK};
use crate::Ctx;

fn election(l: &lockcore::Locker, name: &str) -> Election {
    Election::new(l, name).expect("election")
}

/// A leader is the one the server names (its value and term, asked by
/// another client), another client's campaign is refused at once, and
/// after a resignation the server names no one until the next leader; a
/// plain lock's holder is named with no value.
pub async fn election_one_leader_on_the_server(ctx: Ctx) {
    let name = ctx.name("elect-one");
    let (a, b) = (ctx.locker().await, ctx.locker().await);
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let leading = ea
        .try_campaign("host-a")
        .await
        .unwrap()
        .expect("no leader yet");
    assert!(
        eb.try_campaign("host-b").await.unwrap().is_none(),
        "a second leader"
    );
    must_be_held(&b, &name).await;
    let seen = eb
        .leader()
        .await
        .unwrap()
        .expect("the server names a leader");
    assert_eq!(
        seen,
        Leader {
            value: "host-a".into(),
            term: leading.term()
        }
    );
    let first_term = leading.term();
    leading.resign().await.unwrap();
    assert_eq!(
        eb.leader().await.unwrap(),
        None,
        "no leader after resigning"
    );
    let next = eb
        .try_campaign("host-b")
        .await
        .unwrap()
        .expect("free again");
    let seen = ea.leader().await.unwrap().expect("the next leader");
    assert_eq!(seen.value, "host-b");
    if ctx.caps.has_fencing() {
        assert!(
            next.term() > first_term,
            "terms must rise: {:?} then {:?}",
            first_term,
            next.term()
        );
    }
    next.resign().await.unwrap();
    // A plain lock's holder leads with no value: an earlier leader's
    // value is not shown for it.
    let plain = must_try(&a, &name).await;
    assert_eq!(
        eb.leader().await.unwrap(),
        Some(Leader {
            value: String::new(),
            term: plain.fence()
        })
    );
    plain.release().await.unwrap();
}

/// Clients campaign in turns: never two leaders at once, and each leader,
/// while it leads, is the one the server names.
pub async fn election_exactly_one_leader(ctx: Ctx) {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 3;
    let name = ctx.name("elect-exact");
    let leaders = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let e = election(&ctx.locker().await, &name);
        let leaders = leaders.clone();
        tasks.push(tokio::spawn(async move {
            let mut terms = Vec::new();
            for r in 0..ROUNDS {
                let value = format!("client-{c}-round-{r}");
                let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(60)));
                let l = e
                    .campaign_with(&value, &opts)
                    .await
                    .expect("campaign")
                    .expect("led in time");
                let now = leaders.fetch_add(1, Ordering::SeqCst) + 1;
                assert_eq!(now, 1, "{now} leaders at once");
                let seen = e.leader().await.expect("leader").expect("a leader");
                assert_eq!(seen.value, value, "the server names another leader");
                assert_eq!(seen.term, l.term());
                terms.push(l.term());
                leaders.fetch_sub(1, Ordering::SeqCst);
                l.resign().await.expect("resign");
            }
            terms
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    if ctx.caps.has_fencing() {
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "two leaderships with one term");
    }
}

/// A waiting candidate leads soon after the leader resigns, and an
/// observer on another client sees the first leader, then the second with
/// a larger term.
pub async fn election_resign_hands_over_and_observers_see_it(ctx: Ctx) {
    let name = ctx.name("elect-hand");
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let mut observer = election(&c, &name).observe();
    assert_eq!(observer.changed().await.unwrap(), None, "no leader yet");
    let first = ea.campaign("first").await.unwrap();
    let seen = tokio::time::timeout(SLACK, observer.changed())
        .await
        .expect("the observer saw the first leader")
        .unwrap()
        .expect("a leader");
    assert_eq!(seen.value, "first");
    assert_eq!(seen.term, first.term());
    let waiting = tokio::spawn(async move {
        let l = eb.campaign("second").await.expect("campaign");
        (Instant::now(), l)
    });
    until_waiters(&c, &name, 1).await;
    let first_term = first.term();
    let resigned = Instant::now();
    first.resign().await.unwrap();
    let (led, second) = waiting.await.expect("candidate");
    let took = led.duration_since(resigned);
    assert!(
        took < SLACK,
        "the candidate led {took:?} after the resignation"
    );
    // The observer may see the moment between the two leaders; then it
    // sees the second.
    let deadline = Instant::now() + SLACK;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = tokio::time::timeout(left, observer.changed())
            .await
            .expect("the observer saw the second leader")
            .unwrap();
        let Some(seen) = seen else { continue };
        assert_eq!(seen.value, "second", "an observer saw {seen:?}");
        assert_eq!(seen.term, second.term());
        if ctx.caps.has_fencing() {
            assert!(
                seen.term > first_term,
                "terms rise: {first_term:?} then {:?}",
                seen.term
            );
        }
        break;
    }
    second.resign().await.unwrap();
}

/// Campaigns that time out or are dropped leave nothing: after the leader
/// resigns, no one leads, and another client's campaign wins at once.
pub async fn election_dropped_campaigns_leave_nothing(ctx: Ctx) {
    let name = ctx.name("elect-drop");
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let leading = election(&a, &name)
        .try_campaign("a")
        .await
        .unwrap()
        .expect("leads");
    let eb = election(&b, &name);
    let opts = LockOptions::new().wait(Wait::For(Duration::from_millis(500)));
    let e = eb.campaign_with("b", &opts).await.expect_err("timed out");
    assert_eq!(e.kind(), lockcore::ErrorKind::Timeout, "{e}");
    for ms in [0, 50, 300] {
        let _ = tokio::time::timeout(Duration::from_millis(ms), eb.campaign("b")).await;
    }
    leading.resign().await.unwrap();
    let ec = election(&c, &name);
    let t = Instant::now();
    let won = loop {
        match ec.try_campaign("c").await.unwrap() {
            Some(l) => break l,
            // A dropped campaign's cleanup is one round trip away.
            None if t.elapsed() < SLACK => tokio::time::sleep(Duration::from_millis(20)).await,
            None => panic!("a dropped campaign still leads or queues"),
        }
    };
    assert_eq!(
        ec.leader().await.unwrap().map(|l| l.value),
        Some("c".to_owned())
    );
    won.resign().await.unwrap();
}

/// A value longer than the limit is refused before any server is asked.
pub async fn election_value_too_long_is_refused(ctx: Ctx) {
    let name = ctx.name("elect-long");
    let l = ctx.locker().await;
    let long = "v".repeat(lockcore::election::MAX_VALUE_BYTES + 1);
    let e = election(&l, &name).try_campaign(&long).await.unwrap_err();
    assert_eq!(e.kind(), lockcore::ErrorKind::InvalidConfig);
    assert_eq!(election(&l, &name).leader().await.unwrap(), None);
}

/// A leader whose lease the server takes away gets its lost signal, and
/// the next candidate leads with a larger term: observers then name it.
pub async fn election_revoked_leader_is_lost(ctx: Ctx) {
    let name = ctx.name("elect-revoked");
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let ttl = Duration::from_secs(3);
    let opts = LockOptions::new().ttl(ttl).wait(Wait::Try);
    let first = election(&a, &name)
        .campaign_with("first", &opts)
        .await
        .unwrap()
        .expect("leads");
    assert!(
        ctx.harness.revoke(&name).await.expect("revoke"),
        "revoke found nothing held"
    );
    tokio::time::timeout(ttl + SLACK, first.lost())
        .await
        .expect("lost fires once the lease is gone on the server");
    assert!(!first.is_leader());
    // (A harness may revoke every lease on the name, a waiter's too: the
    // next candidate comes after the revocation.)
    let second = tokio::time::timeout(SLACK * 2, election(&b, &name).campaign("second"))
        .await
        .expect("the next candidate leads")
        .expect("campaign");
    let seen = election(&c, &name)
        .leader()
        .await
        .unwrap()
        .expect("a leader");
    assert_eq!(seen.value, "second");
    if ctx.caps.has_fencing() {
        assert!(second.term() > first.term(), "terms rise");
    }
    second.resign().await.unwrap();
}

/// While leadership passes back and forth, an observer asking all the time
/// only ever names a candidate that campaigned, and its terms never go back.
pub async fn election_observers_never_name_a_vanished_leader(ctx: Ctx) {
    const HANDOVERS: usize = 20;
    let name = ctx.name("elect-vanish");
    let (a, b, c) = (ctx.locker().await, ctx.locker().await, ctx.locker().await);
    let watcher = election(&c, &name);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Leaders the observer has seen so far: the last leader stays until
    // the observer has seen one (on a loaded machine its first read may
    // answer after every handover is done).
    let seen_so_far = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let observing = {
        let (stop, seen_so_far) = (stop.clone(), seen_so_far.clone());
        let fencing = ctx.caps.has_fencing();
        tokio::spawn(async move {
            let mut seen = 0;
            let mut last: Option<Leader> = None;
            while !stop.load(Ordering::SeqCst) {
                if let Some(l) = watcher.leader().await.expect("leader") {
                    assert!(
                        l.value == "a" || l.value == "b",
                        "an observer named {l:?}, no candidate's value"
                    );
                    // One client's reads are ordered: terms never go back,
                    // and one term is one leader. (A term may be unknown: a
                    // migrating pair names a holder seen on its old
                    // backend alone without one.)
                    if let (true, Some(prev), Some(term)) = (fencing, &last, l.term) {
                        assert!(Some(term) >= prev.term, "{prev:?} then {l:?}");
                        if Some(term) == prev.term {
                            assert_eq!(l.value, prev.value, "one term, two values");
                        }
                    }
                    if l.term.is_some() {
                        last = Some(l);
                    }
                    seen += 1;
                    seen_so_far.store(seen, Ordering::SeqCst);
                }
                // The memory backend answers without yielding.
                tokio::task::yield_now().await;
            }
            seen
        })
    };
    let (ea, eb) = (election(&a, &name), election(&b, &name));
    let mut leading = ea.campaign("a").await.unwrap();
    for i in 0..HANDOVERS {
        let next = if i % 2 == 0 { eb.clone() } else { ea.clone() };
        let value = if i % 2 == 0 { "b" } else { "a" };
        let waiting = tokio::spawn(async move { next.campaign(value).await });
        until_waiters(&c, &name, 1).await;
        leading.resign().await.unwrap();
        leading = tokio::time::timeout(SLACK * 2, waiting)
            .await
            .expect("the waiting candidate leads")
            .expect("task")
            .expect("campaign");
    }
    let deadline = Instant::now() + SLACK * 2;
    while seen_so_far.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    leading.resign().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    assert!(
        observing.await.expect("observer") > 0,
        "the observer saw no leader while one led for {:?}",
        SLACK * 2
    );
}
