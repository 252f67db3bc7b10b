//! What an expiry does to an order: the supervisor's policy, the expired order as a
//! sweep finds it, and the recovery decided from them, once, for every dialect.

use crate::error::Result;
use crate::id::OrderId;
use crate::state::{Epoch, ProcessState};
use crate::validation::ValidationError;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// How the supervisor treats expired orders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// At this failure count the order goes to Error instead of back to Pending.
    pub max_failures: i32,
    /// Back-off after the first failure; doubles with each further failure.
    pub backoff_base: Duration,
    /// Back-off never exceeds this.
    pub backoff_max: Duration,
    /// An order whose undoing (after a give-up, a permanent failure or a cancel) times
    /// out is sent round again to undo, with back-off, up to this many more failures
    /// past `max_failures`: a transient hang during compensation must not leave an
    /// effect in force. Only then does it end in Error as needing manual repair.
    pub max_undo_failures: i32,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        Self {
            max_failures: 5,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            max_undo_failures: 30,
        }
    }
}

impl RecoveryPolicy {
    /// What the expiry of `e` at `now` does: below the threshold, back to Pending after
    /// the back-off; at it, Error, unless steps may have taken effect and are not being
    /// undone yet: then Pending at once with `finish_as = Error`, so they are undone
    /// (as after a permanent failure) before it ends in Error. An order whose undoing
    /// itself expires goes round again to undo, with back-off, until
    /// `max_failures + max_undo_failures`; past that it ends in Error, marked as
    /// needing manual repair.
    pub fn decide(&self, e: &Expired, now: DateTime<Utc>) -> Recovery {
        use crate::history::HistoryKind;
        if let Some(service) = &e.waiting_for {
            // It was let through as the probe of a service still down (or its probe
            // has no verdict yet): it waits again, uncounted.
            return Recovery {
                to: ProcessState::Pending,
                failure_count: e.failure_count,
                finish_as: e.finish_as,
                next_attempt_at: Some(crate::service::held()),
                reason: format!(
                    "deadline passed in step {} while {service} is down: waits for it again; not counted as a failure",
                    e.current_step
                ),
                kind: HistoryKind::Waiting,
                outcome: RecoveryOutcome::Waiting {
                    order_id: e.order_id.clone(),
                    service: service.clone(),
                },
            };
        }
        let failures = e.failure_count.saturating_add(1);
        // Undoing has a budget of its own on top of the forward one.
        let undoing = e.finish_as.is_some();
        let limit = if undoing {
            self.max_failures.saturating_add(self.max_undo_failures)
        } else {
            self.max_failures
        };
        let what = format!(
            "deadline passed in step {}{} while held by {} (failure {failures} of {limit})",
            e.current_step,
            if undoing { ", undoing" } else { "" },
            e.locked_by,
        );
        let order_id = e.order_id.clone();
        if failures < limit {
            let next = now
                + chrono::Duration::from_std(self.backoff(failures))
                    .unwrap_or(chrono::Duration::MAX);
            return Recovery {
                to: ProcessState::Pending,
                failure_count: failures,
                finish_as: e.finish_as,
                next_attempt_at: Some(next),
                reason: what,
                kind: HistoryKind::Recovered,
                outcome: RecoveryOutcome::Retried {
                    order_id,
                    failure_count: failures,
                    next_attempt_at: next,
                },
            };
        }
        if e.finish_as.is_none() && !e.in_force.is_empty() {
            return Recovery {
                to: ProcessState::Pending,
                failure_count: failures,
                finish_as: Some(ProcessState::Error),
                next_attempt_at: Some(now),
                reason: format!(
                    "{what}: giving up; undoing its completed steps before it ends in Error"
                ),
                kind: HistoryKind::GaveUp,
                outcome: RecoveryOutcome::Undoing {
                    order_id,
                    failure_count: failures,
                },
            };
        }
        let reason = if e.finish_as.is_some() {
            let left = if e.in_force.is_empty() {
                "none recorded".to_owned()
            } else {
                e.in_force.join(", ")
            };
            format!(
                "{what}: gave up while undoing its steps; still in force: {left}; needs manual repair (retry undoes them first, then runs afresh)"
            )
        } else {
            format!("{what}: gave up")
        };
        Recovery {
            to: ProcessState::Error,
            failure_count: failures,
            finish_as: None,
            next_attempt_at: None,
            reason,
            kind: HistoryKind::GaveUp,
            outcome: RecoveryOutcome::GaveUp {
                order_id,
                failure_count: failures,
            },
        }
    }

    /// The wait before attempt number `failure_count + 1`: base * 2^(failure_count - 1),
    /// capped at the maximum.
    pub fn backoff(&self, failure_count: i32) -> Duration {
        let doublings = failure_count.saturating_sub(1).clamp(0, 30) as u32;
        self.backoff_base
            .saturating_mul(1 << doublings)
            .min(self.backoff_max)
    }

    /// Refuses a policy that would never give up or never wait.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.max_failures < 1 {
            return Err(ValidationError::new("max_failures", "must be at least 1"));
        }
        if !(0..=1000).contains(&self.max_undo_failures) {
            return Err(ValidationError::new(
                "max_undo_failures",
                "must be 0 to 1000",
            ));
        }
        if self.backoff_base > Duration::from_secs(3600) {
            return Err(ValidationError::new(
                "backoff_base",
                "must be at most 1 hour",
            ));
        }
        if self.backoff_max > Duration::from_secs(7 * 24 * 3600) {
            return Err(ValidationError::new(
                "backoff_max",
                "must be at most 7 days",
            ));
        }
        if self.backoff_base > self.backoff_max {
            return Err(ValidationError::new(
                "backoff_base",
                "must not exceed backoff_max",
            ));
        }
        Ok(())
    }
}

/// What the supervisor did with one expired order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryOutcome {
    /// Back to Pending; claimable again from `next_attempt_at`.
    Retried {
        /// The order.
        order_id: OrderId,
        /// The failure count now.
        failure_count: i32,
        /// When it may be claimed again.
        next_attempt_at: DateTime<Utc>,
    },
    /// The threshold was reached: the order is in Error.
    GaveUp {
        /// The order.
        order_id: OrderId,
        /// The failure count now (the threshold).
        failure_count: i32,
    },
    /// The threshold was reached by an order with steps that may have taken effect:
    /// back to Pending with `finish_as = Error`, so a scheduler undoes them (in
    /// reverse, when the workflow compensates on error) before it ends in Error.
    Undoing {
        /// The order.
        order_id: OrderId,
        /// The failure count now (the threshold).
        failure_count: i32,
    },
    /// It was waiting for a service that is still down: parked again, not counted.
    Waiting {
        /// The order.
        order_id: OrderId,
        /// The service it waits for.
        service: String,
    },
}

/// An order whose owner's deadline passed, as a sweep finds it: what the recovery is
/// decided from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The order.
    pub order_id: OrderId,
    /// Its failure count before this expiry.
    pub failure_count: i32,
    /// The step it was at.
    pub current_step: i32,
    /// Who held it and let it expire.
    pub locked_by: String,
    /// The owner's epoch.
    pub lock_epoch: Epoch,
    /// The deadline that passed.
    pub complete_by: DateTime<Utc>,
    /// Set when it was already being undone.
    pub finish_as: Option<ProcessState>,
    /// Its steps that may have taken effect (started or succeeded), by name, in step
    /// order: what is still in force if it ends now.
    pub in_force: Vec<String>,
    /// The service it was parked for, if that service is still down (or probing): its
    /// expiry is not its fault and is not counted.
    pub waiting_for: Option<String>,
}

/// What an expiry does to an order: decided here, once, for every dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The state it moves to.
    pub to: ProcessState,
    /// Its failure count now.
    pub failure_count: i32,
    /// How it ends once its steps are undone (`None`: runs forward, or ends now).
    pub finish_as: Option<ProcessState>,
    /// When it may be claimed again (`None` for Error: unchanged).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Why, for its last error and its history.
    pub reason: String,
    /// The history entry's kind.
    pub kind: crate::history::HistoryKind,
    /// What the sweep reports.
    pub outcome: RecoveryOutcome,
}

impl RecoveryOutcome {
    /// The order concerned.
    pub fn order_id(&self) -> &OrderId {
        match self {
            RecoveryOutcome::Retried { order_id, .. }
            | RecoveryOutcome::GaveUp { order_id, .. }
            | RecoveryOutcome::Undoing { order_id, .. }
            | RecoveryOutcome::Waiting { order_id, .. } => order_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn backoff_doubles_from_the_base_and_stops_at_the_cap() {
        let p = RecoveryPolicy {
            max_failures: 10,
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(60),
            max_undo_failures: 0,
        };
        assert_eq!(p.backoff(1), Duration::from_secs(2));
        assert_eq!(p.backoff(2), Duration::from_secs(4));
        assert_eq!(p.backoff(5), Duration::from_secs(32));
        assert_eq!(p.backoff(6), Duration::from_secs(60));
        assert_eq!(p.backoff(i32::MAX), Duration::from_secs(60));
    }

    /// Past the undo budget an order ends in Error needing repair, and says which of
    /// its steps are still in force; inside it, it goes round again to undo.
    #[test]
    fn undoing_that_keeps_timing_out_ends_naming_the_steps_still_in_force() {
        let p = RecoveryPolicy {
            max_failures: 2,
            max_undo_failures: 3,
            ..RecoveryPolicy::default()
        };
        let mut e = Expired {
            order_id: OrderId::parse("o-1").unwrap(),
            failure_count: 2,
            current_step: 1,
            locked_by: "scheduler-a".into(),
            lock_epoch: Epoch(3),
            complete_by: Utc::now(),
            finish_as: Some(ProcessState::Error),
            in_force: vec!["reserve-inventory".into(), "charge-payment".into()],
            waiting_for: None,
        };
        let now = Utc::now();
        let d = p.decide(&e, now);
        assert_eq!(d.to, ProcessState::Pending);
        assert_eq!(d.finish_as, Some(ProcessState::Error));
        assert!(d.reason.contains("undoing"), "{}", d.reason);
        e.failure_count = 4;
        let d = p.decide(&e, now);
        assert_eq!(d.to, ProcessState::Error);
        assert!(
            d.reason
                .contains("still in force: reserve-inventory, charge-payment; needs manual repair"),
            "{}",
            d.reason
        );
        // Running forward with nothing in force, it just gives up.
        e.finish_as = None;
        e.failure_count = 1;
        e.in_force.clear();
        let d = p.decide(&e, now);
        assert_eq!((d.to, d.finish_as), (ProcessState::Error, None));
    }
}
