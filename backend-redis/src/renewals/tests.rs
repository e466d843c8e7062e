//! Rounds told once, parts past their limit, and a call that goes on.

use std::sync::Mutex;

use super::*;

/// A round that records the replies it is told, taking them until
/// its instant.
struct Told(Mutex<Vec<(usize, bool)>>, Instant);

impl Default for Told {
    fn default() -> Self {
        Told(Mutex::default(), Instant::now())
    }
}

impl Round for Told {
    fn answer(&self, at: usize, reply: RedisResult<i64>, _: &mut Answers) {
        self.0.lock().unwrap().push((at, reply.is_ok()));
    }
    fn gave_up(&self, _: Instant) -> bool {
        false
    }
    fn until(&self) -> Instant {
        self.1
    }
}

/// The compose server's URL; `None` (the test skipped) when it is not
/// set and not required.
fn server() -> Option<String> {
    let url = std::env::var("LOCKTEST_REDIS_URL").ok();
    let required = std::env::var("LOCKTEST_REQUIRE").unwrap_or_default();
    if url.is_none() && (required.contains("all") || required.contains("redis")) {
        panic!("LOCKTEST_REDIS_URL is required");
    }
    url
}

/// A round's part whose limit passes while its call is out is told
/// no reply there; the renewals beside it in the call (another
/// lease's, waited for) still get the server's answer, not an error
/// at that round's limit.
#[tokio::test]
async fn a_rounds_limit_cuts_short_only_its_own_part() {
    let Some(url) = server() else { return };
    let cfg = crate::config::RedisConfig::parse(&url).unwrap();
    let crate::config::Topology::Single(node) = &cfg.topology else {
        panic!("{url} is not one instance");
    };
    let renewals = Renewals::new(Managed::lazy(node, &cfg).unwrap(), "server");
    // Its limit has passed already: the call carrying it is still out.
    let past = Arc::new(Told::default());
    renewals.renew_part(&KeyToken::new("k", "t"), 3000, past.clone(), 0);
    let waited = renewals.renew(&KeyToken::new("k2", "t"), 3000).await;
    assert_eq!(waited.ok(), Some(-1), "the waited renewal got no answer");
    assert_eq!(*past.0.lock().unwrap(), vec![(0, false)]);
}

/// A call still out answers the parts of rounds past their limit as
/// none, and leaves the others (a later round's part, a renewal
/// waited for) to the call.
#[test]
fn parts_past_their_limit_are_answered_and_the_rest_wait() {
    let now = Instant::now();
    let past = Arc::new(Told(Mutex::default(), now));
    let later = Arc::new(Told(Mutex::default(), now + Duration::from_secs(1)));
    let lease = KeyToken::new("k", "t");
    let part = |round: &Arc<Told>, at| Renew {
        lease: lease.clone(),
        ttl_ms: 3000,
        reply: Reply::Part(PartOf {
            round: Some(round.clone() as Arc<dyn Round>),
            at,
        }),
    };
    let (tx, mut rx) = oneshot::channel();
    let mut batch = vec![
        part(&past, 0),
        part(&later, 1),
        Renew {
            lease: lease.clone(),
            ttl_ms: 3000,
            reply: Reply::Wait(tx),
        },
    ];
    assert_eq!(next_limit(&batch), Some(now));
    expire_parts(&mut batch, now);
    assert_eq!(*past.0.lock().unwrap(), vec![(0, false)]);
    assert!(later.0.lock().unwrap().is_empty());
    assert!(rx.try_recv().is_err(), "the waited renewal was answered");
    assert_eq!(next_limit(&batch), Some(now + Duration::from_secs(1)));
    // The call's answer reaches the rest, and not the part answered.
    for r in batch {
        r.answer(Ok(1), "server", &mut Answers::new());
    }
    assert_eq!(past.0.lock().unwrap().len(), 1);
    assert_eq!(*later.0.lock().unwrap(), vec![(1, true)]);
    assert_eq!(rx.try_recv().ok().map(|r| r.ok()), Some(Some(1)));
}

/// A part answered is told once; a part dropped unanswered (left out
/// of a call, or its task ended) is told of an error, once.
#[test]
fn a_part_is_told_once_answered_or_dropped() {
    let told = Arc::new(Told::default());
    let part = |at| PartOf {
        round: Some(told.clone() as Arc<dyn Round>),
        at,
    };
    part(0).answer(Ok(1), &mut Answers::new());
    drop(part(1));
    assert_eq!(*told.0.lock().unwrap(), vec![(0, true), (1, false)]);
}
