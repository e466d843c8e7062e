//! RedLock over N independent masters.
//!
//! Acquire sends `SET NX PX` to every instance in parallel, each bounded by a
//! per-instance timeout much smaller than the ttl, and succeeds only when a
//! majority (N/2+1) granted it, with validity = ttl − elapsed − drift
//! (drift = ttl·1% + 2 ms). It returns as soon as a majority granted: the
//! calls still out finish in the background, and a grant among them is the
//! lease's like the others (renewed, released). A release likewise returns
//! once a majority released; its calls still out finish as a counted
//! cleanup step ([`lockcore::cleanup::flush`] waits for them). A call still
//! out may be waiting for its connection (being made again, or reloading a
//! script), where a later call could overtake it; so, on an instance where
//! the acquire's call was still out, the lease's release (like the undo of
//! a failed attempt) is sent only once that call finished (answered or
//! timed out), on the others at once. A call that timed out and still
//! reaches the server later can leave a key on its instance (a minority)
//! until its ttl, as with any RedLock client. Each attempt writes a token
//! of its own, never reused in the process, so a late undo never deletes
//! another attempt's key. Each cycle is one plain `SET NX PX` and one
//! compare-and-delete script per instance. A failed attempt is undone on
//! every instance, also those that errored or timed out; when fewer than a
//! majority answered it is [`ErrorKind::Unavailable`], otherwise it is
//! retried (at once after subscribing to release wake-ups, then after a
//! random delay and a wake-up or the holder's pttl). A renewal counts only when a majority renewed;
//! then an instance that lost the key (restarted without persistence) gets
//! it back by `SET NX`, so restarts one after another never leave the
//! holder on a minority.
//!
//! **Inspection and elections.** [`Backend::inspect`] reads the key and its
//! pttl on every instance at once: the holder is the token held by a
//! majority, for as long as a majority keeps it (the majority's shortest
//! pttl); a token on a minority (an attempt under way or being undone, a
//! lease expiring) is no holder, and fewer than a majority answering is
//! [`ErrorKind::Unavailable`], never "free". A [`lockcore::Election`]
//! candidate's value follows its attempt token after a space, in the key's
//! own value, so it is set, renewed, compared and deleted with the key on
//! each instance. A leader has no term (no fencing, below). With
//! inspection, a semaphore built from locks also finds counts that
//! disagree.
//!
//! **No fencing.** The instances are independent: no counter rises
//! monotonically across them, and a token from one instance's counter can go
//! backwards when another majority grants the next lease. The capability is
//! [`Fencing::None`] and guards carry no token. Where fencing matters, use one
//! instance or a cluster (fencing while data is kept), ZooKeeper or etcd.

mod backend;
mod lease;
mod masters;
mod quorum;
mod round;

pub use masters::RedLockBackend;
