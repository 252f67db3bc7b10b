//! The workflow versions an agent checks requests against: the store's
//! (`workflow_definitions`, written by the schedulers that run them), read again when
//! a request names a version not read yet, at most once a second (a request that
//! comes sooner waits for the next read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orderly_core::store::SchedulerStore;
use orderly_core::workflow::{Workflow, WorkflowRef};

/// Re-read the store for an unknown version at most this often.
const REREAD: Duration = Duration::from_secs(1);

/// What a lookup found.
#[derive(Debug)]
pub enum Found {
    /// The version's definition.
    Known(Arc<Workflow>),
    /// Not stored: no scheduler ran it, so no scheduler sent the request.
    Unknown,
}

/// The stored workflow versions, cached.
pub struct Catalogue {
    store: Arc<dyn SchedulerStore>,
    /// The built-in workflow's reference (what a request naming none runs).
    builtin: WorkflowRef,
    known: Mutex<HashMap<WorkflowRef, Arc<Workflow>>>,
    read_at: tokio::sync::Mutex<Option<Instant>>,
}

impl Catalogue {
    /// A catalogue over `store`'s stored versions; the built-in workflow is known
    /// from the start (requests from before versions were pinned name none).
    pub fn new(store: Arc<dyn SchedulerStore>) -> Self {
        let builtin = Workflow::default();
        Self {
            store,
            builtin: builtin.reference(),
            known: Mutex::new(HashMap::from([(builtin.reference(), Arc::new(builtin))])),
            read_at: tokio::sync::Mutex::new(None),
        }
    }

    fn cached(&self, r: &WorkflowRef) -> Option<Arc<Workflow>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(r)
            .cloned()
    }

    /// The definition of `reference` (`None`: the built-in workflow). A store error is
    /// returned as such: the request is then left for later, not refused.
    pub async fn get(&self, reference: Option<&WorkflowRef>) -> orderly_core::Result<Found> {
        let r = reference.unwrap_or(&self.builtin);
        if let Some(w) = self.cached(r) {
            return Ok(Found::Known(w));
        }
        let mut read_at = self.read_at.lock().await;
        if let Some(w) = self.cached(r) {
            return Ok(Found::Known(w));
        }
        // A version stored since the last read is found at the next: wait for it
        // rather than refuse (reads stay at most one a second).
        if let Some(t) = *read_at
            && t.elapsed() < REREAD
        {
            tokio::time::sleep(REREAD.saturating_sub(t.elapsed())).await;
        }
        let stored = self.store.stored_workflows().await?;
        *read_at = Some(Instant::now());
        let mut known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for s in stored {
            if let Ok(w) = s.workflow() {
                known.insert(s.reference, Arc::new(w));
            }
        }
        Ok(known.get(r).cloned().map_or(Found::Unknown, Found::Known))
    }
}
