//! The state-store ports: one small trait per role that uses the store.
//!
//! Every operation is atomic: the state row, the step records and the history entry it
//! writes commit together or not at all, and so do the messages it causes (`sends`):
//! they are enqueued in the same transaction, so a state change is never committed
//! without the messages it implies, nor a message sent for a change that did not happen. Every write by a scheduler is fenced by
//! `(order, owner, epoch)`: a deposed owner gets [`Error::Fenced`] and changes nothing.
//!
//! [`Error::Fenced`]: crate::Error::Fenced

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Result, ValidationError};
use crate::history::HistoryEvent;
use crate::id::{Actor, InstanceId, OrderId};
use crate::order::OrderDetails;
use crate::state::{Epoch, Fence, ProcessState, StateRow};
use crate::step::{StepRecord, StepStatus};
use crate::transport::{Envelope, ReceivedMessage};

/// Longest reply-queue name accepted.
pub const MAX_REPLY_TO_LEN: usize = 260;
/// Longest free text (error, reason, step detail) stored; longer text is cut.
pub const MAX_TEXT_LEN: usize = 4_000;
/// Most orders one claim, sweep or page may return.
pub const MAX_BATCH: u32 = 10_000;

/// An order accepted from the orders queue. A field it does not know (a misspelt
/// `workflow`, say) makes the message invalid rather than silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// The client's id for it.
    pub order_id: OrderId,
    /// What was ordered.
    pub details: OrderDetails,
    /// Where to send status notifications, if anywhere.
    pub reply_to: Option<String>,
    /// The workflow to run it under (by name); `None`: the schedulers' default. The
    /// order is pinned to that workflow's version when it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
}

impl NewOrder {
    /// Checks what `OrderDetails` cannot: the reply queue's name and the workflow name.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(w) = &self.workflow {
            crate::workflow::check_workflow_name("workflow", w)?;
        }
        if let Some(q) = &self.reply_to {
            if q.is_empty() || q.len() > MAX_REPLY_TO_LEN || q.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    "reply_to",
                    format!("must be 1 to {MAX_REPLY_TO_LEN} printable characters"),
                ));
            }
            // Notices sent there would land among orderly's own messages.
            if is_internal_queue(q) {
                return Err(ValidationError::new(
                    "reply_to",
                    format!(
                        "{q:?} is one of orderly's own queues (orders, replies, alerts, agent.*): \
                         name the client's own queue"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Which queues an order may name as its `reply_to`: any but orderly's own (the
/// default), or, where the deployment sets a prefix, only the queues whose names start
/// with it (`client-`, say), so an order cannot have notices sent to a queue another
/// system reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyQueues {
    prefix: Option<String>,
}

impl ReplyQueues {
    /// Any queue but orderly's own.
    pub fn any() -> Self {
        Self::default()
    }

    /// Only queues whose names start with `prefix`: 1 to 100 characters a queue name
    /// may hold, not a prefix of orderly's own queues; `setting` names the setting in
    /// the refusal.
    pub fn prefixed(prefix: &str, setting: &'static str) -> Result<Self> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/');
        if prefix.is_empty() || prefix.len() > 100 || !prefix.chars().all(allowed) {
            return Err(ValidationError::new(
                setting,
                "must be 1 to 100 letters, digits, '-', '_', '.' or '/' (the start of the clients' queue names)",
            )
            .into());
        }
        if is_internal_queue(prefix) || is_internal_prefix(prefix) {
            return Err(ValidationError::new(
                setting,
                format!(
                    "{prefix:?} is the start of orderly's own queues: name the clients' prefix"
                ),
            )
            .into());
        }
        Ok(Self {
            prefix: Some(prefix.to_owned()),
        })
    }

    /// The prefix, if one is set.
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// `order` as [`NewOrder::validate`] checks it, and its `reply_to`, if any, one of
    /// these queues.
    pub fn check(&self, order: &NewOrder) -> std::result::Result<(), ValidationError> {
        order.validate()?;
        if let (Some(prefix), Some(q)) = (&self.prefix, &order.reply_to)
            && !q.starts_with(prefix.as_str())
        {
            return Err(ValidationError::new(
                "reply_to",
                format!(
                    "{q:?} is not a client queue here: reply queues must start with {prefix:?}"
                ),
            ));
        }
        Ok(())
    }
}

/// Whether `prefix` starts every name of some of orderly's own queues (`agent`,
/// `ord`): a reply prefix like that would let orders name them.
fn is_internal_prefix(prefix: &str) -> bool {
    use crate::messages::queues::{ALERTS, ORDERS, REPLIES};
    let p = prefix.to_ascii_lowercase();
    [ORDERS, REPLIES, ALERTS, "agent."]
        .iter()
        .any(|q| q.starts_with(&p))
}

/// Whether `queue` is one of orderly's own: the fixed queues and the agents' step
/// queues (`agent.*`, the convention every workflow here follows), compared without case.
pub fn is_internal_queue(queue: &str) -> bool {
    use crate::messages::queues::{ALERTS, ORDERS, REPLIES};
    let q = queue.to_ascii_lowercase();
    [ORDERS, REPLIES, ALERTS].contains(&q.as_str()) || q.starts_with("agent.")
}

/// What `submit` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// The order is new and now Pending.
    Accepted,
    /// The same order (same id, same details) was already there; nothing changed.
    Duplicate,
}

/// One order of a [`IntakeStore::submit_many`] batch, with the messages its
/// acceptance causes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The order.
    pub order: NewOrder,
    /// Sent if, and only if, the order is new.
    pub sends: Vec<Envelope>,
}

/// A batch's outcomes, item by item, and whether each item's message was consumed:
/// deleted from its queue in the batch's own transaction, so the state change and the
/// end of the message that asked for it commit together (exactly once on a queue that
/// lives in the store's database). A message not consumed is the caller's to settle.
#[derive(Debug)]
pub struct Consumed<T> {
    /// Per item, as the batch call without messages returns them.
    pub outcomes: Vec<T>,
    /// Per item: its message is settled; the caller must not settle it again.
    pub consumed: Vec<bool>,
}

impl<T> Consumed<T> {
    /// Outcomes with no message consumed (a store that holds no queue).
    pub fn none(outcomes: Vec<T>) -> Self {
        Self {
            consumed: vec![false; outcomes.len()],
            outcomes,
        }
    }
}

/// Messages received and acted on in one transaction
/// ([`SchedulerStore::take_and_record`], [`IntakeStore::take_and_submit`]).
#[derive(Debug)]
pub struct Taken<T = ()> {
    /// Every message received, in queue order. Those without a verdict in `recorded`
    /// are held by the caller, to apply or settle as after a receive.
    pub messages: Vec<ReceivedMessage>,
    /// Per message: `None` when nothing was planned for it; else the outcome of what
    /// was (applied, or why it was refused) and whether its message was consumed with
    /// it (a message not consumed is the caller's to settle).
    pub recorded: Vec<Option<(Result<T>, bool)>>,
}

impl<T> Taken<T> {
    /// `messages` held by the caller, nothing done with them.
    pub fn held(messages: Vec<ReceivedMessage>) -> Self {
        let recorded = messages.iter().map(|_| None).collect();
        Self { messages, recorded }
    }
}

/// Refuses a batch whose messages are not one per item.
pub fn check_consuming(items: usize, messages: &[ReceivedMessage]) -> Result<()> {
    if items == messages.len() {
        Ok(())
    } else {
        Err(ValidationError::new(
            "messages",
            format!(
                "one message per item: {items} items, {} messages",
                messages.len()
            ),
        )
        .into())
    }
}

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

/// Where a page of orders starts: after this order (in creation order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The last order's creation time.
    pub created_at: DateTime<Utc>,
    /// The last order's id.
    pub order_id: OrderId,
}

/// Which orders to list, oldest first.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    /// Only orders in this state.
    pub state: Option<ProcessState>,
    /// Only orders whose last error contains this text (case-insensitive).
    pub error_contains: Option<String>,
    /// Only orders whose current step is this one.
    pub current_step: Option<i32>,
    /// Only orders created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only orders waiting (Pending, held) for this service to be back.
    pub waiting_for: Option<String>,
    /// Only orders of this customer (`customer_id` in their details).
    pub customer: Option<String>,
    /// Only orders whose id starts with this.
    pub id_prefix: Option<String>,
    /// Page size (1 to [`MAX_BATCH`]; 0 means 50).
    pub limit: u32,
    /// Continue after this cursor.
    pub after: Option<Cursor>,
}

/// One page of orders.
#[derive(Debug, Clone)]
pub struct Page {
    /// The orders, oldest first.
    pub orders: Vec<StateRow>,
    /// Where the next page starts, if there may be one.
    pub next: Option<Cursor>,
}

/// Everything known about one order.
#[derive(Debug, Clone)]
pub struct OrderView {
    /// The state row.
    pub state: StateRow,
    /// What was ordered.
    pub details: OrderDetails,
    /// Its steps, by position.
    pub steps: Vec<StepRecord>,
    /// Its history, oldest first.
    pub history: Vec<HistoryEvent>,
}

impl OrderView {
    /// How many entries of its history are of `kind`.
    pub fn history_count(&self, kind: crate::history::HistoryKind) -> usize {
        self.history.iter().filter(|e| e.kind == kind).count()
    }
}

/// Accepting orders (the submitter).
#[async_trait]
pub trait IntakeStore: Send + Sync {
    /// Inserts the order details, its Pending state row and its first history entry
    /// (naming `actor`, e.g. the submitter instance) in one transaction. The same order
    /// again is a `Duplicate` no-op; the same id with other details is
    /// [`crate::Error::OrderIdConflict`].
    /// `sends` are enqueued with it (and not for a duplicate).
    async fn submit(
        &self,
        order: &NewOrder,
        actor: &Actor,
        sends: &[Envelope],
    ) -> Result<SubmitOutcome>;

    /// [`IntakeStore::submit`] for a batch, in one transaction: each order gets its
    /// own outcome (an invalid order or an id conflict fails alone); a failure to
    /// enqueue the messages fails the whole batch and commits nothing.
    async fn submit_many(
        &self,
        batch: &[Submission],
        actor: &Actor,
    ) -> Result<Vec<Result<SubmitOutcome>>>;

    /// Receives up to `max` messages from `queue` (waiting up to `wait` for the first)
    /// and, in the same transaction, records the submission `plan` gives for each, as
    /// [`IntakeStore::submit_many`] under `actor`, ending the message of each order
    /// accepted or found a duplicate. `None` from a store whose database does not hold
    /// that queue (the default, and a store on the outbox): the caller receives and
    /// submits separately.
    async fn take_and_submit(
        &self,
        queue: &crate::transport::QueueName,
        max: u32,
        wait: Duration,
        actor: &Actor,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<Submission> + Send + Sync),
    ) -> Result<Option<Taken<SubmitOutcome>>> {
        let _ = (queue, max, wait, actor, plan);
        Ok(None)
    }

    /// [`IntakeStore::submit_many`] where `messages[i]` carried `batch[i]`: a store
    /// whose database also holds the queue they came from deletes, in the same
    /// transaction, the message of each order that was `Accepted` or a `Duplicate`
    /// (still held by this delivery); the others, and all of them on a store that holds
    /// no queue (the default), are the caller's to settle.
    async fn submit_consuming(
        &self,
        batch: &[Submission],
        actor: &Actor,
        messages: &[ReceivedMessage],
    ) -> Result<Consumed<Result<SubmitOutcome>>> {
        check_consuming(batch.len(), messages)?;
        Ok(Consumed::none(self.submit_many(batch, actor).await?))
    }
}

/// Owning and advancing orders (the scheduler). Every write is fenced.
#[async_trait]
pub trait SchedulerStore: Send + Sync {
    /// Claims up to `limit` Pending, unlocked orders whose next attempt is due, oldest
    /// first: each becomes Processing, locked by the caller until now + timeout, with
    /// its epoch raised by one. No order is ever given to two claimers.
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedOrder>>;

    /// Waits until orders may have become claimable (submitted, released, sent back to
    /// Pending) since `*seen`, a count it keeps up to date (start at 0), or until
    /// `within` passes: a claimer that found nothing waits here instead of polling. A
    /// store that cannot tell waits `within`.
    async fn wait_claimable(&self, seen: &mut u64, within: Duration) {
        let _ = seen;
        tokio::time::sleep(within).await;
    }

    /// [`SchedulerStore::claim`], and in the same transaction the write `plan` gives
    /// for each order claimed (its first step started and its request enqueued), so a
    /// claim and its first request commit together or not at all. Returns each order
    /// and whether its planned write was applied (`false`: `plan` gave none, e.g. an
    /// order to be undone, left to the caller).
    async fn claim_and_start(
        &self,
        request: &ClaimRequest,
        plan: &(dyn for<'c> Fn(&'c ClaimedOrder) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Vec<(ClaimedOrder, bool)>>;

    /// Records a step's progress (and moves `current_step` past it on success), with
    /// the messages it causes (the step request, the next one, a status notification).
    async fn record_step(
        &self,
        fence: &Fence,
        step: &StepUpdate,
        sends: &[Envelope],
    ) -> Result<StepRecord>;

    /// Pushes the deadline to now + `by` (a heartbeat). Returns the new deadline.
    async fn extend(&self, fence: &Fence, by: Duration) -> Result<DateTime<Utc>>;

    /// Marks orders Processed and unlocks them, in one transaction, each with its
    /// messages. Fences that no longer hold are refused one by one (their messages are
    /// not sent); the others complete.
    async fn complete_many(&self, completions: &[Completion]) -> Result<BatchOutcome>;

    /// Marks one order Processed and unlocks it, sending `sends`.
    async fn complete(&self, fence: &Fence, sends: &[Envelope]) -> Result<()> {
        let completion = Completion {
            fence: fence.clone(),
            sends: sends.to_vec(),
        };
        let mut outcome = self
            .complete_many(std::slice::from_ref(&completion))
            .await?;
        match outcome.refused.pop() {
            Some((_, error)) => Err(error),
            None => Ok(()),
        }
    }

    /// The owner finished undoing an order (every step that could be undone is): it
    /// ends in Error with `error`, unless an operator's retry waits for the undoing
    /// (the order had stopped half undone when it was retried): then the retry's fresh
    /// run starts, Pending from the first step, and its generation is returned.
    async fn finish_undone(&self, fence: &Fence, error: &str) -> Result<Option<i32>>;

    /// Gives up on an order: Error, with the reason kept as its last error, sending
    /// `sends` (the failure notification, the operator alert).
    async fn fail(&self, fence: &Fence, error: &str, sends: &[Envelope]) -> Result<()>;

    /// Hands an order back unfinished (Pending, unlocked, not counted as a failure),
    /// e.g. when the scheduler shuts down.
    async fn release(&self, fence: &Fence, reason: &str) -> Result<()>;

    /// Parks orders whose next request is for a service that is down, in one
    /// transaction: each, if its fence (and step) still hold, goes Pending, unlocked,
    /// marked as waiting for the service and not counted as a failure, held until the
    /// service is back ([`crate::service::Parked::Held`]), or claimable at once if the
    /// store finds the service up again ([`crate::service::Parked::Released`]). The
    /// result says, park by park, what happened or why it was refused.
    async fn park_many(
        &self,
        parks: &[crate::service::Park],
    ) -> Result<Vec<Result<crate::service::Parked>>>;

    /// Applies a batch of step writes in one transaction. Each write is fenced (and
    /// step-guarded) on its own: the result says, write by write, whether it was
    /// applied or why it was refused (refused writes change nothing and send nothing).
    async fn record_steps(&self, writes: &[StepWrite]) -> Result<Vec<Result<()>>>;

    /// [`SchedulerStore::record_steps`] where `messages[i]` asked for `writes[i]` (the
    /// agent's reply): a store whose database also holds the queue they came from
    /// deletes, in the same transaction, the message of each write that was applied
    /// or refused for good (a retryable refusal keeps its message); the others, and
    /// all of them on a store that holds no queue (the default), are the caller's to
    /// settle.
    async fn record_steps_consuming(
        &self,
        writes: &[StepWrite],
        messages: &[ReceivedMessage],
    ) -> Result<Consumed<Result<()>>> {
        check_consuming(writes.len(), messages)?;
        Ok(Consumed::none(self.record_steps(writes).await?))
    }

    /// Receives up to `max` messages from `queue` (waiting up to `wait` for the first)
    /// and, in the same transaction, applies the step write `plan` gives for each
    /// (fenced and step-guarded as in [`SchedulerStore::record_steps`]), ending the
    /// message of each write applied or refused for good: a reply is taken, recorded
    /// and its next request sent in one commit. `None` from a store whose database
    /// does not hold that queue (the default, and a store on the outbox): the caller
    /// receives and records separately.
    async fn take_and_record(
        &self,
        queue: &crate::transport::QueueName,
        max: u32,
        wait: Duration,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Option<Taken>> {
        let _ = (queue, max, wait, plan);
        Ok(None)
    }

    /// Takes back, under a new epoch, the Processing orders still locked by `owner`
    /// whose deadline has not passed: what a scheduler restarting with the same
    /// instance id does, so its earlier incarnation is fenced out.
    async fn resume_owned(&self, owner: &InstanceId) -> Result<Vec<ClaimedOrder>>;

    /// Marks the order as being undone: its completed steps get compensated before it
    /// ends in `finish_as` (Error or Cancelled). Sends `sends` with it.
    async fn begin_compensation(
        &self,
        fence: &Fence,
        finish_as: ProcessState,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<()>;

    /// Ends a cancel-requested order, its steps undone: Cancelled, unlocked.
    async fn finish_cancelled(&self, fence: &Fence, reason: &str, sends: &[Envelope])
    -> Result<()>;

    /// The step records of one order, by position.
    async fn steps(&self, order_id: &OrderId) -> Result<Vec<StepRecord>>;

    /// Counts the live (Pending and Processing) orders by workflow, version and state:
    /// which versions still have orders in flight (an earlier version's schedulers
    /// can be retired once it has none), and which orders wait for a scheduler that
    /// runs their workflow.
    async fn workflows_in_flight(&self) -> Result<Vec<WorkflowCount>>;

    /// Stores the definition of each of `workflows` not stored yet, as first seen now by
    /// `by`; how many it added. A stored version is never changed.
    async fn record_workflows(
        &self,
        workflows: &[std::sync::Arc<crate::workflow::Workflow>],
        by: &str,
    ) -> Result<usize>;

    /// Every stored workflow version (see [`Self::record_workflows`]), oldest first.
    async fn stored_workflows(&self) -> Result<Vec<StoredWorkflow>>;

    /// How many orders `owner` holds (Processing, locked by it): a scheduler claims no
    /// more while it holds its maximum, so orders do not wait out their deadline in
    /// the agents' queues.
    async fn count_owned(&self, owner: &InstanceId) -> Result<i64>;

    /// The fences of the Processing orders `owner` holds (to hand them back with
    /// [`SchedulerStore::release`] when it stops).
    async fn owned(&self, owner: &InstanceId) -> Result<Vec<Fence>>;
}

/// Finding and recovering timed-out work (the supervisor).
#[async_trait]
pub trait SupervisorStore: Send + Sync {
    /// Processing orders whose deadline has passed, most overdue first.
    async fn find_expired(&self, limit: u32) -> Result<Vec<Expired>>;

    /// Recovers up to `limit` expired orders: failure count + 1 and back to Pending
    /// after a back-off, or Error at the threshold. An expiry is counted once however
    /// many supervisors race on it. Refused ([`crate::Error::Deposed`]) unless
    /// `leader`'s term is the current one.
    async fn recover_expired(
        &self,
        leader: &crate::leader::LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<RecoveryOutcome>>;

    /// Alerts not yet published to the alerts queue, oldest first.
    async fn unpublished_alerts(&self, limit: u32) -> Result<Vec<Alert>>;

    /// Publishes these alerts: marks them and enqueues `sends` (the alert messages and
    /// the clients' `failed` notices) in the same transaction, so nothing is published
    /// unless `leader`'s term is still the current one ([`crate::Error::Deposed`]
    /// otherwise, and nothing is sent). Returns the ones this call marked (not already
    /// marked by another publisher), so each is logged once.
    async fn mark_alerts_published(
        &self,
        leader: &crate::leader::LeaderFence,
        alert_ids: &[i64],
        sends: &[Envelope],
    ) -> Result<Vec<i64>>;

    /// Removes what `retention` lets go, in short transactions of at most
    /// `retention.batch` orders (or rows) each, so the hot path never waits long behind
    /// it: orders finished (Processed or Cancelled) longer than `retention.keep` ago
    /// (on the store's clock) with their steps, history and alerts; queue dead letters
    /// and outbox rows sent or dead-lettered longer ago than that; and expired
    /// duplicate-detection rows. Orders in Error and live orders are never touched.
    /// With `dry_run`, counts what would go and removes nothing.
    async fn prune(&self, retention: &Retention, dry_run: bool) -> Result<Pruned>;

    /// Reclaims, in the tables whose rows turn over fastest (queue messages, order
    /// state and steps, the outbox), the row versions that updates and deletes left
    /// behind, where the database keeps them until a vacuum (PostgreSQL) and at least
    /// [`TIDY_MIN_DEAD`] rows (and a tenth of the live ones) have piled up in a table.
    /// Every scan in order reads past them (the queue's take, the claim, the sweep),
    /// so their cost grows with the work done since the last vacuum, and the
    /// database's own autovacuum looks once a minute at best. A table another vacuum is
    /// working on is skipped. Returns the tables vacuumed; none where the database
    /// reclaims as it goes (SQLite).
    async fn tidy(&self) -> Result<Vec<Vacuumed>>;
}

/// Fewest left-behind row versions in a table for [`SupervisorStore::tidy`] to vacuum it.
pub const TIDY_MIN_DEAD: u64 = 1_000;

/// A table [`SupervisorStore::tidy`] vacuumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vacuumed {
    /// The table.
    pub table: String,
    /// Row versions left behind that the database counted before the vacuum.
    pub dead_rows: u64,
}

/// Looking at and repairing orders (operators).
#[async_trait]
pub trait OperatorStore: Send + Sync {
    /// Lists orders matching `filter`, oldest first, one page at a time.
    async fn list(&self, filter: &OrderFilter) -> Result<Page>;

    /// One order with its details, steps and history.
    async fn get(&self, order_id: &OrderId) -> Result<OrderView>;

    /// Whether the store answers: one statement that reads no table (readiness probes).
    async fn ping(&self) -> Result<()>;

    /// The store's own time: the database server's clock where deadlines are set on
    /// it (PostgreSQL), the host's for an embedded database; a role measures how far
    /// its host's clock is off with it.
    async fn store_now(&self) -> Result<DateTime<Utc>>;

    /// Counts orders by state.
    async fn count_by_state(&self) -> Result<Vec<(ProcessState, i64)>>;

    /// The activity of every minute from the one `since` falls in, oldest first
    /// (minutes without any are left out): finished orders by outcome with their
    /// latencies, recoveries, dead letters.
    async fn activity(&self, since: DateTime<Utc>) -> Result<Vec<crate::activity::MinuteActivity>>;

    /// How many orders finished (reached Processed, Error or Cancelled, and are still
    /// there) at or after `since`, by final state: the throughput an operator sees.
    /// Every final state is listed, zero or not.
    async fn finished_since(&self, since: DateTime<Utc>) -> Result<Vec<(ProcessState, i64)>>;

    /// Moves up to `limit` orders in `states` (Pending or Error; an order in
    /// Processing finishes on the version it runs) pinned to `from` to version `to`
    /// of the same workflow, each with a `VersionMoved` history entry, and returns
    /// them. Both versions must be stored, and compatible
    /// ([`crate::workflow::Workflow::compatible_with`]): anything else is refused
    /// before any order moves. Call again until fewer than `limit` come back.
    async fn move_version(
        &self,
        from: &crate::workflow::WorkflowRef,
        to: &crate::workflow::WorkflowRef,
        states: &[ProcessState],
        actor: &Actor,
        reason: &str,
        limit: u32,
    ) -> Result<Vec<OrderId>>;

    /// Sends an Error order round again: Pending, failure count reset, due at once.
    /// Steps already done stay done.
    async fn resubmit(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow>;

    /// Cancels an order the way a user expects: if any of its steps may have taken
    /// effect, it goes back to Pending marked to be undone (a scheduler compensates
    /// the steps in reverse order, then ends it Cancelled); otherwise it is Cancelled
    /// at once. A scheduler still working on it is fenced out from this moment. An
    /// order past the point of no return (a step that can never be undone may have
    /// taken effect) is not undone: the scheduler that claims it ends it in Error for
    /// repair by hand, saying why.
    async fn request_cancel(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow>;

    /// Alerts, newest first; with `open_only`, those not yet acknowledged.
    async fn alerts(&self, open_only: bool, limit: u32) -> Result<Vec<Alert>>;

    /// Acknowledges an alert ("an operator has seen it"); acknowledging again keeps the
    /// first acknowledgement. `None` if there is no such alert.
    async fn acknowledge_alert(&self, alert_id: i64, by: &Actor) -> Result<Option<Alert>>;

    /// Cancels a Pending, Processing or Error order at once, without compensation. A
    /// scheduler still working on it is fenced out from this moment.
    async fn cancel(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow>;
}

/// What retention keeps: see [`SupervisorStore::prune`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long finished orders (and sent or dead-lettered messages) are kept.
    pub keep: std::time::Duration,
    /// Most orders (or rows) removed per transaction.
    pub batch: u32,
}

/// What a prune removed (or, dry, would remove), by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Finished orders.
    pub orders: u64,
    /// Their steps.
    pub steps: u64,
    /// Their history entries.
    pub history: u64,
    /// Their alerts.
    pub alerts: u64,
    /// Dead letters of the SQL queues.
    pub dead_letters: u64,
    /// Outbox rows already sent, or dead-lettered.
    pub outbox: u64,
    /// Expired duplicate-detection rows.
    pub dedup: u64,
}

impl Pruned {
    /// Whether nothing was (or would be) removed.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A workflow version as the store keeps it: its definition (JSON), written the first
/// time the version was used, never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWorkflow {
    /// Which version.
    pub reference: crate::workflow::WorkflowRef,
    /// The definition, as [`crate::workflow::Workflow::to_stored`] writes it.
    pub definition: String,
    /// When it was first stored.
    pub first_seen_at: DateTime<Utc>,
    /// Who stored it (a scheduler's instance id, or `operator:...` for `orderly migrate`).
    pub first_seen_by: String,
}

impl StoredWorkflow {
    /// The workflow it defines, checked: valid, and of the version it is stored as.
    pub fn workflow(&self) -> Result<crate::workflow::Workflow, ValidationError> {
        crate::workflow::Workflow::from_stored(&self.definition, &self.reference)
    }
}

/// Live orders of one workflow version in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowCount {
    /// The workflow asked for (`None`: the schedulers' default).
    pub workflow: Option<String>,
    /// The version pinned (`None`: not started yet).
    pub version: Option<String>,
    /// Pending or Processing.
    pub state: ProcessState,
    /// How many orders.
    pub orders: i64,
}

impl WorkflowCount {
    /// `name@version`, or the name alone before the orders started.
    pub fn label(&self) -> String {
        crate::workflow::label(self.workflow.as_deref(), self.version.as_deref())
    }
}

/// The whole state store.
pub trait StateStore:
    IntakeStore
    + SchedulerStore
    + SupervisorStore
    + OperatorStore
    + crate::leader::LeadershipStore
    + crate::service::ServiceStore
    + crate::conditions::ConditionStore
{
}

impl<T> StateStore for T where
    T: IntakeStore
        + SchedulerStore
        + SupervisorStore
        + OperatorStore
        + crate::leader::LeadershipStore
        + crate::service::ServiceStore
        + crate::conditions::ConditionStore
{
}

/// Orders moved per transaction by [`move_version_all`].
pub const MOVE_BATCH: u32 = 500;

/// Moves every order [`OperatorStore::move_version`] would, batch after batch (each
/// its own transaction, so a run cut short is taken up by running it again), telling
/// `progress` the count so far after each full batch; returns how many moved.
pub async fn move_version_all(
    store: &dyn OperatorStore,
    from: &crate::workflow::WorkflowRef,
    to: &crate::workflow::WorkflowRef,
    states: &[ProcessState],
    actor: &Actor,
    reason: &str,
    progress: &mut (dyn FnMut(usize) + Send),
) -> Result<usize> {
    let mut moved = 0;
    loop {
        let batch = store
            .move_version(from, to, states, actor, reason, MOVE_BATCH)
            .await?;
        moved += batch.len();
        if batch.len() < MOVE_BATCH as usize {
            return Ok(moved);
        }
        progress(moved);
    }
}

/// Cuts free text to [`MAX_TEXT_LEN`] bytes on a character boundary.
pub fn bounded_text(text: &str) -> &str {
    if text.len() <= MAX_TEXT_LEN {
        return text;
    }
    let mut end = MAX_TEXT_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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

    /// An order names the client's own queue for notices, never one of orderly's, and
    /// a field it does not know makes it invalid (a misspelt `workflow` is not ignored).
    #[test]
    fn an_order_names_its_own_reply_queue_and_only_known_fields() {
        let mut order: NewOrder = serde_json::from_value(serde_json::json!({
            "order_id": "o-1",
            "details": {"customer_id": "c-1", "currency": "EUR",
                        "lines": [{"sku": "A", "quantity": 1, "unit_price_minor": 100}]},
            "reply_to": "client-7",
        }))
        .unwrap();
        order.validate().unwrap();
        for internal in [
            "orders",
            "replies",
            "alerts",
            "agent.payment",
            "Agent.Inventory",
            "REPLIES",
        ] {
            order.reply_to = Some(internal.into());
            let e = order.validate().unwrap_err();
            assert!(e.to_string().contains("reply_to"), "{internal}: {e}");
        }
        let misspelt = serde_json::from_value::<NewOrder>(serde_json::json!({
            "order_id": "o-1",
            "details": {"customer_id": "c-1", "currency": "EUR",
                        "lines": [{"sku": "A", "quantity": 1, "unit_price_minor": 100}]},
            "reply_to": null,
            "worklfow": "gift",
        }))
        .unwrap_err();
        assert!(misspelt.to_string().contains("worklfow"), "{misspelt}");
    }

    /// With a prefix set, an order's reply queue must start with it; a prefix that
    /// would let orders name orderly's own queues is refused, naming the setting.
    #[test]
    fn a_reply_prefix_limits_reply_queues_to_the_clients_own() {
        let mut order: NewOrder = serde_json::from_value(serde_json::json!({
            "order_id": "o-1",
            "details": {"customer_id": "c-1", "currency": "EUR",
                        "lines": [{"sku": "A", "quantity": 1, "unit_price_minor": 100}]},
            "reply_to": "client-7",
        }))
        .unwrap();
        let any = ReplyQueues::any();
        let clients = ReplyQueues::prefixed("client-", "ORDERLY_REPLY_TO_PREFIX").unwrap();
        any.check(&order).unwrap();
        clients.check(&order).unwrap();
        order.reply_to = Some("billing-events".into());
        any.check(&order).unwrap();
        let e = clients.check(&order).unwrap_err();
        assert!(
            e.to_string().contains("reply_to") && e.to_string().contains("\"client-\""),
            "{e}"
        );
        order.reply_to = None;
        clients.check(&order).unwrap();
        // Orderly's own queues stay refused whatever the prefix.
        order.reply_to = Some("replies".into());
        assert!(any.check(&order).is_err());
        for bad in ["", "agent", "agent.", "Ord", "r", "client 7", "c\u{202e}"] {
            let e = ReplyQueues::prefixed(bad, "ORDERLY_REPLY_TO_PREFIX").unwrap_err();
            assert!(
                e.to_string().contains("ORDERLY_REPLY_TO_PREFIX"),
                "{bad:?}: {e}"
            );
        }
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

    #[test]
    fn bounded_text_cuts_on_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT_LEN);
        let cut = bounded_text(&long);
        assert!(cut.len() <= MAX_TEXT_LEN);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
