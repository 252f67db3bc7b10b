//! What a scheduler asks of the store and gets back: claims, step updates and
//! completions, and the alerts an entry into Error raises.

use crate::id::{InstanceId, OrderId};
use crate::order::OrderDetails;
use crate::state::{Fence, ProcessState};
use crate::step::StepStatus;
use crate::transport::Envelope;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A scheduler's request for work.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// The claiming scheduler; becomes `locked_by`.
    pub owner: InstanceId,
    /// Most orders to claim at once (1 to [`MAX_BATCH`]).
    pub limit: u32,
    /// Processing timeout: `complete_by = now + timeout`.
    pub timeout: Duration,
    /// Which orders it may take (by workflow) and the versions it pins new ones to
    /// (shared: a scheduler builds it once and claims with it every pass).
    pub workflows: std::sync::Arc<crate::workflow::WorkflowFilter>,
}

/// An order a scheduler now owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedOrder {
    /// The ownership proof to present with every write.
    pub fence: Fence,
    /// The deadline.
    pub complete_by: DateTime<Utc>,
    /// The step to run next (steps before it are done).
    pub current_step: i32,
    /// Earlier timeouts and failures.
    pub failure_count: i32,
    /// What was ordered.
    pub details: OrderDetails,
    /// Where to send status notifications.
    pub reply_to: Option<String>,
    /// `Some(Error | Cancelled)`: undo the completed steps, then end in that state.
    pub finish_as: Option<ProcessState>,
    /// The run of its workflow (part of every idempotency key).
    pub generation: i32,
    /// The last error recorded (why it is being undone, after a give-up).
    pub last_error: Option<String>,
    /// The workflow version it is pinned to; `None` only for an order started before
    /// workflows were pinned (it runs the default).
    pub workflow: Option<crate::workflow::WorkflowRef>,
    /// The service it waited for, if it was parked at this step: a request for it
    /// may be this service's probe, and the step may have been sent before.
    pub waiting_on: Option<String>,
}

/// A step result to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepUpdate {
    /// Position in the workflow, from 0.
    pub index: i32,
    /// The step's name.
    pub name: String,
    /// The new status.
    pub status: StepStatus,
    /// The agent's answer or the error text.
    pub detail: Option<String>,
    /// The key of the step's action in this run ([`crate::step::idempotency_key`]),
    /// recorded with it for operators.
    pub idempotency_key: String,
    /// The step can never be undone
    /// ([`crate::workflow::StepDef::cannot_be_undone`]): once it may have taken
    /// effect, the store refuses a cancel that would undo its order
    /// ([`crate::Error::PastReturn`]).
    pub irreversible: bool,
}

/// Step updates to one order, written as one unit of a [`SchedulerStore::record_steps`]
/// batch: all of them, with their messages, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepWrite {
    /// The owner's proof.
    pub fence: Fence,
    /// Refuse the write with [`crate::Error::StaleStep`] unless the order's current
    /// step is this one (guards against a late or repeated reply).
    pub expect_step: Option<i32>,
    /// Applied in order; may be empty (the write then only checks the fence and sends).
    pub updates: Vec<StepUpdate>,
    /// Sent if, and only if, the write is applied.
    pub sends: Vec<Envelope>,
    /// The write records the last step: complete the order (Processed, lock released)
    /// in the same transaction.
    pub complete: bool,
}

/// An operator alert, raised when an order enters Error. It is created in the same
/// transaction as that transition, whichever writes it (a scheduler's failure, a
/// supervisor giving up, an operator), by the SQL trigger `order_state_raises_alert`
/// (migration 0004, both dialects): one alert per entry into Error. The supervisor
/// publishes it (`SupervisorStore::unpublished_alerts`, `mark_alerts_published`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    /// Its number (grows with time).
    pub alert_id: i64,
    /// The order.
    pub order_id: OrderId,
    /// When the order entered Error.
    pub raised_at: DateTime<Utc>,
    /// The step the order was at.
    pub step_index: i32,
    /// That step's name, if it was started.
    pub step: Option<String>,
    /// The order's last error.
    pub last_error: Option<String>,
    /// The order's failure count.
    pub failure_count: i32,
    /// The client's reply queue, if any.
    pub reply_to: Option<String>,
    /// When it went to the alerts queue.
    pub published_at: Option<DateTime<Utc>>,
    /// When an operator acknowledged it.
    pub acknowledged_at: Option<DateTime<Utc>>,
    /// Who acknowledged it.
    pub acknowledged_by: Option<String>,
}

/// One order to complete, with the messages its completion causes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The owner's proof.
    pub fence: Fence,
    /// Sent if, and only if, the order completes.
    pub sends: Vec<Envelope>,
}

impl From<Fence> for Completion {
    fn from(fence: Fence) -> Self {
        Self {
            fence,
            sends: Vec::new(),
        }
    }
}

/// The outcome of completing a batch: each fence either completed or refused.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Orders now Processed.
    pub completed: Vec<OrderId>,
    /// Orders left untouched, with why (fenced, deadline passed, not found).
    pub refused: Vec<(OrderId, crate::Error)>,
}
