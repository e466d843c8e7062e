//! Whether an acquisition waited behind a holder: a grant that came after
//! waiting is a hand-off, counted by [`HANDOFFS`](crate::observe::HANDOFFS).

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static WAITED: Cell<bool>;
}

/// Tells the acquisition in progress that it found its name held and waits
/// for it: if it is then granted, the grant is a hand-off, counted by
/// [`HANDOFFS`](crate::observe::HANDOFFS) (with the `metrics` feature).
///
/// A backend calls it from its [`Backend::acquire`](crate::raw::Backend::acquire)
/// future itself, not from a task it spawns, once it knows the name is held
/// and before it waits. Outside an acquisition, or called twice, it does
/// nothing more. A backend that never calls it counts no hand-offs: its
/// grants after a wait count as plain grants.
pub fn waiting() {
    let _ = WAITED.try_with(|w| w.set(true));
}

/// Runs `acquiring`, and says whether it called [`waiting`].
///
/// # Cancel safety
///
/// As `acquiring`'s.
pub(crate) async fn watch<F: Future>(acquiring: F) -> (F::Output, bool) {
    WAITED
        .scope(Cell::new(false), async {
            let out = acquiring.await;
            (out, WAITED.with(Cell::get))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn says_whether_the_acquisition_waited() {
        assert!(!watch(async {}).await.1);
        assert!(watch(async { waiting() }).await.1);
        // Outside an acquisition it does nothing (and does not panic).
        waiting();
    }
}
