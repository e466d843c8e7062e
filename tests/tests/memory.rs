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

fn main() -> std::process::ExitCode {
    run(vec![Target::new("memory", None, |_| async {
        Ok(Arc::new(Memory(MemoryBackend::new())) as Arc<dyn Harness>)
    })])
}
