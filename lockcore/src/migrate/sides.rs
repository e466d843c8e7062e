//! Who holds a name on the two backends of a migration.

use crate::error::Result;

/// Who holds a name on the two backends of a migration: the check before
/// phase 3 (see the [procedure](crate::migrate#the-procedure)), from
/// [`Migrating::sides`](crate::migrate::Migrating::sides). Owners are the holders' owner tokens as the
/// backends report them ([`HolderInfo::owner`](crate::HolderInfo::owner)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sides {
    /// Held on neither backend.
    Free,
    /// Held by one migrating owner on both (the same owner token on each).
    Migrating {
        /// The owner token.
        owner: String,
    },
    /// Held on the old backend only: an old-only client is still running
    /// (or a migrating one is between its two steps): not safe to start
    /// phase 3.
    OldOnly {
        /// The old backend's holder.
        owner: Option<String>,
    },
    /// Held on the new backend only: a new-only client (phase 3 has begun).
    NewOnly {
        /// The new backend's holder.
        owner: Option<String>,
    },
    /// Held on both by two owners of this library: an old-only client and
    /// a new-only one at once (which must never be), or a migrating client
    /// that holds the old half and waits for a new-only client on the new.
    Split {
        /// The old backend's holder.
        old: Option<String>,
        /// The new backend's holder.
        new: Option<String>,
    },
    /// Held on both, by owners that cannot be compared: another client's
    /// layout (Curator, `etcdctl`), or an election's candidate on etcd,
    /// whose key holds its value rather than its owner token; or a name
    /// that changed hands through every read.
    Unknown {
        /// The old backend's holder.
        old: Option<String>,
        /// The new backend's holder.
        new: Option<String>,
    },
}

impl Sides {
    /// A short name: `free`, `migrating`, `old_only`, `new_only`, `split`,
    /// `unknown`.
    pub fn verdict(&self) -> &'static str {
        match self {
            Sides::Free => "free",
            Sides::Migrating { .. } => "migrating",
            Sides::OldOnly { .. } => "old_only",
            Sides::NewOnly { .. } => "new_only",
            Sides::Split { .. } => "split",
            Sides::Unknown { .. } => "unknown",
        }
    }

    /// What the verdict means for phase 3, in a sentence.
    pub fn meaning(&self) -> &'static str {
        match self {
            Sides::Free => "free on both backends",
            Sides::Migrating { .. } => "held by one migrating owner on both backends",
            Sides::OldOnly { .. } => {
                "held on the old backend only: an old-only client is still running (or a migrating one is between its two steps); not safe to start phase 3"
            }
            Sides::NewOnly { .. } => "held on the new backend only: a new-only client (phase 3 has begun)",
            Sides::Split { .. } => {
                "held on both backends by different owners: an old-only and a new-only client at once (which must never be), or a migrating client waiting for a new-only one"
            }
            Sides::Unknown { .. } => {
                "held on both backends by owners that cannot be compared (another client's layout, or an election on etcd)"
            }
        }
    }
}

/// The verdict for the holders seen on the old and the new backend (each
/// `None` when free, `Some(None)` when held by an owner it cannot name).
pub(super) fn sides_of(old: Option<Option<String>>, new: Option<Option<String>>) -> Sides {
    let token = |o: &Option<String>| o.as_deref().is_some_and(is_owner_token);
    match (old, new) {
        (None, None) => Sides::Free,
        (Some(o), None) => Sides::OldOnly { owner: o },
        (None, Some(n)) => Sides::NewOnly { owner: n },
        (Some(o), Some(n)) if token(&o) && token(&n) => {
            if o == n {
                Sides::Migrating {
                    owner: o.unwrap_or_default(),
                }
            } else {
                Sides::Split { old: o, new: n }
            }
        }
        (Some(o), Some(n)) => Sides::Unknown { old: o, new: n },
    }
}

/// Whether `s` is an owner token as this library's holders report it (32
/// lowercase hex digits).
fn is_owner_token(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The owner a backend reports holding `name`, if any.
pub(super) async fn holder_of(l: &crate::locker::Locker, name: &str) -> Result<Option<String>> {
    Ok(l.inspect(name)
        .await?
        .and_then(|i| i.holder)
        .and_then(|h| h.owner))
}
