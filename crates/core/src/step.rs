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

/// The detail a step's record carries while its compensation is in flight (status
/// [`StepStatus::Started`]): `compensating with <action>`. The step's effect may be in
/// force or undone: its undo is in doubt until the compensation answers.
pub fn compensating_detail(compensation: &str) -> String {
    format!("{COMPENSATING} {compensation}")
}

const COMPENSATING: &str = "compensating with";

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
    /// It stopped half undone: some step's undo is in doubt (its compensation was sent
    /// and never answered), or some steps were undone and others not. Continuing would
    /// leave an undone step counted as done; a fresh run straight away would apply
    /// again a step whose first effect may still be in force. So the undoing is
    /// finished first (an undo in doubt is sent again under its own key, which the
    /// remote service applies once), then the workflow runs afresh under the next
    /// generation.
    UndoFirst {
        /// The generation the fresh run will have.
        generation: i32,
        /// The steps whose undo is in doubt, by name.
        in_doubt: Vec<String>,
        /// The steps already undone, by name.
        undone: Vec<String>,
    },
}

impl RetryPlan {
    /// The plan for an order at `current_step` of run `generation` with these steps.
    pub fn for_order(generation: i32, current_step: i32, steps: &[StepRecord]) -> Self {
        let names = |keep: &dyn Fn(&StepRecord) -> bool| -> Vec<String> {
            steps
                .iter()
                .filter(|s| keep(s))
                .map(|s| s.name.clone())
                .collect()
        };
        let undone = names(&|s| s.status == StepStatus::Compensated);
        let in_doubt = names(&StepRecord::undo_in_doubt);
        if !in_doubt.is_empty() {
            return RetryPlan::UndoFirst {
                generation: generation + 1,
                in_doubt,
                undone,
            };
        }
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
            RetryPlan::UndoFirst {
                generation,
                in_doubt,
                undone,
            } => format!(
                "finishes undoing first (undo of {} in doubt{}), then a fresh run from the first step (generation {generation})",
                in_doubt.join(", "),
                if undone.is_empty() {
                    String::new()
                } else {
                    format!("; undone: {}", undone.join(", "))
                }
            ),
        }
    }

    /// Whether the retry starts the workflow again from its first step (now, or once
    /// the undoing is finished).
    pub fn runs_afresh(&self) -> bool {
        !matches!(self, RetryPlan::Continue { .. })
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

impl StepRecord {
    /// Its compensation was sent and has not answered: its effect may be in force or
    /// undone ([`compensating_detail`]).
    pub fn undo_in_doubt(&self) -> bool {
        self.status == StepStatus::Started
            && self
                .detail
                .as_deref()
                .is_some_and(|d| d.starts_with(COMPENSATING))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(index: i32, name: &str, status: StepStatus, detail: Option<&str>) -> StepRecord {
        StepRecord {
            order_id: OrderId::parse("o-1").unwrap(),
            index,
            name: name.to_owned(),
            status,
            idempotency_key: format!("o-1/{index}/{name}"),
            attempts: 1,
            detail: detail.map(str::to_owned),
            epoch: Epoch(1),
            updated_at: Utc::now(),
        }
    }

    #[test]
    fn a_retry_continues_runs_afresh_or_finishes_undoing_first_from_the_steps() {
        let done = step(0, "reserve", StepStatus::Succeeded, Some("ok"));
        let failed = step(1, "charge", StepStatus::Failed, Some("declined"));
        assert_eq!(
            RetryPlan::for_order(0, 1, &[done.clone(), failed.clone()]),
            RetryPlan::Continue { from_step: 1 }
        );
        // A forward step in doubt (sent, no answer) is continued: sent again under
        // its key.
        let forward = step(1, "charge", StepStatus::Started, None);
        assert_eq!(
            RetryPlan::for_order(0, 1, &[done.clone(), forward]),
            RetryPlan::Continue { from_step: 1 }
        );
        let undone = step(0, "reserve", StepStatus::Compensated, Some("released"));
        let plan = RetryPlan::for_order(2, 1, &[undone.clone(), failed.clone()]);
        assert_eq!(
            plan,
            RetryPlan::FreshRun {
                generation: 3,
                undone: vec!["reserve".into()]
            }
        );
        assert!(plan.runs_afresh());
        // Its undo was sent and never answered: in doubt.
        let doubt = step(
            1,
            "charge",
            StepStatus::Started,
            Some(&compensating_detail("refund")),
        );
        assert!(doubt.undo_in_doubt());
        assert!(!done.undo_in_doubt());
        let plan = RetryPlan::for_order(0, 2, &[done, doubt.clone(), failed]);
        assert_eq!(
            plan,
            RetryPlan::UndoFirst {
                generation: 1,
                in_doubt: vec!["charge".into()],
                undone: vec![],
            }
        );
        assert!(plan.runs_afresh());
        assert!(
            plan.describe().contains("undo of charge in doubt"),
            "{}",
            plan.describe()
        );
        let plan = RetryPlan::for_order(0, 2, &[undone, doubt]);
        assert!(
            matches!(&plan, RetryPlan::UndoFirst { undone, .. } if undone == &["reserve"]),
            "{plan:?}"
        );
    }
}
