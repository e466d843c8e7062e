//! Small synchronisation helpers shared by `lockcore` and the backends.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, also when a thread panicked while holding it.
///
/// For the short critical sections of this library (a map insert, a flag),
/// a panic cannot leave the data half-written, so a poisoned lock is still
/// usable; this never panics.
///
/// ```
/// use std::sync::Mutex;
///
/// let m = Mutex::new(1);
/// *lockcore::raw::sync::lock(&m) += 1;
/// assert_eq!(*lockcore::raw::sync::lock(&m), 2);
/// ```
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
