//! The primitives built on a [`Locker`](crate::locker::Locker) beside the lock:
//! counting semaphores, read-write locks and leader election.

pub mod election;
pub mod rwlock;
pub mod semaphore;
