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

/// The idempotency key of one step of one order. It depends only on the order, the
/// step's position and its name, so it is the same on every retry and every re-run of
/// that step by any scheduler, and remote services can drop repeats.
pub fn idempotency_key(order_id: &OrderId, index: i32, name: &str) -> String {
    format!("{order_id}/{index}/{name}")
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
