//! The submitter role: reads order-submitted messages from the orders queue and, in
//! one transaction per batch, records each order, its Pending state row, its first
//! history entry and the `received` status notification (on the SQL queue, the
//! message's own end too). A repeated message is absorbed; a
//! malformed or invalid one is dead-lettered with a reason naming the field; a store
//! outage leaves the message to be delivered again. It never crashes on input.
//!
//! The role depends on `orderly-core` ports only; [`intake`] also takes orders over
//! HTTP onto the orders queue, and the binary (`src/main.rs`) wires both.

pub mod intake;

use std::sync::Arc;
use std::time::Duration;

use orderly_core::messages::{OrderStatus, OrderSubmitted, StatusNotice};
use orderly_core::store::{Consumed, IntakeStore, ReplyQueues, Submission, SubmitOutcome};
use orderly_core::transport::{QueueName, ReceivedMessage, Transport, decode_json};
use orderly_core::{Actor, Error, InstanceId, OrderId};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

pub use orderly_core::messages::MAX_ORDER_MESSAGE;

/// How a submitter works.
#[derive(Debug, Clone)]
pub struct SubmitterConfig {
    /// This instance.
    pub instance: InstanceId,
    /// The orders queue.
    pub orders: QueueName,
    /// Most messages taken at once.
    pub batch: u32,
    /// How long an idle receive waits.
    pub idle_wait: Duration,
    /// Which queues an order may name as its `reply_to`.
    pub reply_queues: ReplyQueues,
}

impl SubmitterConfig {
    /// Defaults: the `orders` queue, batches of 256, 200 ms idle wait, any reply queue
    /// but orderly's own.
    pub fn new(instance: InstanceId) -> Self {
        Self {
            instance,
            orders: QueueName::parse(orderly_core::messages::queues::ORDERS)
                .unwrap_or_else(|_| unreachable!("literal queue name")),
            batch: 256,
            idle_wait: Duration::from_millis(200),
            reply_queues: ReplyQueues::any(),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Intake {
    /// New orders recorded.
    pub accepted: usize,
    /// Repeats of orders already recorded.
    pub duplicates: usize,
    /// Messages dead-lettered.
    pub rejected: usize,
    /// Messages left for redelivery (store unavailable).
    pub retried: usize,
}

/// A submitter instance.
#[derive(Clone)]
pub struct Submitter {
    store: Arc<dyn IntakeStore>,
    transport: Arc<dyn Transport>,
    cfg: SubmitterConfig,
}

/// An order with its `received` status notice (to its reply queue, if any).
fn submission(order: OrderSubmitted) -> Submission {
    let received = StatusNotice {
        order_id: order.order_id.clone(),
        status: OrderStatus::Received,
        step: None,
        detail: None,
    };
    let sends = received
        .envelope(order.reply_to.as_deref(), "0")
        .into_iter()
        .collect();
    Submission { order, sends }
}

impl Submitter {
    /// A submitter recording into `store`, reading from `transport`.
    pub fn new(
        store: Arc<dyn IntakeStore>,
        transport: Arc<dyn Transport>,
        cfg: SubmitterConfig,
    ) -> Self {
        Self {
            store,
            transport,
            cfg,
        }
    }

    /// Takes one batch from the orders queue (waiting at most `wait`) and records it.
    pub async fn run_once(&self, wait: Duration) -> orderly_core::Result<Intake> {
        let actor = Actor::instance(&self.cfg.instance);
        let mut intake = Intake::default();
        let mut done: Vec<ReceivedMessage> = Vec::new();
        let held = self
            .take_recording(wait, &actor, &mut intake, &mut done)
            .await?;
        let valid = self.decode_orders(held, &mut intake).await;
        if !valid.is_empty() {
            debug!(batch = valid.len(), "orders received");
            self.record(valid, &actor, &mut intake, &mut done).await;
        }
        if !done.is_empty() {
            let _ = self.transport.complete_messages(&done).await;
        }
        Ok(intake)
    }

    /// Takes a batch of order messages. Where the store's database holds the orders
    /// queue, valid orders are taken, recorded and their messages ended in one
    /// transaction, and settled here; the rest (and every message on other transports)
    /// come back held, for the full path.
    async fn take_recording(
        &self,
        wait: Duration,
        actor: &Actor,
        intake: &mut Intake,
        done: &mut Vec<ReceivedMessage>,
    ) -> orderly_core::Result<Vec<ReceivedMessage>> {
        // The order id of each planned message, so it is decoded once.
        let planned = std::sync::Mutex::new(std::collections::HashMap::new());
        let plan = |message: &ReceivedMessage| {
            let submission = self.plan_submission(message)?;
            planned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(message.sequence_number, submission.order.order_id.clone());
            Some(submission)
        };
        let taken = self
            .store
            .take_and_submit(&self.cfg.orders, self.cfg.batch, wait, actor, &plan)
            .await?;
        let Some(taken) = taken else {
            return self
                .transport
                .receive(&self.cfg.orders, self.cfg.batch, wait)
                .await
                .map_err(|e| Error::Queue(Box::new(e)));
        };
        let mut planned = planned
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut held = Vec::new();
        for (message, recorded) in taken.messages.into_iter().zip(taken.recorded) {
            let (Some((outcome, consumed)), Some(order_id)) =
                (recorded, planned.remove(&message.sequence_number))
            else {
                held.push(message);
                continue;
            };
            self.settle_submitted(&order_id, outcome, message, consumed, intake, done)
                .await;
        }
        Ok(held)
    }

    /// The held messages' orders, each checked; what does not decode, or is not a
    /// valid order, is dead-lettered with the problem named.
    async fn decode_orders(
        &self,
        held: Vec<ReceivedMessage>,
        intake: &mut Intake,
    ) -> Vec<(Submission, ReceivedMessage)> {
        let (batch, poison) =
            decode_json::<OrderSubmitted>(self.transport.as_ref(), held, MAX_ORDER_MESSAGE).await;
        intake.rejected += poison.len();
        for p in &poison {
            warn!(message_id = %p.message_id, reason = p.reason, problem = %p.description, "order message dead-lettered");
        }
        let mut valid = Vec::with_capacity(batch.len());
        for (order, message) in batch {
            if let Err(invalid) = self.cfg.reply_queues.check(&order) {
                warn!(order_id = %order.order_id, problem = %invalid, "invalid order dead-lettered");
                self.reject(&message, "InvalidOrder", &invalid.to_string())
                    .await;
                intake.rejected += 1;
                continue;
            }
            valid.push((submission(order), message));
        }
        valid
    }

    /// Records the valid orders in one batch (on the SQL queue their messages end in
    /// the same transaction) and settles each; an outage leaves them all for
    /// redelivery.
    async fn record(
        &self,
        valid: Vec<(Submission, ReceivedMessage)>,
        actor: &Actor,
        intake: &mut Intake,
        done: &mut Vec<ReceivedMessage>,
    ) {
        let (submissions, messages): (Vec<Submission>, Vec<ReceivedMessage>) =
            valid.into_iter().unzip();
        match self
            .store
            .submit_consuming(&submissions, actor, &messages)
            .await
        {
            Ok(Consumed { outcomes, consumed }) => {
                for (((s, message), outcome), consumed) in
                    submissions.iter().zip(messages).zip(outcomes).zip(consumed)
                {
                    self.settle_submitted(
                        &s.order.order_id,
                        outcome,
                        message,
                        consumed,
                        intake,
                        done,
                    )
                    .await;
                }
            }
            // One bad order (a reply queue that does not exist) fails the batch: take
            // them one at a time to find it.
            Err(Error::Send(_)) => {
                for (s, message) in submissions.iter().zip(messages) {
                    let outcome = self.store.submit(&s.order, actor, &s.sends).await;
                    self.settle_submitted(&s.order.order_id, outcome, message, false, intake, done)
                        .await;
                }
            }
            Err(e) => {
                warn!(error = %e, "could not record the orders; they will be delivered again");
                for message in &messages {
                    let _ = self.transport.abandon(message).await;
                }
                intake.retried += messages.len();
            }
        }
    }

    /// The submission a message carries when it can be recorded as it is taken: a
    /// body within the limit that decodes to a valid order. `None` leaves the message
    /// to the full path (which dead-letters it with the reason).
    fn plan_submission(&self, message: &ReceivedMessage) -> Option<Submission> {
        if message.body.len() > MAX_ORDER_MESSAGE {
            return None;
        }
        let order: OrderSubmitted = serde_json::from_slice(&message.body).ok()?;
        self.cfg.reply_queues.check(&order).ok()?;
        Some(submission(order))
    }

    /// The span of one order's intake: it continues the trace the client's message
    /// carries, if any.
    fn submit_span(&self, order_id: &OrderId, message: &ReceivedMessage) -> tracing::Span {
        let span = info_span!("submit", order_id = %order_id, instance_id = %self.cfg.instance);
        orderly_core::tracecontext::continue_from(&span, &message.properties);
        span
    }

    /// Settles the message of order `order_id` in the order's span: one done and not
    /// `consumed` with its record goes to `done`, to be completed.
    async fn settle_submitted(
        &self,
        order_id: &OrderId,
        outcome: orderly_core::Result<SubmitOutcome>,
        message: ReceivedMessage,
        consumed: bool,
        intake: &mut Intake,
        done: &mut Vec<ReceivedMessage>,
    ) {
        let span = self.submit_span(order_id, &message);
        if let Some(m) = self.settle(outcome, message, intake).instrument(span).await
            && !consumed
        {
            done.push(m);
        }
    }

    /// Settles one message after its order's outcome: returns it if it is done (to be
    /// completed), dead-letters or abandons it otherwise.
    async fn settle(
        &self,
        outcome: orderly_core::Result<SubmitOutcome>,
        message: ReceivedMessage,
        intake: &mut Intake,
    ) -> Option<ReceivedMessage> {
        match outcome {
            Ok(SubmitOutcome::Accepted) => {
                metrics::counter!("orderly_orders_submitted_total", "outcome" => "accepted")
                    .increment(1);
                debug!("order accepted");
                intake.accepted += 1;
                Some(message)
            }
            Ok(SubmitOutcome::Duplicate) => {
                metrics::counter!("orderly_orders_submitted_total", "outcome" => "duplicate")
                    .increment(1);
                debug!("repeated order absorbed");
                intake.duplicates += 1;
                Some(message)
            }
            Err(e @ Error::OrderIdConflict(_)) => {
                warn!(error = %e, "order id reused with other details: dead-lettered");
                self.reject(&message, "OrderIdConflict", &e.to_string())
                    .await;
                intake.rejected += 1;
                None
            }
            Err(Error::Send(inner))
                if matches!(
                    *inner,
                    orderly_core::transport::TransportError::QueueNotFound(_)
                ) =>
            {
                let problem = format!("invalid reply_to: {inner}");
                warn!(problem = %problem, "order with an unknown reply queue dead-lettered");
                self.reject(&message, "InvalidOrder", &problem).await;
                intake.rejected += 1;
                None
            }
            Err(e @ Error::Invalid(_)) => {
                warn!(error = %e, "invalid order dead-lettered");
                self.reject(&message, "InvalidOrder", &e.to_string()).await;
                intake.rejected += 1;
                None
            }
            Err(e) => {
                // Unavailable (or anything else): not settled, delivered again; the
                // queue's maximum delivery count dead-letters it in the end.
                warn!(error = %e, "could not record the order; it will be delivered again");
                let _ = self.transport.abandon(&message).await;
                intake.retried += 1;
                None
            }
        }
    }

    async fn reject(&self, message: &ReceivedMessage, reason: &str, description: &str) {
        orderly_core::transport::reject(self.transport.as_ref(), message, reason, description)
            .await;
    }

    /// Runs until `shutdown`, retrying with back-off while the queue or store is down.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = info_span!("submitter", instance_id = %self.cfg.instance);
        async move {
            info!(queue = %self.cfg.orders, "submitter started");
            let mut failures = 0u32;
            while !shutdown.is_cancelled() {
                let once = tokio::select! {
                    () = shutdown.cancelled() => break,
                    r = self.run_once(self.cfg.idle_wait) => r,
                };
                match once {
                    Ok(_) => failures = 0,
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        let wait = Duration::from_millis(100u64 << failures.min(7));
                        warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "intake failed; retrying");
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
            info!("submitter stopped");
        }
        .instrument(span)
        .await;
    }
}
