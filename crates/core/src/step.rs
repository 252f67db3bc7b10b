//! Per-step records of a multi-step workflow.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::id::OrderId;
use crate::state::Epoch;

/// Where one workflow step of an order stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StepStatus {
    /// Sent to its agent; no answer yet.
    Started,
    /// The agent answered with success.
    Succeeded,
    /// The agent answered with a permanent failure.
    Failed,
    /// Undone by its compensating step.
    Compensated,
}

impl StepStatus {
    /// Every status.
    pub const ALL: [StepStatus; 4] = [
        StepStatus::Started,
        StepStatus::Succeeded,
        StepStatus::Failed,
        StepStatus::Compensated,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Started => "Started",
            StepStatus::Succeeded => "Succeeded",
            StepStatus::Failed => "Failed",
            StepStatus::Compensated => "Compensated",
        }
    }
}

impl fmt::Display for StepStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StepStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown step status {s:?}"))
    }
}

/// The idempotency key of one action of one step of one run of an order:
/// `order/generation/step/action`. It depends only on those, so it is the same on every
/// retry and every re-run of that action by any scheduler, and remote services drop
/// repeats; a fresh run (the next generation, after an operator's retry of an order
/// whose steps were undone) gets new keys, so the services apply the redo instead of
/// answering with the undone result. The first run (generation 0) keeps the keys
/// orderly used before generations existed (`order/step/action`), so orders in flight
/// across an upgrade keep theirs.
pub fn idempotency_key(order_id: &OrderId, generation: i32, index: i32, action: &str) -> String {
    if generation == 0 {
        format!("{order_id}/{index}/{action}")
    } else {
        format!("{order_id}/{generation}/{index}/{action}")
    }
}

/// What an operator's retry of an order in Error does, decided from its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryPlan {
    /// Every completed step still stands: continue from the failed step.
    Continue {
        /// The step it continues from.
        from_step: i32,
    },
    /// Some step was undone (compensated): run the workflow again from the first step,
    /// under the next generation (new idempotency keys).
    FreshRun {
        /// The generation the new run has.
        generation: i32,
        /// The steps that had been undone, by name.
        undone: Vec<String>,
    },
}

impl RetryPlan {
    /// The plan for an order at `current_step` of run `generation` with these steps.
    pub fn for_order(generation: i32, current_step: i32, steps: &[StepRecord]) -> Self {
        let undone: Vec<String> = steps
            .iter()
            .filter(|s| s.status == StepStatus::Compensated)
            .map(|s| s.name.clone())
            .collect();
        if undone.is_empty() {
            RetryPlan::Continue {
                from_step: current_step,
            }
        } else {
            RetryPlan::FreshRun {
                generation: generation + 1,
                undone,
            }
        }
    }

    /// In words, for operators and the history.
    pub fn describe(&self) -> String {
        match self {
            RetryPlan::Continue { from_step } => {
                format!("continues from step {from_step}: the steps done before still stand")
            }
            RetryPlan::FreshRun { generation, undone } => format!(
                "fresh run from the first step (generation {generation}): {} had been undone",
                undone.join(", ")
            ),
        }
    }
}

/// One step of one order, as last recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The order.
    pub order_id: OrderId,
    /// Position in the workflow, from 0.
    pub index: i32,
    /// The step's name, e.g. `charge-payment`.
    pub name: String,
    /// Where it stands.
    pub status: StepStatus,
    /// The key sent with every call of this step.
    pub idempotency_key: String,
    /// How many times it was started.
    pub attempts: i32,
    /// The agent's answer (on success) or error text (on failure).
    pub detail: Option<String>,
    /// The owner epoch of the last write.
    pub epoch: Epoch,
    /// When it was last written.
    pub updated_at: DateTime<Utc>,
}
