//! The messages the roles exchange, and the queue names they use by default. Every
//! message is JSON; every message id is derived from what the message means, so a
//! resend of the same message is dropped by a queue with duplicate detection (see
//! [`queues::settings`] for which queues orderly creates with it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::id::{InstanceId, OrderId};
use crate::order::OrderDetails;
use crate::state::Fence;
use crate::transport::{Envelope, OutgoingMessage, QueueName};
use crate::workflow::RetryPolicy;

/// The default queue names.
pub use crate::transport::queues;

/// The message a client posts to the orders queue: the order and, optionally, a
/// private queue for status notifications.
pub type OrderSubmitted = crate::store::NewOrder;

/// Largest order-submitted message body the submitter accepts (bytes); a larger one is
/// dead-lettered, so clients refuse it before sending.
pub const MAX_ORDER_MESSAGE: usize = 64 * 1024;

/// The order-submitted message for `order`, as every client sends it: a JSON body,
/// the order id as message id (a repeat within the queue's duplicate-detection window
/// is dropped by the queue; a later one is absorbed by the submitter) and as
/// correlation id. Refuses, before anything is sent, an order that is not valid and a
/// body over [`MAX_ORDER_MESSAGE`].
pub fn order_submitted(
    order: &OrderSubmitted,
) -> Result<OutgoingMessage, crate::transport::TransportError> {
    order.validate()?;
    let message = json_message(
        order.order_id.as_str().to_owned(),
        order,
        Some(order.order_id.as_str()),
    );
    if message.body.len() > MAX_ORDER_MESSAGE {
        return Err(crate::transport::TransportError::PayloadTooLarge {
            size: message.body.len(),
            limit: MAX_ORDER_MESSAGE,
        });
    }
    Ok(message)
}

/// Whether a request does a step or undoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Perform the step.
    Do,
    /// Undo a step done earlier (its compensation).
    Compensate,
}

/// A scheduler's request to an agent: perform (or undo) one step of one order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRequest {
    /// The owner's proof, echoed in the reply; a reply under a stale fence is refused.
    pub fence: Fence,
    /// The step's position in the workflow.
    pub step_index: i32,
    /// The step's name.
    pub step: String,
    /// The remote action to perform: the step's name, or its compensation's.
    pub action: String,
    /// Do or undo.
    pub kind: StepKind,
    /// The same on every retry and every re-run of this action for this order.
    pub idempotency_key: String,
    /// For a compensation in a run after the first: the key of the action it undoes
    /// (for the first run the agent derives it, as before generations existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensates: Option<String>,
    /// The order's deadline (CompleteBy): after it, the agent stops and sends nothing.
    pub complete_by: DateTime<Utc>,
    /// The most the agent spends on this request, in milliseconds.
    pub timeout_ms: u64,
    /// How the agent retries transient failures.
    pub retry: RetryPolicy,
    /// Where to reply.
    pub reply_to: crate::transport::QueueName,
    /// What the agent needs to know of the order, echoed in the reply so the scheduler
    /// that applies it needs no extra read.
    pub context: StepContext,
    /// The step's status probe (see [`crate::workflow::StatusProbe`]), for a step that
    /// declares one; sent only then, so agents of an earlier version see no change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::workflow::StatusProbe>,
    /// The step may have been sent before and taken effect unseen (the order came back
    /// after a timeout, or its scheduler restarted): with a probe, the agent asks the
    /// service before calling. Set only with a probe.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub uncertain: bool,
}

/// The order's context carried by a request and echoed by its reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepContext {
    /// What was ordered.
    pub details: OrderDetails,
    /// The client's queue for status notifications.
    #[serde(default)]
    pub notify_to: Option<String>,
    /// Set while the order's steps are being undone: how it will end.
    #[serde(default)]
    pub finish_as: Option<crate::state::ProcessState>,
    /// The run of the workflow (part of every idempotency key). Left out for the first
    /// run (0), so those messages read the same as before generations existed and an
    /// agent of the previous version takes them during a rolling upgrade.
    #[serde(default, skip_serializing_if = "is_first_run")]
    pub generation: i32,
    /// The workflow version the order is pinned to; the scheduler applies the reply
    /// with that version's steps. Absent in messages sent before workflows were
    /// pinned (the default workflow applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<crate::workflow::WorkflowRef>,
}

fn is_first_run(generation: &i32) -> bool {
    *generation == 0
}

impl StepRequest {
    /// The reply `agent` sends to this request with `outcome`, decided at `replied_at`
    /// after `attempts` remote calls; it echoes the request's fence, step, deadline and
    /// context.
    pub fn reply(
        &self,
        outcome: StepOutcome,
        agent: InstanceId,
        replied_at: DateTime<Utc>,
        attempts: u32,
    ) -> StepReply {
        StepReply {
            fence: self.fence.clone(),
            step_index: self.step_index,
            step: self.step.clone(),
            action: self.action.clone(),
            kind: self.kind,
            outcome,
            agent,
            replied_at,
            complete_by: self.complete_by,
            attempts,
            context: self.context.clone(),
        }
    }

    /// Refuses a request no scheduler sends, before anything of it is used: step and
    /// action names outside the workflow names' characters (the action goes into the
    /// remote service's URL), a budget outside 10 ms to 24 h (a huge one would
    /// overflow the agent's clock), a retry policy or status probe a workflow would not
    /// pass, an idempotency key that is empty, over 400 bytes or has control characters.
    pub fn check(&self) -> Result<(), crate::validation::ValidationError> {
        use crate::validation::ValidationError;
        use crate::workflow::{MAX_STEP_TIMEOUT_MS, MIN_STEP_TIMEOUT_MS, check_step_name};
        check_step_name("step", &self.step)?;
        check_step_name("action", &self.action)?;
        if !(MIN_STEP_TIMEOUT_MS..=MAX_STEP_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(ValidationError::new("timeout_ms", "must be 10 ms to 24 h"));
        }
        self.retry.validate("retry")?;
        if let Some(probe) = &self.probe {
            probe.validate("probe")?;
        }
        for (field, key) in std::iter::once(("idempotency_key", &self.idempotency_key))
            .chain(self.compensates.iter().map(|k| ("compensates", k)))
        {
            if key.is_empty() || key.len() > 400 || key.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    field,
                    "must be 1 to 400 bytes without control characters",
                ));
            }
        }
        Ok(())
    }

    /// Whether the request is what its workflow version `flow` says a scheduler sends
    /// for its step to `queue` (where it was received): the step's name and queue, the
    /// action (the step or its compensation), budget, retry policy and status probe,
    /// and the idempotency keys the order, run and step give. An agent acts only on
    /// what its own configuration and the stored workflow say: a request that differs
    /// in any of these was not sent by a scheduler and is refused (its probe URL, say,
    /// would make the agent fetch an address of the sender's choosing).
    pub fn matches(&self, flow: &crate::workflow::Workflow, queue: &str) -> Result<(), String> {
        use crate::step::idempotency_key;
        let Some(def) = flow.step(self.step_index) else {
            return Err(format!(
                "step index {} is outside workflow {} ({} steps)",
                self.step_index,
                flow.reference(),
                flow.len()
            ));
        };
        let action = match self.kind {
            StepKind::Do => Some(&def.name),
            StepKind::Compensate => def.compensation.as_ref(),
        };
        let generation = self.context.generation;
        let order = &self.fence.order_id;
        let mut differs = Vec::new();
        if self.step != def.name {
            differs.push("step");
        }
        if def.queue.as_str() != queue {
            differs.push("queue");
        }
        if action != Some(&self.action) {
            differs.push("action");
        }
        if self.timeout_ms != def.timeout_ms {
            differs.push("timeout_ms");
        }
        if self.retry != def.retry {
            differs.push("retry");
        }
        let probe = def.probe.as_ref().filter(|_| self.kind == StepKind::Do);
        if self.probe.as_ref() != probe {
            differs.push("probe");
        }
        if self.idempotency_key != idempotency_key(order, generation, self.step_index, &self.action)
        {
            differs.push("idempotency_key");
        }
        let compensates = (self.kind == StepKind::Compensate && generation > 0)
            .then(|| idempotency_key(order, generation, self.step_index, &def.name));
        if self.compensates.is_some() && self.compensates != compensates {
            differs.push("compensates");
        }
        if differs.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} not what workflow {} says for step {} ({}) on {queue}",
                differs.join(", "),
                flow.reference(),
                self.step_index,
                def.name
            ))
        }
    }

    /// The message id: one per action, order and ownership term.
    pub fn message_id(&self) -> String {
        format!(
            "req:{}:{}:{}:{}",
            self.fence.order_id,
            self.step_index,
            kind_letter(self.kind),
            self.fence.epoch
        )
    }
}

fn kind_letter(kind: StepKind) -> char {
    match kind {
        StepKind::Do => 'd',
        StepKind::Compensate => 'c',
    }
}

/// How an action ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum StepOutcome {
    /// Done; the remote service's answer.
    Succeeded {
        /// What the remote service said.
        detail: String,
    },
    /// Failed permanently; retrying will not help.
    Failed {
        /// Why.
        error: String,
    },
    /// Not done: the remote service is down (as the fleet sees it, or this agent's
    /// circuit breaker is open), so the order waits for it instead of running into its
    /// deadline. Neither a success nor a failure: nothing is counted.
    Deferred {
        /// The service it waits for (the agent queue).
        service: String,
        /// Why, for the order's history.
        reason: String,
    },
}

/// An agent's answer to a [`StepRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepReply {
    /// The fence of the request.
    pub fence: Fence,
    /// The step's position.
    pub step_index: i32,
    /// The step's name.
    pub step: String,
    /// The action performed.
    pub action: String,
    /// Do or undo.
    pub kind: StepKind,
    /// How it ended.
    pub outcome: StepOutcome,
    /// The agent that answered.
    pub agent: InstanceId,
    /// When the agent decided to answer (its clock); never after `complete_by`.
    pub replied_at: DateTime<Utc>,
    /// The deadline the request carried.
    pub complete_by: DateTime<Utc>,
    /// Remote calls made for this request.
    pub attempts: u32,
    /// The request's context, echoed.
    pub context: StepContext,
}

impl StepReply {
    /// The message id: one per action, order and term, so a repeated reply (an agent
    /// that crashed after replying) is dropped.
    pub fn message_id(&self) -> String {
        format!(
            "rep:{}:{}:{}:{}",
            self.fence.order_id,
            self.step_index,
            kind_letter(self.kind),
            self.fence.epoch
        )
    }
}

/// What a status notification says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// The order was accepted.
    Received,
    /// A scheduler started working on it.
    Processing,
    /// One step is done.
    StepDone,
    /// Every step is done.
    Completed,
    /// It ended in Error.
    Failed,
    /// It was cancelled.
    Cancelled,
}

impl OrderStatus {
    /// The name used in message ids and shown to people (`step_done`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Received => "received",
            OrderStatus::Processing => "processing",
            OrderStatus::StepDone => "step_done",
            OrderStatus::Completed => "completed",
            OrderStatus::Failed => "failed",
            OrderStatus::Cancelled => "cancelled",
        }
    }
}

/// A status notification sent to the client's reply queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusNotice {
    /// The order.
    pub order_id: OrderId,
    /// What happened.
    pub status: OrderStatus,
    /// The step concerned, for `step_done` (and `failed`, where known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// More, e.g. the error for `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl StatusNotice {
    /// The envelope for the client's queue `reply_to`, or `None` when the order has
    /// none or it is not a valid queue name (kept from being sent, and logged by the
    /// caller). `discriminator` makes the id unique per occurrence (e.g. the epoch and
    /// step index).
    pub fn envelope(&self, reply_to: Option<&str>, discriminator: &str) -> Option<Envelope> {
        let queue = QueueName::parse(reply_to?).ok()?;
        let id = format!(
            "st:{}:{}:{}",
            self.order_id,
            self.status.as_str(),
            discriminator
        );
        Some(Envelope {
            queue,
            message: json_message(id, self, Some(self.order_id.as_str())),
        })
    }
}

/// An operator alert as sent to the alerts queue.
pub type AlertMessage = crate::store::Alert;

/// A JSON message with an id and a correlation id, carrying the current span's trace
/// context when a [`crate::tracecontext::Propagator`] is installed.
pub fn json_message<T: Serialize>(
    message_id: String,
    body: &T,
    correlation_id: Option<&str>,
) -> OutgoingMessage {
    // Serializing these plain structs cannot fail; an empty body would be refused by
    // the consumer and dead-lettered, never lost.
    let body = serde_json::to_vec(body).unwrap_or_default();
    let mut m = OutgoingMessage::new(message_id, body);
    m.correlation_id = correlation_id.map(str::to_owned);
    // The span it is built in continues in whoever receives it (when traces are exported).
    crate::tracecontext::inject_current(&mut m.properties);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Epoch;

    #[test]
    fn message_ids_fit_the_transport_limit_for_the_longest_names() {
        let order_id = OrderId::parse("o".repeat(crate::id::MAX_ORDER_ID_LEN)).unwrap();
        let fence = Fence {
            order_id: order_id.clone(),
            owner: InstanceId::generate("scheduler"),
            epoch: Epoch(i64::MAX),
        };
        let id = format!("rep:{}:{}:c:{}", fence.order_id, i32::MAX, fence.epoch);
        assert!(id.len() <= 128, "{} characters", id.len());
        let notice = StatusNotice {
            order_id,
            status: OrderStatus::StepDone,
            step: Some("s".repeat(crate::workflow::MAX_STEP_NAME_LEN)),
            detail: None,
        };
        let env = notice
            .envelope(Some("client-1"), &format!("{}.{}", i64::MAX, i32::MAX))
            .unwrap();
        assert!(env.message.message_id.len() <= 128);
        assert!(notice.envelope(Some("bad queue!"), "1").is_none());
        assert!(notice.envelope(None, "1").is_none());
    }

    #[test]
    fn a_fence_or_an_outcome_with_a_field_no_version_sends_is_refused() {
        let fence = Fence {
            order_id: OrderId::parse("o-1").unwrap(),
            owner: InstanceId::generate("scheduler"),
            epoch: Epoch(3),
        };
        let mut value = serde_json::to_value(&fence).unwrap();
        assert_eq!(
            serde_json::from_value::<Fence>(value.clone()).unwrap(),
            fence
        );
        value["owner_override"] = "scheduler-x".into();
        assert!(serde_json::from_value::<Fence>(value).is_err());

        let outcome = StepOutcome::Succeeded {
            detail: "ok".into(),
        };
        let mut value = serde_json::to_value(&outcome).unwrap();
        assert_eq!(
            serde_json::from_value::<StepOutcome>(value.clone()).unwrap(),
            outcome
        );
        value["notify_to"] = "elsewhere".into();
        let e = serde_json::from_value::<StepOutcome>(value).unwrap_err();
        assert!(e.to_string().contains("notify_to"), "{e}");
    }
}
