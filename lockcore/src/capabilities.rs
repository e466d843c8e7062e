//! What a backend can promise, declared honestly and read by the conformance suite.

/// How far a backend's fencing tokens can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fencing {
    /// Successive holders of a name always get strictly larger tokens.
    Strict,
    /// Strict while the server keeps its data; a failover to a lagging
    /// replica, or a restart without persistence, can hand out a smaller one
    /// (Redis on one instance or a cluster).
    StrictWhileDataKept,
    /// No token is safe to fence with; guards report `None` (RedLock: there is
    /// no counter that is monotonic across independent masters).
    None,
}

/// What keeps a lease alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseKind {
    /// A ttl on the server, renewed by the watchdog (memory, Redis, etcd).
    Ttl,
    /// A client session, kept alive by heartbeats (ZooKeeper).
    Session,
    /// An open connection holding a transaction (MySQL). The name is free
    /// at once when the holder's connection closes, and within the ttl
    /// without a renewal while it stays open. Every held or waiting lock
    /// uses a connection of its own: how many a client can hold is bounded
    /// by the server's connection limit.
    ///
    /// The known limit: when the network breaks the connection (a reset, a
    /// failed switch), the server frees the name at once, and the holder
    /// learns it at its next renewal (within ttl/3) or sooner. In that
    /// window a second holder can run: guard writes with the fencing token.
    Connection,
}

/// How a backend lays out a primitive beyond the lock: a
/// [`RwLock`](crate::primitives::rwlock::RwLock) ([`Capabilities::rw_layout`]) or a
/// [`Semaphore`](crate::primitives::semaphore::Semaphore) ([`Capabilities::semaphore_layout`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// Built from the backend's locks (see [`rwlock`](crate::primitives::rwlock) and
    /// [`semaphore`](crate::primitives::semaphore)).
    #[default]
    Built,
    /// The backend's own layout, taken with a [`Mode`](crate::raw::Mode) on the
    /// primitive's name: [`Mode::Read`](crate::raw::Mode::Read) and
    /// [`Mode::Write`](crate::raw::Mode::Write) for a read-write lock,
    /// [`Mode::Permit`](crate::raw::Mode::Permit) for a semaphore (Curator's
    /// `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` on
    /// ZooKeeper).
    Native,
    /// None: a `migrate:` pair whose backends lay it out differently. A
    /// client taking one layout on each would not exclude the plain
    /// clients of either, so the primitive is refused on it.
    Unsupported,
}

/// Who enforces a lock-delay ([`LockOptions::lock_delay`](crate::LockOptions::lock_delay)):
/// after a holder disappears without releasing, nobody may take the name
/// for the delay, so that a holder cut off but still running has time to
/// notice that its lease is lost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockDelay {
    /// The server: the lease lives `ttl + delay` on the server while the
    /// holder counts `ttl` of validity, and a clean release deletes it at
    /// once. Every client of the server waits the delay out, ours or not.
    Server,
    /// A record beside the lock on the server, which every client of this
    /// library that declares `Recorded` for the same server honours: a
    /// holder writes its deadline (`ttl + delay` after
    /// each renewal) there and a clean release deletes it, and the next
    /// holder waits out an unreleased predecessor's deadline before it is
    /// granted. A holder that stalls keeps the lock itself on the server
    /// for `ttl + delay`. Other clients of the server (a plain `SELECT ...
    /// FOR UPDATE` on MySQL) do not read the record: they wait only while
    /// the lock is held on the server.
    Recorded,
    /// Not enforced: a lock-delay is refused with
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) (the
    /// lease is a session or a connection, which the server ends at once).
    #[default]
    Unsupported,
}

/// What a backend can promise.
///
/// Build with [`Capabilities::new`] and the setters:
///
/// ```
/// use lockcore::{Capabilities, Fencing, LeaseKind};
///
/// let caps = Capabilities::new(Fencing::Strict, LeaseKind::Ttl).fair(true).push_wakeup(true);
/// assert!(caps.fair);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// How far fencing tokens can be trusted.
    pub fencing: Fencing,
    /// Waiters are served in arrival order.
    pub fair: bool,
    /// A release wakes waiters by a push from the server, not by polling.
    pub push_wakeup: bool,
    /// What keeps a lease alive.
    pub lease: LeaseKind,
    /// [`Backend::inspect`](crate::raw::Backend::inspect) can tell the holder
    /// (and the number of waiters, where [`LockInfo::waiters`](crate::LockInfo)
    /// is `Some`).
    pub inspect: bool,
    /// Locks exclude other processes (false for the in-memory backend).
    pub cross_process: bool,
    /// A lease carries a value ([`AcquireRequest::value`](crate::raw::AcquireRequest))
    /// that [`Backend::inspect`](crate::raw::Backend::inspect) reads back: what an
    /// [`Election`](crate::Election) needs to tell observers who leads.
    pub values: bool,
    /// How a [`RwLock`](crate::primitives::rwlock::RwLock) is laid out on this backend.
    pub rw_layout: Layout,
    /// How a [`Semaphore`](crate::primitives::semaphore::Semaphore) is laid out on this backend.
    pub semaphore_layout: Layout,
    /// Who enforces a lock-delay: the server for ttl leases.
    pub lock_delay: LockDelay,
}

impl Capabilities {
    /// Not fair, no push wake-up, no inspection, no values, cross-process,
    /// read-write locks and semaphores [built from locks](Layout::Built).
    pub const fn new(fencing: Fencing, lease: LeaseKind) -> Self {
        Capabilities {
            fencing,
            fair: false,
            push_wakeup: false,
            lease,
            inspect: false,
            cross_process: true,
            values: false,
            rw_layout: Layout::Built,
            semaphore_layout: Layout::Built,
            lock_delay: match lease {
                LeaseKind::Ttl => LockDelay::Server,
                LeaseKind::Session | LeaseKind::Connection => LockDelay::Unsupported,
            },
        }
    }

    /// Sets [`fair`](Capabilities::fair).
    #[must_use]
    pub const fn fair(mut self, v: bool) -> Self {
        self.fair = v;
        self
    }

    /// Sets [`push_wakeup`](Capabilities::push_wakeup).
    #[must_use]
    pub const fn push_wakeup(mut self, v: bool) -> Self {
        self.push_wakeup = v;
        self
    }

    /// Sets [`inspect`](Capabilities::inspect).
    #[must_use]
    pub const fn inspect(mut self, v: bool) -> Self {
        self.inspect = v;
        self
    }

    /// Sets [`cross_process`](Capabilities::cross_process).
    #[must_use]
    pub const fn cross_process(mut self, v: bool) -> Self {
        self.cross_process = v;
        self
    }

    /// Sets [`values`](Capabilities::values).
    #[must_use]
    pub const fn values(mut self, v: bool) -> Self {
        self.values = v;
        self
    }

    /// Sets [`rw_layout`](Capabilities::rw_layout).
    #[must_use]
    pub const fn rw_layout(mut self, v: Layout) -> Self {
        self.rw_layout = v;
        self
    }

    /// Sets [`semaphore_layout`](Capabilities::semaphore_layout).
    #[must_use]
    pub const fn semaphore_layout(mut self, v: Layout) -> Self {
        self.semaphore_layout = v;
        self
    }

    /// Who enforces a lock-delay (by default the server for a ttl lease,
    /// nobody for a session or a connection).
    #[must_use]
    pub const fn lock_delay(mut self, v: LockDelay) -> Self {
        self.lock_delay = v;
        self
    }

    /// Whether guards carry a fencing token at all.
    pub const fn has_fencing(&self) -> bool {
        !matches!(self.fencing, Fencing::None)
    }
}
