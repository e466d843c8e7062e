//! The conformance suite against the in-memory backend.

// Test code: a failed expectation is a failed case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use async_trait::async_trait;
use lockcore::memory::MemoryBackend;
use lockcore::Locker;
use lockcore_conformance::{run, Harness, Target};

/// Every client is a `Locker` over one shared in-process server.
#[derive(Debug)]
struct Memory(MemoryBackend);

#[async_trait]
impl Harness for Memory {
    async fn connect(&self) -> lockcore::Result<Locker> {
        Ok(Locker::new(self.0.clone()))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    /// Ends the lease on the server without telling the holder.
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        Ok(self.0.expire(name))
    }
}

/// Every client holds each name on two shared in-process servers at once,
/// as a fleet in the middle of a migration does.
#[derive(Debug)]
struct Migrating {
    old: MemoryBackend,
    new: MemoryBackend,
}

#[async_trait]
impl Harness for Migrating {
    async fn connect(&self) -> lockcore::Result<Locker> {
        Ok(Locker::new(lockcore::migrate::Migrating::new(
            Arc::new(self.old.clone()),
            Arc::new(self.new.clone()),
        )))
    }

    fn can_revoke(&self) -> bool {
        true
    }

    /// Ends both halves, as an operator revoking a migrating lock must (a
    /// half left held keeps the name until its ttl).
    async fn revoke(&self, name: &str) -> lockcore::Result<bool> {
        let old = self.old.expire(name);
        let new = self.new.expire(name);
        Ok(old || new)
    }
}

fn main() -> std::process::ExitCode {
    run(vec![
        Target::new("memory", None, |_| async {
            Ok(Arc::new(Memory(MemoryBackend::new())) as Arc<dyn Harness>)
        }),
        Target::new("migrate-memory", None, |_| async {
            Ok(Arc::new(Migrating {
                old: MemoryBackend::new(),
                new: MemoryBackend::new(),
            }) as Arc<dyn Harness>)
        }),
    ])
}
