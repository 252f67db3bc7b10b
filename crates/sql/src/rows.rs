//! Decoding rows into domain types, once for both dialects.

use orderly_core::history::{HistoryEvent, HistoryKind};
use orderly_core::step::{StepRecord, StepStatus};
use orderly_core::store::ClaimedOrder;
use orderly_core::transport::{DeadLetter, LockToken, QueueName, ReceivedMessage};
use orderly_core::{
    Actor, Epoch, Fence, InstanceId, OrderDetails, OrderId, ProcessState, Result, StateRow,
};

use crate::driver::{FromCol, SqlRow};
use crate::error::{corrupt, db};
use crate::time::Ts;

/// The columns [`Cols::state_row`] reads.
pub(crate) const STATE_COLUMNS: &str = "order_id, locked_by, complete_by, process_state, \
    failure_count, lock_epoch, current_step, next_attempt_at, last_error, reply_to, finish_as, \
    generation, workflow, workflow_version, waiting_on, created_at, updated_at";

/// The columns [`Cols::step_record`] reads.
pub(crate) const STEP_COLUMNS: &str =
    "order_id, step_index, name, status, idempotency_key, attempts, detail, epoch, updated_at";

/// The columns [`Cols::history_event`] reads.
pub(crate) const HISTORY_COLUMNS: &str =
    "seq, order_id, at, actor, kind, from_state, to_state, epoch, step, reason";

/// The columns [`Cols::message`] reads.
pub(crate) const MESSAGE_COLUMNS: &str = "seq, queue, message_id, correlation_id, properties, \
    body, enqueued_at, delivery_count, locked_until";

/// The columns [`Cols::dead_letter`] reads.
pub(crate) const DEAD_LETTER_COLUMNS: &str = "seq, queue, message_id, correlation_id, \
    properties, body, enqueued_at, delivery_count, reason, description, dead_lettered_at";

/// A row to decode, whichever dialect it came from.
pub(crate) struct Cols<'r, R: ?Sized>(pub &'r R);

impl<R: SqlRow + ?Sized> Cols<'_, R> {
    pub fn get<T: FromCol>(&self, col: &str) -> Result<T> {
        T::from_col(self.0, col).map_err(db)
    }

    pub fn ts(&self, col: &str) -> Result<chrono::DateTime<chrono::Utc>> {
        Ok(self.get::<Ts>(col)?.0)
    }

    pub fn opt_ts(&self, col: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        Ok(self.get::<Option<Ts>>(col)?.map(|t| t.0))
    }

    pub fn order_id(&self, col: &str) -> Result<OrderId> {
        OrderId::parse(self.get::<String>(col)?).map_err(|e| corrupt(col, e))
    }

    pub fn state(&self, col: &str) -> Result<ProcessState> {
        self.get::<String>(col)?
            .parse()
            .map_err(|e| corrupt(col, e))
    }

    pub fn opt_state(&self, col: &str) -> Result<Option<ProcessState>> {
        self.get::<Option<String>>(col)?
            .map(|s| s.parse().map_err(|e| corrupt(col, e)))
            .transpose()
    }

    /// An expired order as a sweep finds it (the columns of the dialects' expiry scans,
    /// `find_expired` and `lock_expired`).
    pub fn expired(&self) -> Result<orderly_core::store::Expired> {
        Ok(orderly_core::store::Expired {
            order_id: self.order_id("order_id")?,
            failure_count: self.get("failure_count")?,
            current_step: self.get("current_step")?,
            locked_by: self.get("locked_by")?,
            lock_epoch: Epoch(self.get("lock_epoch")?),
            complete_by: self.ts("complete_by")?,
            finish_as: self.opt_state("finish_as")?,
            in_force: self
                .get::<Option<String>>("in_force")?
                .map(|names| names.split('\n').map(str::to_owned).collect())
                .unwrap_or_default(),
            waiting_for: self.get("waiting_for")?,
        })
    }

    pub fn state_row(&self) -> Result<StateRow> {
        Ok(StateRow {
            order_id: self.order_id("order_id")?,
            locked_by: self
                .get::<Option<String>>("locked_by")?
                .map(InstanceId::parse)
                .transpose()
                .map_err(|e| corrupt("locked_by", e))?,
            complete_by: self.opt_ts("complete_by")?,
            process_state: self.state("process_state")?,
            failure_count: self.get("failure_count")?,
            lock_epoch: Epoch(self.get("lock_epoch")?),
            current_step: self.get("current_step")?,
            next_attempt_at: self.ts("next_attempt_at")?,
            last_error: self.get("last_error")?,
            reply_to: self.get("reply_to")?,
            finish_as: self.opt_state("finish_as")?,
            generation: self.get("generation")?,
            workflow: self.get("workflow")?,
            workflow_version: self.get("workflow_version")?,
            waiting_on: self.get("waiting_on")?,
            created_at: self.ts("created_at")?,
            updated_at: self.ts("updated_at")?,
        })
    }

    /// The workflow version an order is pinned to (columns `workflow`,
    /// `workflow_version`); `None` before its first claim or for an order from before
    /// versions were pinned.
    pub fn workflow_ref(&self) -> Result<Option<orderly_core::workflow::WorkflowRef>> {
        let name: Option<String> = self.get("workflow")?;
        let version: Option<String> = self.get("workflow_version")?;
        match (name, version) {
            (Some(name), Some(version)) => {
                Ok(Some(orderly_core::workflow::WorkflowRef { name, version }))
            }
            _ => Ok(None),
        }
    }

    /// A claimed order held by `owner`, from the columns of a claim and its stored
    /// details (`details`, the JSON text): one decoding for every dialect, whichever
    /// statement brought the details.
    pub fn claimed_by(&self, owner: &InstanceId, details: &str) -> Result<ClaimedOrder> {
        let details = OrderDetails::from_json(details).map_err(|e| corrupt("orders.details", e))?;
        let fence = Fence {
            order_id: self.order_id("order_id")?,
            owner: owner.clone(),
            epoch: Epoch(self.get("lock_epoch")?),
        };
        self.claimed(fence, details)
    }

    /// A claimed (or resumed) order held under `fence`, from the columns of a claim.
    pub fn claimed(
        &self,
        fence: orderly_core::Fence,
        details: orderly_core::OrderDetails,
    ) -> Result<orderly_core::store::ClaimedOrder> {
        Ok(orderly_core::store::ClaimedOrder {
            fence,
            complete_by: self.ts("complete_by")?,
            current_step: self.get("current_step")?,
            failure_count: self.get("failure_count")?,
            details,
            reply_to: self.get("reply_to")?,
            finish_as: self.opt_state("finish_as")?,
            generation: self.get("generation")?,
            last_error: self.get("last_error")?,
            workflow: self.workflow_ref()?,
            waiting_on: self.get("waiting_on")?,
        })
    }

    pub fn step_record(&self) -> Result<StepRecord> {
        Ok(StepRecord {
            order_id: self.order_id("order_id")?,
            index: self.get("step_index")?,
            name: self.get("name")?,
            status: self
                .get::<String>("status")?
                .parse::<StepStatus>()
                .map_err(|e| corrupt("status", e))?,
            idempotency_key: self.get("idempotency_key")?,
            attempts: self.get("attempts")?,
            detail: self.get("detail")?,
            epoch: Epoch(self.get("epoch")?),
            updated_at: self.ts("updated_at")?,
        })
    }

    pub fn history_event(&self) -> Result<HistoryEvent> {
        Ok(HistoryEvent {
            seq: self.get("seq")?,
            order_id: self.order_id("order_id")?,
            at: self.ts("at")?,
            actor: Actor::from_stored(self.get("actor")?),
            kind: self
                .get::<String>("kind")?
                .parse::<HistoryKind>()
                .map_err(|e| corrupt("kind", e))?,
            from_state: self
                .get::<Option<String>>("from_state")?
                .map(|s| s.parse::<ProcessState>())
                .transpose()
                .map_err(|e| corrupt("from_state", e))?,
            to_state: self.state("to_state")?,
            epoch: Epoch(self.get("epoch")?),
            step: self.get("step")?,
            reason: self.get("reason")?,
        })
    }

    /// A service's health row (with its `waiting` count).
    pub fn service_health(&self) -> Result<orderly_core::service::ServiceHealth> {
        Ok(orderly_core::service::ServiceHealth {
            service: self.get("service")?,
            state: self
                .get::<String>("state")?
                .parse()
                .map_err(|e| corrupt("state", e))?,
            down_since: self.opt_ts("down_since")?,
            retry_at: self.opt_ts("retry_at")?,
            probes: self.get("probes")?,
            outage: self.get("outage")?,
            alerted: self.get("alerted")?,
            resolved: self.get("resolved")?,
            last_error: self.get("last_error")?,
            reported_by: self.get("reported_by")?,
            resume_per_second: self.get("resume_per_second")?,
            updated_at: self.ts("updated_at")?,
            waiting: self.get("waiting")?,
        })
    }

    /// An alert row (columns of `statements::alert_select!`).
    pub fn alert(&self) -> Result<orderly_core::store::Alert> {
        Ok(orderly_core::store::Alert {
            alert_id: self.get("alert_id")?,
            order_id: self.order_id("order_id")?,
            raised_at: self.ts("raised_at")?,
            step_index: self.get("step_index")?,
            step: self.get("step")?,
            last_error: self.get("last_error")?,
            failure_count: self.get("failure_count")?,
            reply_to: self.get("reply_to")?,
            published_at: self.opt_ts("published_at")?,
            acknowledged_at: self.opt_ts("acknowledged_at")?,
            acknowledged_by: self.get("acknowledged_by")?,
        })
    }

    /// A message row (columns [`MESSAGE_COLUMNS`]) as delivered under `lock_token`.
    pub fn message(&self, lock_token: &str) -> Result<ReceivedMessage> {
        let properties: String = self.get("properties")?;
        Ok(ReceivedMessage {
            queue: QueueName::parse(self.get::<String>("queue")?)
                .map_err(|e| corrupt("queue", e))?,
            message_id: self.get("message_id")?,
            correlation_id: self.get("correlation_id")?,
            properties: serde_json::from_str(&properties).map_err(|e| corrupt("properties", e))?,
            body: self.get("body")?,
            delivery_count: u32::try_from(self.get::<i32>("delivery_count")?).unwrap_or(0),
            enqueued_at: self.ts("enqueued_at")?,
            locked_until: self.opt_ts("locked_until")?.unwrap_or_default(),
            lock_token: LockToken(lock_token.to_owned()),
            sequence_number: self.get("seq")?,
        })
    }

    /// A dead-letter row (columns [`DEAD_LETTER_COLUMNS`]).
    pub fn dead_letter(&self) -> Result<DeadLetter> {
        let properties: String = self.get("properties")?;
        let dead_lettered_at = self.ts("dead_lettered_at")?;
        Ok(DeadLetter {
            message: ReceivedMessage {
                queue: QueueName::parse(self.get::<String>("queue")?)
                    .map_err(|e| corrupt("queue", e))?,
                message_id: self.get("message_id")?,
                correlation_id: self.get("correlation_id")?,
                properties: serde_json::from_str(&properties)
                    .map_err(|e| corrupt("properties", e))?,
                body: self.get("body")?,
                delivery_count: u32::try_from(self.get::<i32>("delivery_count")?).unwrap_or(0),
                enqueued_at: self.ts("enqueued_at")?,
                locked_until: dead_lettered_at,
                lock_token: LockToken(String::new()),
                sequence_number: self.get("seq")?,
            },
            reason: self.get("reason")?,
            description: self.get("description")?,
            dead_lettered_at,
        })
    }
}
