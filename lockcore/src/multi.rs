//! Several names taken as one, all or none (Redisson's `MultiLock`).

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::locker::{Locker, DEADLINE_GRACE};
use crate::name::validate_name;
use crate::options::{LockOptions, Wait};
use crate::raw::{AcquireRequest, AllOrNone, Deadline, Mode, OwnerToken};

/// What the one-request path of a multi-acquire did.
enum AtOnce {
    /// Every name taken.
    Taken(Vec<LockGuard>),
    /// Some name held: none taken.
    Held,
    /// Not on this backend: nothing sent.
    Unsupported,
}

/// Several held names: every lease of a
/// [`Locker::acquire_all`](crate::Locker::acquire_all), in the order they
/// were taken (sorted). Dropping it releases them all in the background,
/// as dropping each [`LockGuard`] does.
#[derive(Debug)]
#[must_use = "the names are released when the guard is dropped"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The held names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::name)
    }

    /// Each name's guard, sorted by name.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fencing token of `name` (`None` for a name not held here, or a
    /// backend without fencing).
    pub fn fence(&self, name: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.name() == name)
            .and_then(LockGuard::fence)
    }

    /// Whether every lease is still held (by this client's count).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Until when every lease is valid: the earliest of their validity
    /// deadlines; `None` once any one is lost.
    pub fn valid_until(&self) -> Option<std::time::Instant> {
        self.guards
            .iter()
            .map(LockGuard::valid_until)
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .min()
    }

    /// Resolves once any of the leases is lost: stop what needs them all.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let each: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if !each.is_empty() {
                futures_util::future::select_all(each).await;
            }
        }
    }

    /// Releases every name (all at once).
    ///
    /// # Errors
    ///
    /// The first error of the releases (each is tried).
    ///
    /// # Cancel safety
    ///
    /// A dropped release leaves the names not yet released to be released
    /// in the background, as a dropped guard is.
    pub async fn release(self) -> Result<()> {
        let done =
            futures_util::future::join_all(self.guards.into_iter().map(LockGuard::release)).await;
        done.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }

    /// The guards, one per name, to hold and release apart.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}

impl Locker {
    /// Takes every name of `names` as one: all or none (Redisson's
    /// `MultiLock`). The names are taken one after another in one global
    /// order (sorted, duplicates dropped), so two callers over overlapping
    /// sets can never deadlock; while a later name is awaited, the earlier
    /// ones are held. `opts` applies to each name, and its wait to the
    /// whole: [`Wait::Try`](crate::Wait::Try) gives `Ok(None)` when any
    /// name is held, [`Wait::For`](crate::Wait::For) bounds the time for
    /// all. Whatever was taken is released when one fails or times out.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockcore::Result<()> {
    /// use lockcore::{LockOptions, Locker, Wait};
    ///
    /// let locker = Locker::memory();
    /// let both = locker
    ///     .acquire_all(&["accounts/7", "accounts/3"], &LockOptions::new())
    ///     .await?
    ///     .expect("waited");
    /// assert_eq!(both.names().collect::<Vec<_>>(), ["accounts/3", "accounts/7"]);
    /// let other = locker
    ///     .acquire_all(&["accounts/3", "accounts/9"], &LockOptions::new().wait(Wait::Try))
    ///     .await?;
    /// assert!(other.is_none(), "accounts/3 is held");
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName) for any
    /// name and [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig)
    /// for no names, before any server is asked; [`ErrorKind::Lost`](crate::ErrorKind::Lost)
    /// when a name taken early was lost while a later one was awaited
    /// (every name is released); otherwise as
    /// [`acquire`](Locker::acquire), for the name that failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the names taken so far
    /// (in the background) and the acquisition in flight cleans up as
    /// [`acquire`](Locker::acquire)'s does.
    pub async fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        opts: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        let backend = self.backend().name();
        let mut sorted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        for n in &sorted {
            validate_name(backend, n)?;
        }
        opts.validate(backend)?;
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.is_empty() {
            return Err(Error::invalid_config(backend, "no names to take"));
        }
        let began = std::time::Instant::now();
        if sorted.len() > 1 {
            // Every name in one request where the backend can: the
            // uncontended path.
            match self.take_all_at_once(&sorted, opts).await? {
                AtOnce::Taken(guards) => return Ok(Some(MultiGuard { guards })),
                AtOnce::Held if matches!(opts.get_wait(), Wait::Try) => return Ok(None),
                AtOnce::Held | AtOnce::Unsupported => {}
            }
        }
        let mut guards = Vec::with_capacity(sorted.len());
        for name in sorted {
            match self
                .acquire_with(
                    name,
                    &opts.left_since(began),
                    None,
                    crate::raw::Mode::Exclusive,
                )
                .await
            {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => {
                    release_all(guards).await;
                    return Ok(None);
                }
                Err(e) => {
                    release_all(guards).await;
                    return Err(match (e.kind(), opts.get_wait()) {
                        (crate::ErrorKind::Timeout, crate::Wait::For(d)) => Error::new(
                            crate::ErrorKind::Timeout,
                            backend,
                            format!(
                                "still held by another owner after waiting {d:?} for all the names"
                            ),
                        )
                        .with_name(name),
                        _ => e,
                    });
                }
            }
        }
        // A name taken early may have been lost while a later one was
        // awaited: all or none.
        if let Some(lost) = guards.iter().find(|g| !g.is_held()) {
            let e = Error::new(
                crate::ErrorKind::Lost,
                backend,
                "lost while the other names were awaited; every name was released",
            )
            .with_name(lost.name());
            release_all(guards).await;
            return Err(e);
        }
        Ok(Some(MultiGuard { guards }))
    }

    /// Every one of `names` (sorted, distinct) in one request to the
    /// server, where the backend can
    /// ([`Backend::try_acquire_all`](crate::raw::Backend::try_acquire_all)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the backend's request cleans up after itself, and the
    /// guards, once made, release their leases when dropped.
    async fn take_all_at_once(&self, names: &[&str], opts: &LockOptions) -> Result<AtOnce> {
        let backend = self.backend().name();
        if let Some(first) = names.first() {
            self.check_delay(first, opts)?;
        }
        let delay = opts.get_lock_delay();
        let losts: Vec<CancellationToken> =
            names.iter().map(|_| CancellationToken::new()).collect();
        let reqs: Vec<AcquireRequest<'_>> = names
            .iter()
            .zip(&losts)
            .map(|(name, lost)| AcquireRequest {
                name,
                owner: OwnerToken::random(),
                ttl: opts.get_ttl() + delay,
                lock_delay: delay,
                deadline: Deadline::Now,
                lost,
                value: None,
                mode: Mode::Exclusive,
                renew: opts.get_renew(),
            })
            .collect();
        // A try gets the Locker's grace for one request; a wait, its own
        // deadline and the grace.
        let wait = opts.get_wait();
        let cap = match wait {
            Wait::Try => Some(DEADLINE_GRACE),
            Wait::For(d) => Some(d + DEADLINE_GRACE),
            Wait::Forever => None,
        };
        let attempt = self.backend().try_acquire_all(&reqs);
        let outcome = match cap {
            Some(cap) => tokio::time::timeout(cap, attempt).await.unwrap_or_else(|_| {
                Err(Error::unavailable(
                    backend,
                    format!(
                        "the server did not answer a request for {} names within {cap:?}; it was dropped and cleans up after itself",
                        names.len()
                    ),
                ))
            }),
            None => attempt.await,
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            // A wait rides out what one request could not (a failover, a
            // slow server): the names one by one, each with its own
            // retries. The request's own cleanup undoes what it may have
            // taken.
            Err(e)
                if !matches!(wait, Wait::Try)
                    && matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Indeterminate) =>
            {
                tracing::debug!(backend, error = %e, "taking the names one by one");
                return Ok(AtOnce::Unsupported);
            }
            Err(e) => return Err(e),
        };
        let grants = match outcome {
            AllOrNone::Granted(grants) => grants,
            AllOrNone::Held => return Ok(AtOnce::Held),
            _ => return Ok(AtOnce::Unsupported),
        };
        let count = grants.len();
        // Every lease watched (and so released if dropped) before any
        // renewal is awaited.
        let mut watched: Vec<(LockGuard, bool)> = names
            .iter()
            .zip(grants)
            .zip(losts)
            .map(|((name, grant), lost)| self.watch(name, grant, lost, opts))
            .collect();
        if count != names.len() {
            release_all(watched.drain(..).map(|(g, _)| g).collect()).await;
            return Err(Error::backend_error(
                backend,
                format!("{count} grants for {} names", names.len()),
            ));
        }
        let mut guards = Vec::with_capacity(count);
        for (guard, top_up) in watched {
            if top_up {
                if let Err(e) = guard.extend_now().await {
                    release_all(guards).await;
                    return Err(e);
                }
            }
            guards.push(guard);
        }
        Ok(AtOnce::Taken(guards))
    }

    /// [`acquire_all`](Locker::acquire_all) with the default options:
    /// waits until every name is taken.
    ///
    /// # Errors
    ///
    /// As [`acquire_all`](Locker::acquire_all).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_all`](Locker::acquire_all).
    pub async fn lock_all<S: AsRef<str>>(&self, names: &[S]) -> Result<MultiGuard> {
        self.acquire_all(names, &LockOptions::new())
            .await?
            .ok_or_else(|| {
                Error::backend_error(self.backend().name(), "waited forever and gave up")
            })
    }

    /// [`acquire_all`](Locker::acquire_all) without waiting: `Ok(None)`
    /// when any name is held.
    ///
    /// # Errors
    ///
    /// As [`acquire_all`](Locker::acquire_all).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_all`](Locker::acquire_all).
    pub async fn try_lock_all<S: AsRef<str>>(&self, names: &[S]) -> Result<Option<MultiGuard>> {
        self.acquire_all(names, &LockOptions::new().wait(crate::Wait::Try))
            .await
    }
}

/// Releases what a failed multi-acquire took, all at once; a failure there
/// leaves the lease to end by its ttl, session or connection (logged).
async fn release_all(guards: Vec<LockGuard>) {
    for r in futures_util::future::join_all(guards.into_iter().map(LockGuard::release)).await {
        if let Err(e) = r {
            tracing::warn!(error = %e, "release after a failed multi-acquire; the name ends by its lease");
        }
    }
}
