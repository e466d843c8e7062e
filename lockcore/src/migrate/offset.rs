//! Fencing tokens shifted by a fixed offset, for the clients after a migration.

use std::sync::Arc;

use async_trait::async_trait;

use super::lease::undo_half;
use super::migrating::NAME;
use crate::capabilities::{Capabilities, Fencing};
use crate::error::{Error, Result};
use crate::info::{HolderInfo, Listing, LockInfo, Role};
use crate::raw::{AcquireRequest, Backend, Grant};

pub(super) fn offset_fence(
    fence: Option<u64>,
    offset: u64,
    fencing: Fencing,
) -> Result<Option<u64>> {
    if fencing == Fencing::None {
        return Ok(None);
    }
    match fence {
        None => Ok(None),
        Some(f) => f.checked_add(offset).map(Some).ok_or_else(|| {
            Error::invalid_config(
                NAME,
                format!("fence offset {offset} overflows the new backend's token {f}"),
            )
        }),
    }
}

/// A backend whose fencing tokens are shifted by a fixed offset: the
/// new-only clients of step 3 of a migration keep the offset the migrating
/// clients used (see the [module docs](crate::migrate)).
#[derive(Debug, Clone)]
pub struct OffsetFences {
    inner: Arc<dyn Backend>,
    offset: u64,
}

impl OffsetFences {
    /// `inner` with `offset` added to every token.
    pub fn new(inner: Arc<dyn Backend>, offset: u64) -> Self {
        OffsetFences { inner, offset }
    }
}

#[async_trait]
impl Backend for OffsetFences {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// As the inner backend's, with the token shifted.
    ///
    /// # Cancel safety
    ///
    /// As the inner backend's.
    async fn acquire(&self, req: AcquireRequest<'_>) -> Result<Option<Grant>> {
        let Some(g) = self.inner.acquire(req).await? else {
            return Ok(None);
        };
        match offset_fence(g.fence, self.offset, self.inner.capabilities().fencing) {
            Ok(fence) => Ok(Some(Grant { fence, ..g })),
            Err(e) => {
                undo_half(&Arc::from(g.lease)).run_now().await;
                Err(e)
            }
        }
    }

    /// As the inner backend's, with the holder's token shifted.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let Some(mut info) = self.inner.inspect(name).await? else {
            return Ok(None);
        };
        if let Some(h) = info.holder.as_mut() {
            h.fence = offset_fence(h.fence, self.offset, self.inner.capabilities().fencing)?;
        }
        Ok(Some(info))
    }

    /// As the inner backend's.
    async fn list(&self, prefix: &str, limit: usize) -> Result<Option<Listing>> {
        self.inner.list(prefix, limit).await
    }

    /// As the inner backend's, with the holders' tokens shifted.
    async fn inspect_role(&self, name: &str, role: Role) -> Result<Option<Vec<HolderInfo>>> {
        let Some(mut holders) = self.inner.inspect_role(name, role).await? else {
            return Ok(None);
        };
        for h in &mut holders {
            h.fence = offset_fence(h.fence, self.offset, self.inner.capabilities().fencing)?;
        }
        Ok(Some(holders))
    }
}
