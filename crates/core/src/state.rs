//! The state row of an order and the `ProcessState` machine that governs it.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::id::{InstanceId, OrderId};

/// Where an order stands. Stored as its name (`Pending`, `Processing`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessState {
    /// Waiting for a scheduler to claim it (once its next attempt is due).
    Pending,
    /// Claimed by a scheduler (`locked_by`) until `complete_by`.
    Processing,
    /// Every step done. Terminal.
    Processed,
    /// Failed permanently or too often; waits for an operator.
    Error,
    /// Cancelled by an operator. Terminal.
    Cancelled,
}

impl ProcessState {
    /// Every state, in lifecycle order.
    pub const ALL: [ProcessState; 5] = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Processed,
        ProcessState::Error,
        ProcessState::Cancelled,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessState::Pending => "Pending",
            ProcessState::Processing => "Processing",
            ProcessState::Processed => "Processed",
            ProcessState::Error => "Error",
            ProcessState::Cancelled => "Cancelled",
        }
    }

    /// Whether the machine allows moving from `self` to `next`:
    ///
    /// | from       | to                                                            |
    /// |------------|---------------------------------------------------------------|
    /// | Pending    | Processing (claim), Cancelled                                 |
    /// | Processing | Processed, Error, Pending (recovery or release), Cancelled         |
    /// | Error      | Pending (resubmit), Cancelled                                 |
    /// | Processed  | nothing                                                       |
    /// | Cancelled  | nothing                                                       |
    pub fn can_become(self, next: ProcessState) -> bool {
        use ProcessState::*;
        matches!(
            (self, next),
            (Pending, Processing | Cancelled)
                | (Processing, Processed | Error | Pending | Cancelled)
                | (Error, Pending | Cancelled)
        )
    }

    /// Whether nothing can happen to the order any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, ProcessState::Processed | ProcessState::Cancelled)
    }
}

impl fmt::Display for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored or typed state name that is not one of the five.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown process state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for ProcessState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProcessState::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// The ownership term of an order: it grows by one on every claim and never goes down.
/// A scheduler's writes carry the owner and epoch its claim granted; a write whose
/// owner or epoch no longer matches the row is refused (fencing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Epoch(pub i64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The proof of ownership a scheduler presents with every write to an order it claimed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fence {
    /// The order.
    pub order_id: OrderId,
    /// The instance that claimed it.
    pub owner: InstanceId,
    /// The epoch granted by the claim.
    pub epoch: Epoch,
}

/// The state row of one order: the user's five columns and what the product needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateRow {
    /// `OrderID`.
    pub order_id: OrderId,
    /// `LockedBy`: the scheduler instance that owns the order while Processing.
    pub locked_by: Option<InstanceId>,
    /// `CompleteBy`: the owner's deadline while Processing.
    pub complete_by: Option<DateTime<Utc>>,
    /// `ProcessState`.
    pub process_state: ProcessState,
    /// `FailureCount`: timeouts and failures counted so far.
    pub failure_count: i32,
    /// Fencing epoch; only grows.
    pub lock_epoch: Epoch,
    /// Index of the workflow step to run next (0 before the first).
    pub current_step: i32,
    /// The order may not be claimed before this time (back-off after a recovery).
    pub next_attempt_at: DateTime<Utc>,
    /// The last error recorded, for operators.
    pub last_error: Option<String>,
    /// The client's private queue for status notifications, if it gave one.
    pub reply_to: Option<String>,
    /// `Some(Error | Cancelled)` while the order's completed steps are being undone
    /// (compensated) before it ends in that state; `None` while it runs forward.
    pub finish_as: Option<ProcessState>,
    /// The run of its workflow (0 for the first; an operator's retry after some steps
    /// were undone starts the next). Part of every idempotency key.
    pub generation: i32,
    /// The workflow it asked for (`None`: the default), then, once started, the one
    /// it runs under.
    pub workflow: Option<String>,
    /// The version of `workflow` it is pinned to, from its first claim on.
    pub workflow_version: Option<String>,
    /// The remote service it waits for (an agent queue), set when it was parked
    /// because that service was down and kept until it moves past that step; with
    /// `next_attempt_at` at `orderly_core::service::held` it waits still.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<String>,
    /// When the order was accepted.
    pub created_at: DateTime<Utc>,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
}

impl StateRow {
    /// The order's last error as an operator should read it: as it is while the order
    /// can still fail or has failed, and marked `earlier:` once the order was Processed
    /// anyway (an attempt or a run before the one that succeeded failed with it).
    pub fn error_note(&self) -> Option<String> {
        let error = self.last_error.as_deref()?;
        Some(if self.process_state == ProcessState::Processed {
            format!("earlier: {error}")
        } else {
            error.to_owned()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ProcessState::*;
    use super::*;

    #[test]
    fn terminal_states_go_nowhere() {
        for to in ProcessState::ALL {
            assert!(!Processed.can_become(to), "Processed -> {to}");
            assert!(!Cancelled.can_become(to), "Cancelled -> {to}");
        }
    }

    #[test]
    fn the_legal_paths_are_allowed() {
        assert!(Pending.can_become(Processing));
        assert!(Processing.can_become(Processed));
        assert!(Processing.can_become(Pending));
        assert!(Processing.can_become(Error));
        assert!(Error.can_become(Pending));
        assert!(Error.can_become(Cancelled));
        assert!(!Pending.can_become(Processed), "a claim must come first");
        assert!(!Pending.can_become(Error));
        assert!(
            !Error.can_become(Processing),
            "an Error order is resubmitted to Pending first"
        );
    }

    #[test]
    fn states_round_trip_through_their_stored_names() {
        for st in ProcessState::ALL {
            assert_eq!(st.as_str().parse::<ProcessState>().unwrap(), st);
        }
        assert_eq!("error".parse::<ProcessState>().unwrap(), Error);
        assert!("Done".parse::<ProcessState>().is_err());
    }
}
