//! Workflows are declared, not hard-coded: an ordered list of steps, each with the
//! agent queue that runs it, its time budget, its retry policy and an optional
//! compensating step. The scheduler reads one from configuration; agents learn a
//! step's budget and retry policy from each request.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::transport::QueueName;

/// Longest step name accepted (keeps idempotency keys and message ids short).
pub const MAX_STEP_NAME_LEN: usize = 40;
/// Most steps one workflow may have.
pub const MAX_STEPS: usize = 32;

/// How an agent retries transient failures of one remote call: exponential back-off
/// with full jitter, `initial_backoff * multiplier^(n-1)` capped at `max_backoff`, at
/// most `max_attempts` tries, and never past the step's deadline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub max_attempts: u32,
    /// Wait before the second try, in milliseconds.
    pub initial_backoff_ms: u64,
    /// Longest wait between tries, in milliseconds.
    pub max_backoff_ms: u64,
    /// Growth of the wait from one try to the next.
    pub multiplier: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff_ms: 50,
            max_backoff_ms: 2_000,
            multiplier: 2.0,
        }
    }
}

impl RetryPolicy {
    /// The longest wait before try number `attempt + 1` (`attempt` from 1); the agent
    /// waits a random part of it (full jitter).
    pub fn backoff_cap(&self, attempt: u32) -> Duration {
        let growth = self
            .multiplier
            .powi(i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX));
        let ms = (self.initial_backoff_ms as f64 * growth).min(self.max_backoff_ms as f64);
        Duration::from_millis(ms.max(0.0) as u64)
    }

    /// Refuses a policy that cannot work; the error names the field.
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if self.max_attempts == 0 || self.max_attempts > 100 {
            return Err(ValidationError::new(
                format!("{field}.max_attempts"),
                "must be 1 to 100",
            ));
        }
        if !(1.0..=10.0).contains(&self.multiplier) {
            return Err(ValidationError::new(
                format!("{field}.multiplier"),
                "must be 1.0 to 10.0",
            ));
        }
        if self.initial_backoff_ms > self.max_backoff_ms {
            return Err(ValidationError::new(
                format!("{field}.initial_backoff_ms"),
                "must not exceed max_backoff_ms",
            ));
        }
        if self.max_backoff_ms > 600_000 {
            return Err(ValidationError::new(
                format!("{field}.max_backoff_ms"),
                "must be at most 600000 (10 min)",
            ));
        }
        Ok(())
    }
}

/// One step of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepDef {
    /// The step's name, also the remote action an agent performs for it.
    pub name: String,
    /// The agent queue its requests go to.
    pub queue: QueueName,
    /// The most one agent spends on one request of this step (all its tries), in
    /// milliseconds; never more than the order's deadline allows.
    pub timeout_ms: u64,
    /// How the agent retries transient failures.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The remote action that undoes this step, if it can be undone.
    #[serde(default)]
    pub compensation: Option<String>,
}

impl StepDef {
    /// The step's time budget.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// An ordered list of steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// Its name, for logs.
    pub name: String,
    /// The steps, run in this order.
    pub steps: Vec<StepDef>,
    /// On a permanent failure, undo the completed steps (in reverse order) before the
    /// order ends in Error.
    #[serde(default = "yes")]
    pub compensate_on_error: bool,
}

fn yes() -> bool {
    true
}

impl Default for Workflow {
    /// The order workflow: reserve-inventory, charge-payment, ship; release-inventory
    /// and refund undo the first two.
    fn default() -> Self {
        let step = |name: &str, queue: &str, compensation: Option<&str>| StepDef {
            name: name.to_owned(),
            queue: QueueName::parse(queue).unwrap_or_else(|_| unreachable_queue()),
            timeout_ms: 10_000,
            retry: RetryPolicy::default(),
            compensation: compensation.map(str::to_owned),
        };
        Self {
            name: "order".to_owned(),
            steps: vec![
                step(
                    "reserve-inventory",
                    "agent.inventory",
                    Some("release-inventory"),
                ),
                step("charge-payment", "agent.payment", Some("refund")),
                step("ship", "agent.shipping", None),
            ],
            compensate_on_error: true,
        }
    }
}

fn unreachable_queue() -> QueueName {
    // The literal names above are valid; this only satisfies the type.
    QueueName::parse("agent").unwrap_or_else(|_| unreachable!("literal queue name"))
}

impl Workflow {
    /// Checks names, budgets and policies; the error names the field, e.g.
    /// `steps[1].timeout_ms`.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.steps.is_empty() || self.steps.len() > MAX_STEPS {
            return Err(ValidationError::new(
                "steps",
                format!("must have 1 to {MAX_STEPS} steps"),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in self.steps.iter().enumerate() {
            let field = format!("steps[{i}]");
            for (what, name) in std::iter::once(("name", &s.name))
                .chain(s.compensation.iter().map(|c| ("compensation", c)))
            {
                if name.is_empty()
                    || name.len() > MAX_STEP_NAME_LEN
                    || !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    return Err(ValidationError::new(
                        format!("{field}.{what}"),
                        format!(
                            "must be 1 to {MAX_STEP_NAME_LEN} letters, digits, - or _ (got {name:?})"
                        ),
                    ));
                }
                if !names.insert(name.clone()) {
                    return Err(ValidationError::new(
                        format!("{field}.{what}"),
                        format!("{name:?} is used twice; every action needs its own name"),
                    ));
                }
            }
            if s.timeout_ms < 10 || s.timeout_ms > 24 * 3600 * 1000 {
                return Err(ValidationError::new(
                    format!("{field}.timeout_ms"),
                    "must be 10 ms to 24 h",
                ));
            }
            s.retry.validate(&format!("{field}.retry"))?;
        }
        Ok(())
    }

    /// The step at `index`, if any.
    pub fn step(&self, index: i32) -> Option<&StepDef> {
        usize::try_from(index).ok().and_then(|i| self.steps.get(i))
    }

    /// The number of steps, as a step index type.
    pub fn len(&self) -> i32 {
        i32::try_from(self.steps.len()).unwrap_or(i32::MAX)
    }

    /// Whether the workflow has no steps (never true of a validated one).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The sum of the step budgets: a sensible processing timeout for a whole order.
    pub fn total_budget(&self) -> Duration {
        self.steps.iter().map(StepDef::timeout).sum()
    }

    /// Every agent queue the workflow uses, once each.
    pub fn queues(&self) -> Vec<QueueName> {
        let mut queues: Vec<QueueName> = self.steps.iter().map(|s| s.queue.clone()).collect();
        queues.sort();
        queues.dedup();
        queues
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_workflow_is_valid_and_undoes_its_first_two_steps() {
        let w = Workflow::default();
        w.validate().unwrap();
        let names: Vec<_> = w.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["reserve-inventory", "charge-payment", "ship"]);
        assert_eq!(
            w.steps[0].compensation.as_deref(),
            Some("release-inventory")
        );
        assert_eq!(w.steps[1].compensation.as_deref(), Some("refund"));
        assert_eq!(w.steps[2].compensation, None);
    }

    #[test]
    fn validation_names_the_field_at_fault() {
        let mut w = Workflow::default();
        w.steps[1].timeout_ms = 0;
        assert_eq!(w.validate().unwrap_err().field, "steps[1].timeout_ms");
        let mut w = Workflow::default();
        w.steps[2].compensation = Some("refund".into());
        assert_eq!(w.validate().unwrap_err().field, "steps[2].compensation");
        let mut w = Workflow::default();
        w.steps[0].retry.max_attempts = 0;
        assert_eq!(
            w.validate().unwrap_err().field,
            "steps[0].retry.max_attempts"
        );
    }

    #[test]
    fn backoff_grows_by_the_multiplier_and_stops_at_the_cap() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            multiplier: 2.0,
        };
        assert_eq!(p.backoff_cap(1), Duration::from_millis(100));
        assert_eq!(p.backoff_cap(3), Duration::from_millis(400));
        assert_eq!(p.backoff_cap(9), Duration::from_millis(1_000));
    }
}
