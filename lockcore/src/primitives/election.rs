//! Leader election on any backend that keeps a value beside a lease
//! ([`Capabilities::values`](crate::capabilities::Capabilities::values)): campaign with a
//! value, observe who leads, resign, and a leader's lost signal.
//!
//! **Layout.** An election is the lock of its own name: the leader is the
//! holder of that lock, and its value is stored with the lease on the
//! server (the key's value on etcd, which is the layout of etcd's
//! `concurrency.Election` and so of `etcdctl elect`; the node's data on
//! ZooKeeper; a key beside the lock key on Redis, the lock key's own value
//! after the holder's token on RedLock; a row of a table beside the lock
//! table on MySQL). So a leader has every
//! promise of that backend's lock: the watchdog renews its lease, the lost
//! signal fires when the lease is gone, campaigns are queued in the lock's
//! order (arrival order on ZooKeeper and etcd), and a dropped campaign
//! leaves nothing on the server.
//!
//! **Terms.** A leadership's term is its lock's fencing token: it rises
//! strictly from one leader to the next on a backend with strict fencing,
//! so a leader passes it to the resources it writes as a fencing token.
//!
//! **Observing.** [`Election::leader`] asks the server who leads now.
//! [`Observer::changed`] reports each change it sees, asking every
//! [`Observer::every`] (100 ms by default): it follows the leader, not
//! every leadership. One shorter than the interval can be missed, and
//! since terms are fencing tokens, which rise but skip values, a missed
//! one does not show as a gap. A change is another value or term: where
//! the backend has no terms (RedLock), a hand-over between two candidates
//! of the same value is not one.
//!
//! **Reentrancy.** None: every campaign is a new owner, so a second campaign
//! from the same process waits behind the first like any other.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockcore::Result<()> {
//! use lockcore::{Election, Locker};
//!
//! let locker = Locker::memory();
//! let election = Election::new(&locker, "scheduler")?;
//! let leading = election.try_campaign("host-a").await?.expect("no one leads yet");
//! assert!(election.try_campaign("host-b").await?.is_none(), "one leader at a time");
//! let seen = election.leader().await?.expect("a leader");
//! assert_eq!(seen.value, "host-a");
//! assert_eq!(seen.term, leading.term());
//! leading.resign().await?;
//! assert!(election.leader().await?.is_none());
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::name::validate_primitive_name;
use crate::options::{LockOptions, Wait};

/// The longest value a candidate may campaign with, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// How often an [`Observer`] asks the server by default.
pub const OBSERVE_EVERY: Duration = Duration::from_millis(100);

/// How often [`Election::leader`] reads again a holder the backend cannot
/// name yet (no owner, token or value), 100 ms apart, before it reports it
/// as a leader with no value.
const PENDING_READS: u32 = 10;

/// A leader election on one name (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct Election {
    locker: Locker,
    name: String,
}

/// Who leads, as the server tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The value the leader campaigned with (empty for a holder of the
    /// name that stored none, such as a plain lock).
    pub value: String,
    /// The leader's term: its lock's fencing token, `None` where the
    /// backend has none.
    pub term: Option<u64>,
}

impl Election {
    /// An election on `name`, through `locker`'s backend.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] for a name the lock would refuse;
    /// [`ErrorKind::InvalidConfig`] when the backend cannot keep a value
    /// beside a lease or cannot be asked who holds a name.
    pub fn new(locker: &Locker, name: &str) -> Result<Self> {
        let backend = locker.backend_name();
        validate_primitive_name(backend, name)?;
        let caps = locker.capabilities();
        if !(caps.values && caps.inspect) {
            return Err(Error::invalid_config(
                backend,
                "this backend cannot keep a leader's value beside its lease, so it has no leader election",
            )
            .with_name(name));
        }
        Ok(Election {
            locker: locker.clone(),
            name: name.to_owned(),
        })
    }

    /// The election's name (also the lock name its leader holds).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until this candidate leads (the locker's default ttl and
    /// renewal).
    ///
    /// # Errors
    ///
    /// As [`campaign_with`](Election::campaign_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped campaign leaves nothing held or queued on
    /// the server after at most one cleanup round trip.
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        let opts = self.locker.defaults().wait(Wait::Forever);
        self.campaign_with(value, &opts).await?.ok_or_else(|| {
            Error::backend_error(
                self.locker.backend_name(),
                "the backend gave up waiting forever without an error",
            )
            .with_name(&self.name)
        })
    }

    /// One attempt: the leadership, or `None` when another candidate leads.
    ///
    /// # Errors
    ///
    /// As [`campaign_with`](Election::campaign_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`campaign`](Election::campaign).
    pub async fn try_campaign(&self, value: &str) -> Result<Option<Leadership>> {
        self.campaign_with(value, &self.locker.defaults().wait(Wait::Try))
            .await
    }

    /// Campaigns with `opts` (ttl, renewal, how long to wait): `None` only
    /// for [`Wait::Try`] when another candidate leads.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a value longer than
    /// [`MAX_VALUE_BYTES`]; otherwise as [`Locker::acquire`] (a wait that
    /// ends without leading is [`ErrorKind::Timeout`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Locker::acquire`].
    pub async fn campaign_with(
        &self,
        value: &str,
        opts: &LockOptions,
    ) -> Result<Option<Leadership>> {
        if value.len() > MAX_VALUE_BYTES {
            return Err(Error::invalid_config(
                self.locker.backend_name(),
                format!(
                    "a candidate's value is at most {MAX_VALUE_BYTES} bytes, this one has {}",
                    value.len()
                ),
            )
            .with_name(&self.name));
        }
        let guard = self
            .locker
            .acquire_with(&self.name, opts, Some(value), crate::raw::Mode::Exclusive)
            .await?;
        Ok(guard.map(|guard| Leadership {
            guard,
            value: value.to_owned(),
        }))
    }

    /// Who leads now, as the server tells it; `None` when no one does.
    ///
    /// # Errors
    ///
    /// As [`Locker::inspect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        // A holder the backend cannot name yet (MySQL's between its row and
        // its publication: no owner, token or value) is a leader in the
        // making: read again for a while before reporting it unnamed.
        let mut pending = 0;
        loop {
            let info = self.locker.inspect(&self.name).await?.ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    self.locker.backend_name(),
                    "the backend could not say who holds the name",
                )
                .with_name(&self.name)
            })?;
            let unnamed = info
                .holder
                .as_ref()
                .is_some_and(|h| h.owner.is_none() && h.fence.is_none() && h.value.is_none());
            if unnamed && pending < PENDING_READS {
                pending += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            return Ok(info.holder.map(|h| Leader {
                value: h.value.unwrap_or_default(),
                term: h.fence,
            }));
        }
    }

    /// An observer of this election's leaders (see [`Observer::changed`]).
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            last: None,
            every: OBSERVE_EVERY,
        }
    }
}

/// A campaign won: the lease on the election's name, with the lock guard's
/// promises (renewal, lost signal, release on drop).
#[derive(Debug)]
#[must_use = "leadership is resigned as soon as it is dropped"]
pub struct Leadership {
    guard: LockGuard,
    value: String,
}

impl Leadership {
    /// This leadership's term: its lock's fencing token, strictly rising
    /// across leaders on a backend with strict fencing; `None` where the
    /// backend has none.
    pub fn term(&self) -> Option<u64> {
        self.guard.fence()
    }

    /// The value this leader campaigned with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether the lease is still valid on this client's clock (see
    /// [`LockGuard::is_held`]).
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Resolves when the leadership's lease is lost (see
    /// [`LockGuard::lost`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// The lost signal as a token (see [`LockGuard::lost_token`]).
    pub fn lost_token(&self) -> CancellationToken {
        self.guard.lost_token()
    }

    /// The lock guard behind the leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lock guard, to hold the leadership as a lock.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }

    /// Steps down: the next candidate in line leads.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::release`]: a dropped resignation still releases in
    /// the background.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

/// Follows an election's leaders (from [`Election::observe`]).
#[derive(Debug)]
pub struct Observer {
    election: Election,
    last: Option<Option<Leader>>,
    every: Duration,
}

impl Observer {
    /// Asks the server every `every` (at least 10 ms).
    #[must_use]
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(10));
        self
    }

    /// The leader now on the first call; then waits for the next change
    /// (another leader or term, or no leader) and returns it.
    ///
    /// # Errors
    ///
    /// As [`Election::leader`]; the observer stays usable.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call has not recorded a change, so the next
    /// call reports it.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        loop {
            let now = self.election.leader().await?;
            if self.last.as_ref() != Some(&now) {
                self.last = Some(now.clone());
                return Ok(now);
            }
            tokio::time::sleep(self.every).await;
        }
    }
}
