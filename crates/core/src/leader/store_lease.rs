//! The SQL elector's lease: a lease row in the state store, timed by the database's
//! clock (the other implementation, the Azure Blob lease, is in `orderly-azure`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::ports::{Acquired, LeaderFence, LeadershipStore, Lease, LeaseError};
use crate::error::Result;
use crate::id::InstanceId;

/// The SQL elector's lease: a term-scoped row in the state store, timed by the
/// database's clock.
pub struct StoreLease {
    store: Arc<dyn LeadershipStore>,
    name: String,
    holder: InstanceId,
    lease: Duration,
    term: Mutex<Option<LeaderFence>>,
}

impl StoreLease {
    /// `holder`'s lease on `name`, lasting `lease` from each acquire or renewal.
    pub fn new(
        store: Arc<dyn LeadershipStore>,
        name: impl Into<String>,
        holder: InstanceId,
        lease: Duration,
    ) -> Self {
        Self {
            store,
            name: name.into(),
            holder,
            lease,
            term: Mutex::new(None),
        }
    }

    fn current(&self) -> Option<LeaderFence> {
        self.term.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, fence: Option<LeaderFence>) {
        *self.term.lock().unwrap_or_else(|p| p.into_inner()) = fence;
    }
}

fn store_err(e: crate::Error) -> LeaseError {
    if e.is_retryable() {
        LeaseError::Unavailable(e.to_string())
    } else {
        LeaseError::Misconfigured(e.to_string())
    }
}

#[async_trait]
impl Lease for StoreLease {
    fn describe(&self) -> String {
        format!("SQL lease row {:?}", self.name)
    }

    async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
        match self
            .store
            .acquire_lease(&self.name, &self.holder, self.lease)
            .await
            .map_err(store_err)?
        {
            Some(fence) => {
                self.set(Some(fence.clone()));
                Ok(Acquired::Yes(Some(fence)))
            }
            None => Ok(Acquired::HeldByOther),
        }
    }

    async fn renew(&self) -> Result<(), LeaseError> {
        let Some(fence) = self.current() else {
            return Err(LeaseError::Lost("no term held".into()));
        };
        if self
            .store
            .renew_lease(&fence, self.lease)
            .await
            .map_err(store_err)?
        {
            Ok(())
        } else {
            self.set(None);
            Err(LeaseError::Lost(format!("{fence} is over")))
        }
    }

    async fn release(&self) -> Result<(), LeaseError> {
        if let Some(fence) = self.current() {
            self.store.release_lease(&fence).await.map_err(store_err)?;
            self.set(None);
        }
        Ok(())
    }
}

/// An elector of `name` over the SQL lease row in `store` (the embedded default: no
/// blob store needed).
pub fn sql_elector(
    name: &str,
    store: Arc<dyn LeadershipStore>,
    instance: InstanceId,
    timing: super::ElectorTiming,
) -> std::result::Result<super::Elector, crate::validation::ValidationError> {
    let lease = Arc::new(StoreLease::new(
        store.clone(),
        name,
        instance.clone(),
        timing.lease,
    ));
    super::Elector::new(name, instance, lease, store, timing)
}
