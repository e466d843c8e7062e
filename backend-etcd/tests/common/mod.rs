//! Helpers of the etcd cases that ask the server directly: a raw client on
//! the target's first member, its `/metrics` counters, and the lease of a
//! lock's holder key.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::time::{Duration, Instant};

use etcd_client::{Client, DeleteOptions, GetOptions};
use lockcore::LockGuard;
use lockcore_conformance::cases::must_be_held;
use lockcore_conformance::{ConnectFuture, Ctx};
use lockcore_etcd::{lock_range, DEFAULT_PREFIX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connects the backend under test to `url`.
pub(crate) fn connect(url: String) -> ConnectFuture {
    Box::pin(async move { lockcore_etcd::connect(&url).await })
}

/// The target's first member, `host:port`.
pub(crate) fn host(ctx: &Ctx) -> String {
    let url = lockcore::raw::address::ServerUrl::parse(&ctx.config, 2379).expect("an etcd:// URL");
    url.hosts[0].to_string()
}

/// A raw client on the target's first member.
pub(crate) async fn raw(ctx: &Ctx) -> Client {
    Client::connect([format!("http://{}", host(ctx))], None)
        .await
        .expect("raw client")
}

/// The server's counter whose line in `/metrics` starts with `series`
/// (its name and labels, as the server prints them).
pub(crate) async fn metric(ctx: &Ctx, series: &str) -> u64 {
    let mut s = tokio::net::TcpStream::connect(host(ctx))
        .await
        .expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .expect("request");
    let mut body = String::new();
    s.read_to_string(&mut body).await.expect("metrics body");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse::<f64>().expect("a number"))
        .unwrap_or_else(|| panic!("no series {series} in the server's /metrics")) as u64
}

/// The lease id of the holder's key of `name`, read on the server.
pub(crate) async fn holder_lease(c: &mut Client, name: &str) -> Option<i64> {
    let range = lock_range(DEFAULT_PREFIX, name);
    let r = c
        .get(range, Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    r.kvs().first().map(|kv| kv.lease())
}

/// The one lease every key of `names` is on, once they all moved there
/// (waits up to two ttls for their first renewals); panics with the
/// leases seen when they did not.
pub(crate) async fn shared_lease_of(c: &mut Client, names: &[String], ttl: Duration) -> i64 {
    let until = Instant::now() + 2 * ttl;
    loop {
        let mut leases = Vec::with_capacity(names.len());
        for n in names {
            leases.push(holder_lease(c, n).await.expect("a key"));
        }
        let first = leases[0];
        if leases.iter().all(|l| *l == first) {
            return first;
        }
        leases.sort_unstable();
        leases.dedup();
        assert!(
            Instant::now() < until,
            "after two ttls, the {} keys are on {} leases, not one",
            names.len(),
            leases.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes the key of `names[gone]` on the server (`etcdctl del`) and
/// checks that its lock alone is lost: its lost signal within `ttl` + 2 s,
/// refused by the key check (not lapsed), and the others still held a ttl
/// later, on the server too.
pub(crate) async fn delete_and_see_it_alone_lost(
    ctx: &Ctx,
    c: &mut Client,
    names: &[String],
    guards: &[LockGuard],
    gone: usize,
    ttl: Duration,
) {
    let deleted = c
        .delete(
            lock_range(DEFAULT_PREFIX, &names[gone]),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("delete");
    assert_eq!(deleted.deleted(), 1, "the holder's key");
    tokio::time::timeout(ttl + Duration::from_secs(2), guards[gone].lost())
        .await
        .expect("the lost signal of the lock whose key was deleted");
    let reason = guards[gone].lost_reason().unwrap_or_default();
    assert!(reason.starts_with("renewal refused"), "lost: {reason}");
    // More renewals of the others (each a third of the ttl).
    tokio::time::sleep(ttl).await;
    let other = ctx.harness.connect().await.expect("connect");
    for (i, (name, g)) in names.iter().zip(guards).enumerate() {
        if i != gone {
            assert!(g.is_held(), "{name} was lost with the deleted one");
            must_be_held(&other, name).await;
        }
    }
}
