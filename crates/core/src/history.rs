//! The append-only history of an order: every transition, who made it, when and why.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::id::{Actor, OrderId};
use crate::state::{Epoch, ProcessState};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HistoryKind {
    /// Accepted from the orders queue.
    Submitted,
    /// Claimed by a scheduler.
    Claimed,
    /// A step was sent to its agent.
    StepStarted,
    /// A step's agent answered with success.
    StepSucceeded,
    /// A step's agent answered with a permanent failure.
    StepFailed,
    /// A step was undone by its compensation.
    StepCompensated,
    /// Every step done.
    Completed,
    /// The owner gave up on the order.
    Failed,
    /// The owner handed the order back unfinished (e.g. on shutdown).
    Released,
    /// The supervisor found the deadline passed and made the order Pending again.
    Recovered,
    /// The supervisor found the deadline passed too often and gave up.
    GaveUp,
    /// An operator sent an Error order round again, continuing from its failed step.
    Resubmitted,
    /// An operator sent an Error order some of whose steps had been undone round
    /// again: a fresh run from the first step under the next generation.
    RetriedAfresh,
    /// An operator cancelled the order.
    Cancelled,
    /// A restarted scheduler with the same instance id took its orders back (new epoch).
    Resumed,
    /// The owner began undoing the completed steps (after a permanent failure or a
    /// cancel request).
    CompensationStarted,
    /// An operator asked for the order to be cancelled; its completed steps are undone
    /// first.
    CancelRequested,
    /// The order waits for a remote service that is down: handed back (Pending, held
    /// until the service is back) without counting as a failure.
    Waiting,
    /// The service it waited for is back: claimable again (Pending to Pending).
    WaitEnded,
    /// An operator moved it to a compatible version of its workflow (its state
    /// unchanged; the reason names both versions).
    VersionMoved,
}

impl HistoryKind {
    /// Every kind.
    pub const ALL: [HistoryKind; 20] = [
        HistoryKind::Submitted,
        HistoryKind::Claimed,
        HistoryKind::StepStarted,
        HistoryKind::StepSucceeded,
        HistoryKind::StepFailed,
        HistoryKind::StepCompensated,
        HistoryKind::Completed,
        HistoryKind::Failed,
        HistoryKind::Released,
        HistoryKind::Recovered,
        HistoryKind::GaveUp,
        HistoryKind::Resubmitted,
        HistoryKind::RetriedAfresh,
        HistoryKind::Cancelled,
        HistoryKind::Resumed,
        HistoryKind::CompensationStarted,
        HistoryKind::CancelRequested,
        HistoryKind::Waiting,
        HistoryKind::WaitEnded,
        HistoryKind::VersionMoved,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Submitted => "Submitted",
            HistoryKind::Claimed => "Claimed",
            HistoryKind::StepStarted => "StepStarted",
            HistoryKind::StepSucceeded => "StepSucceeded",
            HistoryKind::StepFailed => "StepFailed",
            HistoryKind::StepCompensated => "StepCompensated",
            HistoryKind::Completed => "Completed",
            HistoryKind::Failed => "Failed",
            HistoryKind::Released => "Released",
            HistoryKind::Recovered => "Recovered",
            HistoryKind::GaveUp => "GaveUp",
            HistoryKind::Resubmitted => "Resubmitted",
            HistoryKind::RetriedAfresh => "RetriedAfresh",
            HistoryKind::Cancelled => "Cancelled",
            HistoryKind::Resumed => "Resumed",
            HistoryKind::CompensationStarted => "CompensationStarted",
            HistoryKind::CancelRequested => "CancelRequested",
            HistoryKind::Waiting => "Waiting",
            HistoryKind::WaitEnded => "WaitEnded",
            HistoryKind::VersionMoved => "VersionMoved",
        }
    }
}

impl fmt::Display for HistoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HistoryKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HistoryKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown history kind {s:?}"))
    }
}

/// One entry of an order's history. Entries are never updated or deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEvent {
    /// Position in the store's history (grows with time across all orders).
    pub seq: i64,
    /// The order.
    pub order_id: OrderId,
    /// When it happened (the store's clock).
    pub at: DateTime<Utc>,
    /// Who did it.
    pub actor: Actor,
    /// What happened.
    pub kind: HistoryKind,
    /// The state before (None for the first event).
    pub from_state: Option<ProcessState>,
    /// The state after.
    pub to_state: ProcessState,
    /// The order's epoch after the event.
    pub epoch: Epoch,
    /// The step concerned, if any.
    pub step: Option<i32>,
    /// Why: an error text, an operator's reason, the failure count reached.
    pub reason: Option<String>,
}
