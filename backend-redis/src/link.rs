//! One connection to one server, of either kind the backend keeps: the
//! client library's connection manager (a fixed address) or a plain
//! multiplexed connection (the master Sentinel named); and the checks made
//! on it.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection of either source; cheap to clone.
#[derive(Clone)]
pub(crate) enum Link {
    /// To a fixed address.
    Manager(ConnectionManager),
    /// To the master the sentinels named.
    Master(MultiplexedConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Manager(c) => c.req_packed_command(cmd),
            Link::Master(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Master(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Manager(c) => c.get_db(),
            Link::Master(c) => c.get_db(),
        }
    }
}

/// Whether `c` answers `ROLE` as a master within `within`.
pub(crate) async fn is_master(c: &mut Link, within: Duration) -> bool {
    let cmd = redis::cmd("ROLE");
    matches!(
        tokio::time::timeout(within, cmd.query_async::<redis::Role>(c)).await,
        Ok(Ok(redis::Role::Primary { .. }))
    )
}

/// Whether `c` answers a `PING` within `within`.
pub(crate) async fn ping(c: &mut Link, within: Duration) -> bool {
    let cmd = redis::cmd("PING");
    matches!(
        tokio::time::timeout(within, cmd.query_async::<String>(c)).await,
        Ok(Ok(_))
    )
}
