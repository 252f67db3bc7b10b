//! A workflow's steps: what runs each, its retry policy, and how an agent asks a
//! remote service about a call whose answer was lost.

use super::{is_true, yes};
use crate::transport::QueueName;
use crate::validation::ValidationError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

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
    /// Whether the step's effect must be undone when its order is cancelled or fails
    /// (the default). A step with no compensation that needs undoing cannot be taken
    /// back: once it may have taken effect, its order is past the point of no return,
    /// and undoing it (a cancel, a failure, the supervisor giving up) stops before
    /// anything is undone and ends the order in Error for repair by hand. `false` says
    /// its effect may stand (a notification, a lookup); it allows no compensation.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub undo_needed: bool,
    /// How to ask the remote service whether this step already took effect, before it
    /// is sent again without knowing (after a timeout, a lost reply, a recovery or a
    /// restart). Without one, an uncertain step is re-sent under the same key and the
    /// service's idempotency is all that keeps it from applying twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<StatusProbe>,
}

/// A remote service's status endpoint: `GET url` (with `{key}` replaced by the step's
/// idempotency key, `{order_id}` and `{action}` by theirs) answers 2xx when the action
/// took effect (the body is kept as the step's answer) and 404 when it did not, or
/// when the service does not know (`not_found`); anything else, or no answer, is
/// unknown and the step is sent again under the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusProbe {
    /// The URL template, e.g. `http://payment/status/{key}`.
    pub url: String,
    /// What a 404 means.
    #[serde(default)]
    pub not_found: NotFound,
}

/// What a status endpoint's 404 means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotFound {
    /// The service keeps a record of everything it applied: 404 is "not applied", and
    /// the step is sent.
    #[default]
    NotApplied,
    /// The service forgets (or never keeps) what it applied: 404 proves nothing, and the
    /// step is sent under the same key, as without a probe.
    Unknown,
}

impl StatusProbe {
    /// The URL to ask for the action `action` of `order_id` under `key` (each value
    /// percent-encoded).
    pub fn url_for(&self, key: &str, order_id: &str, action: &str) -> String {
        self.url
            .replace("{key}", &encode(key))
            .replace("{order_id}", &encode(order_id))
            .replace("{action}", &encode(action))
    }

    /// Refuses a probe that cannot work; the error names the field.
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(ValidationError::new(
                format!("{field}.url"),
                "must be an http:// or https:// URL",
            ));
        }
        if !self.url.contains("{key}") {
            return Err(ValidationError::new(
                format!("{field}.url"),
                "must contain {key} (the step's idempotency key is what the service is asked about)",
            ));
        }
        if self.url.len() > 2_000 {
            return Err(ValidationError::new(
                format!("{field}.url"),
                "must be at most 2000 characters",
            ));
        }
        Ok(())
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl StepDef {
    /// The step's time budget.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Whether its effect, once it may have taken effect, can never be taken back: it
    /// needs undoing and has no compensation.
    pub fn cannot_be_undone(&self) -> bool {
        self.undo_needed && self.compensation.is_none()
    }
}
