//! The reply path: agents' replies applied under the fence they carry, each step
//! recorded and the next one started (or the order completed, failed, cancelled, or
//! undone) in as few transactions as the batch allows. Permanent failures and the
//! outcomes of compensations are applied in `undoing.rs`, the moves they plan carried
//! out in `moves.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orderly_core::messages::{StepKind, StepOutcome, StepReply};
use orderly_core::service::{Park, ServiceState};
use orderly_core::store::{Consumed, StepWrite};
use orderly_core::transport::{ReceivedMessage, decode_json, reject};
use orderly_core::workflow::Workflow;
use orderly_core::{Error, OrderId};
use tracing::{Instrument, debug, info_span, warn};

use crate::{Pass, Scheduler};

/// How many times a reply of a workflow version this scheduler does not run is given
/// back to the queue (for a scheduler that runs it) before it hands the order back.
const FOREIGN_REPLY_GIVE_BACKS: u32 = 3;

/// A forward step's write: whose, and whether it recorded the order's last step.
struct Written {
    order_id: orderly_core::OrderId,
    last: bool,
}

/// What a pass's replies led to, gathered as the pass goes. Each message ends one way:
/// settled, left for redelivery (`retry`), given back for another scheduler, or
/// dead-lettered (`unusable`, or at once where it was found bad).
#[derive(Default)]
struct Ends {
    pass: Pass,
    settle: Vec<ReceivedMessage>,
    retry: Vec<ReceivedMessage>,
    /// Replies of a workflow version not loaded here, for a scheduler that has it.
    give_back: Vec<ReceivedMessage>,
    /// Orders whose next step's service is down: they wait for it once recorded.
    parks: Vec<Park>,
    /// Replies whose write the store cannot use: dead-lettered with the reason.
    unusable: Vec<(OrderId, Error, ReceivedMessage)>,
}

/// A reply of a workflow run here, with what it is for.
type Ours = (Arc<Workflow>, StepReply, ReceivedMessage);

/// The forward successes of a pass, recorded in one batch: `writes[i]` was asked for
/// by `messages[i]`, whose reply is `replies[i]`.
#[derive(Default)]
struct Forward {
    writes: Vec<StepWrite>,
    messages: Vec<ReceivedMessage>,
    /// Per write: the workflow's number of steps, the reply, its span, and the park
    /// its next step's service calls for.
    replies: Vec<(i32, StepReply, tracing::Span, Option<Park>)>,
}

/// A pass's replies by what they call for.
#[derive(Default)]
struct Sorted {
    /// Forward successes, recorded together.
    forward: Forward,
    /// Requests an agent gave back because their service is down: their orders wait
    /// for it (parked, not counted), all in one transaction.
    deferred: Vec<(Park, ReceivedMessage)>,
    /// Failures and compensation outcomes, applied one by one after.
    later: Vec<(Arc<Workflow>, StepReply, ReceivedMessage, tracing::Span)>,
}

impl Scheduler {
    /// Receives one batch of replies (waiting at most `wait` for the first) and
    /// applies them: take (recording forward successes as they are taken where the
    /// store holds the queue), decode, route to this scheduler's workflows, record
    /// the forward successes in one batch, apply the rest, then settle.
    pub async fn replies_once(&self, wait: Duration) -> orderly_core::Result<Pass> {
        let mut ends = Ends::default();
        let held = self.take_recording(wait, &mut ends).await?;
        self.dead_letter_unusable(&mut ends).await;
        let replies = self.decode_replies(held, &mut ends).await;
        if !replies.is_empty() {
            debug!(batch = replies.len(), "replies received");
            let ours = self.route(replies, &mut ends).await;
            let sorted = self.sort(ours, &mut ends);
            self.park_deferred(sorted.deferred, &mut ends).await?;
            self.record_forward(sorted.forward, &mut ends).await?;
            if let Err(e) = self.park(&ends.parks, &mut ends.pass).await {
                // Recorded but not parked: the supervisor finds each at its deadline
                // and, its service being down, parks it then (uncounted).
                warn!(error = %e, orders = ends.parks.len(), "could not park orders whose next service is down");
            }
            self.apply_later(sorted.later, &mut ends).await;
            self.dead_letter_unusable(&mut ends).await;
        }
        Ok(self.settle(ends).await)
    }

    /// Takes a batch of replies. Where the store's database holds the replies queue,
    /// forward successes are taken, recorded and their next requests sent in one
    /// transaction, and accounted for here; the rest (and every reply on other
    /// transports) come back held, for the full path.
    async fn take_recording(
        &self,
        wait: Duration,
        ends: &mut Ends,
    ) -> orderly_core::Result<Vec<ReceivedMessage>> {
        // When the first reply was taken (in the transaction): from then on the time
        // is the step writes', as on the full path.
        let first_taken = std::sync::OnceLock::new();
        // What each planned reply was, by its message, so it is decoded once.
        let planned = std::sync::Mutex::new(HashMap::new());
        let plan = |message: &ReceivedMessage| {
            first_taken.get_or_init(std::time::Instant::now);
            let (write, written) = self.plan_reply(message)?;
            planned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(message.sequence_number, written);
            Some(write)
        };
        let taken = self
            .store
            .take_and_record(&self.cfg.replies, self.cfg.reply_batch, wait, &plan)
            .await?;
        let Some(taken) = taken else {
            return self
                .transport
                .receive(&self.cfg.replies, self.cfg.reply_batch, wait)
                .await
                .map_err(|e| Error::Queue(Box::new(e)));
        };
        let mut planned = planned
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut held = Vec::new();
        let mut recorded = 0u64;
        for (message, verdict) in taken.messages.into_iter().zip(taken.recorded) {
            let (Some((verdict, consumed)), Some(written)) =
                (verdict, planned.remove(&message.sequence_number))
            else {
                held.push(message);
                continue;
            };
            recorded += 1;
            self.account(written, None, verdict, consumed, message, ends);
        }
        if recorded > 0 {
            if let Some(started) = first_taken.get() {
                metrics::histogram!("orderly_step_writes_seconds")
                    .record(started.elapsed().as_secs_f64());
            }
            metrics::counter!("orderly_steps_succeeded_total").increment(recorded);
            debug!(batch = recorded, "replies taken and recorded");
        }
        Ok(held)
    }

    /// Why `message` is not a reply signed with this deployment's key (`None`: it is,
    /// or this scheduler checks no signatures).
    fn unsigned(&self, message: &ReceivedMessage) -> Option<orderly_core::signing::BadSignature> {
        self.key.as_ref()?.check(message).err()
    }

    /// Decodes the held replies; what is not signed with the deployment's key, or does
    /// not decode, is dead-lettered with the problem named.
    async fn decode_replies(
        &self,
        mut held: Vec<ReceivedMessage>,
        ends: &mut Ends,
    ) -> Vec<(StepReply, ReceivedMessage)> {
        let mut signed = Vec::with_capacity(held.len());
        for message in held.drain(..) {
            match self.unsigned(&message) {
                None => signed.push(message),
                Some(bad) => {
                    let why = format!("step reply refused: {bad}");
                    warn!(message_id = %message.message_id, reason = %why, "step reply dead-lettered");
                    reject(self.transport.as_ref(), &message, "BadSignature", &why).await;
                    ends.pass.rejected += 1;
                }
            }
        }
        let held = signed;
        let (replies, poison) = decode_json::<StepReply>(
            self.transport.as_ref(),
            held,
            orderly_core::transport::MAX_BODY_BYTES,
        )
        .await;
        ends.pass.rejected += poison.len();
        for p in &poison {
            warn!(message_id = %p.message_id, reason = p.reason, problem = %p.description, "step reply dead-lettered");
        }
        replies
    }

    /// The replies this scheduler runs the workflow of, each checked against it; a
    /// reply for a step the workflow does not have is dead-lettered, and one of a
    /// version not loaded here is left to [`Self::foreign`].
    async fn route(
        &self,
        replies: Vec<(StepReply, ReceivedMessage)>,
        ends: &mut Ends,
    ) -> Vec<Ours> {
        let mut ours = Vec::with_capacity(replies.len());
        for (reply, message) in replies {
            let Some(flow) = self.flow(reply.context.workflow.as_ref()) else {
                self.foreign(&reply, message, ends).await;
                continue;
            };
            match self.check_reply(&flow, &reply) {
                Ok(()) => ours.push((flow, reply, message)),
                Err(problem) => {
                    warn!(order_id = %reply.fence.order_id, step = %reply.step, action = %reply.action, problem = %problem, "step reply for a step this workflow does not have: dead-lettered");
                    reject(self.transport.as_ref(), &message, "UnknownStep", &problem).await;
                    ends.pass.rejected += 1;
                }
            }
        }
        ours
    }

    /// A reply pinned to a version not loaded here: given back for a scheduler that
    /// has it; after a few rounds (none may be running), the order itself is handed
    /// back (Pending, no failure counted, the step re-sent under the same idempotency
    /// key by whoever claims it) and the reply dropped.
    async fn foreign(&self, reply: &StepReply, message: ReceivedMessage, ends: &mut Ends) {
        ends.pass.foreign += 1;
        let why = self.not_here(reply.context.workflow.as_ref());
        if message.delivery_count < FOREIGN_REPLY_GIVE_BACKS {
            debug!(order_id = %reply.fence.order_id, reason = %why, "reply given back");
            ends.give_back.push(message);
            return;
        }
        match self.store.release(&reply.fence, &why).await {
            Err(e) if e.is_retryable() => ends.retry.push(message),
            Ok(()) => {
                warn!(order_id = %reply.fence.order_id, reason = %why, "order left alone: handed back");
                ends.settle.push(message);
            }
            Err(e) => {
                debug!(order_id = %reply.fence.order_id, error = %e, "reply of another workflow version dropped: the order moved on");
                ends.settle.push(message);
            }
        }
    }

    /// Sorts this scheduler's replies by what they call for; a reply whose deadline
    /// has passed is dropped (the supervisor owns its order now).
    fn sort(&self, ours: Vec<Ours>, ends: &mut Ends) -> Sorted {
        let mut sorted = Sorted::default();
        for (flow, reply, message) in ours {
            let span = self.reply_span(&reply, &message);
            let _entered = span.enter();
            if self.clock.now() >= reply.complete_by {
                debug!(order_id = %reply.fence.order_id, step = %reply.step, "reply after the deadline: the supervisor owns the order now");
                ends.pass.dropped += 1;
                ends.settle.push(message);
                continue;
            }
            match (&reply.kind, &reply.outcome) {
                (StepKind::Do, StepOutcome::Succeeded { detail }) => {
                    let (write, park) = self.step_succeeded(&flow, &reply, detail);
                    let f = &mut sorted.forward;
                    f.writes.push(write);
                    f.messages.push(message);
                    f.replies.push((flow.len(), reply, span.clone(), park));
                }
                (kind, StepOutcome::Deferred { service, reason }) => {
                    let step = (*kind == StepKind::Do).then_some(reply.step_index);
                    let park = self.deferred_park(&reply, step, service, reason);
                    debug!(order_id = %reply.fence.order_id, service = %service, "request deferred by its agent: the order waits for its service");
                    sorted.deferred.push((park, message));
                }
                _ => sorted.later.push((flow, reply, message, span.clone())),
            }
        }
        sorted
    }

    /// How the order of a request its agent deferred waits: as the service's known
    /// health says, or, where this scheduler does not know it down, on the agent's word.
    fn deferred_park(
        &self,
        reply: &StepReply,
        step: Option<i32>,
        service: &str,
        reason: &str,
    ) -> Park {
        match self.services.as_ref().and_then(|v| v.get(service)) {
            Some(health) if health.state != ServiceState::Up => {
                Self::park_for(&reply.fence, step, &health)
            }
            _ => Park {
                fence: reply.fence.clone(),
                expect_step: step,
                service: service.to_owned(),
                reason: format!("waiting: {reason}; not counted as a failure"),
            },
        }
    }

    /// Parks the orders of deferred requests, in one transaction.
    async fn park_deferred(
        &self,
        deferred: Vec<(Park, ReceivedMessage)>,
        ends: &mut Ends,
    ) -> orderly_core::Result<()> {
        if deferred.is_empty() {
            return Ok(());
        }
        let (parks, messages): (Vec<Park>, Vec<ReceivedMessage>) = deferred.into_iter().unzip();
        match self.park(&parks, &mut ends.pass).await {
            Ok(()) => ends.settle.extend(messages),
            Err(e) if e.is_retryable() => ends.retry.extend(messages),
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Records the forward successes in one batch (on the SQL queue their replies end
    /// in the same transaction) and accounts for each.
    async fn record_forward(&self, forward: Forward, ends: &mut Ends) -> orderly_core::Result<()> {
        let Forward {
            writes,
            mut messages,
            replies,
        } = forward;
        if writes.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let applied = self.store.record_steps_consuming(&writes, &messages).await;
        metrics::histogram!("orderly_step_writes_seconds").record(started.elapsed().as_secs_f64());
        metrics::counter!("orderly_steps_succeeded_total").increment(writes.len() as u64);
        debug!(
            batch = writes.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "step writes applied"
        );
        let (verdicts, consumed) = match applied {
            Ok(Consumed { outcomes, consumed }) => (outcomes, consumed),
            Err(e) if e.is_retryable() => {
                ends.retry.append(&mut messages);
                return Ok(());
            }
            // One write the store cannot use fails the whole batch: each goes alone,
            // so only its reply is dead-lettered and the others are recorded.
            Err(e) if e.is_unusable() && writes.len() > 1 => {
                warn!(error = %e, batch = writes.len(), "a batch of step writes was refused: recording them one by one");
                self.record_one_by_one(&writes, &messages).await
            }
            Err(e) => return Err(e),
        };
        for ((((steps, reply, span, park), message), verdict), consumed) in replies
            .into_iter()
            .zip(messages)
            .zip(verdicts)
            .zip(consumed)
        {
            let _entered = span.enter();
            let written = Written {
                order_id: reply.fence.order_id.clone(),
                last: reply.step_index + 1 >= steps,
            };
            self.account(written, park, verdict, consumed, message, ends);
        }
        Ok(())
    }

    /// Applies the failures and compensation outcomes, one by one.
    async fn apply_later(
        &self,
        later: Vec<(Arc<Workflow>, StepReply, ReceivedMessage, tracing::Span)>,
        ends: &mut Ends,
    ) {
        for (flow, reply, message, span) in later {
            match self
                .apply_other(&flow, &reply, &mut ends.pass)
                .instrument(span)
                .await
            {
                Ok(()) => ends.settle.push(message),
                Err(e) if e.is_retryable() => ends.retry.push(message),
                Err(e) if e.is_unusable() => {
                    self.unusable(&reply.fence.order_id, &e, &message).await;
                    ends.pass.rejected += 1;
                }
                Err(e) => {
                    debug!(order_id = %reply.fence.order_id, error = %e, "reply refused by the store: dropped");
                    ends.pass.dropped += 1;
                    ends.settle.push(message);
                }
            }
        }
    }

    /// Dead-letters the replies found unusable so far.
    async fn dead_letter_unusable(&self, ends: &mut Ends) {
        for (order_id, e, message) in ends.unusable.drain(..) {
            self.unusable(&order_id, &e, &message).await;
        }
    }

    /// Ends the pass's messages: settles what was applied or dropped, gives back what
    /// is to be received again.
    async fn settle(&self, ends: Ends) -> Pass {
        let Ends {
            mut pass,
            settle,
            retry,
            give_back,
            ..
        } = ends;
        if !settle.is_empty() {
            // A lost lock means the reply comes back; applying it again is refused
            // (stale step) or repeats an idempotent write.
            let _ = self.transport.complete_messages(&settle).await;
        }
        pass.retried += retry.len();
        for m in retry.iter().chain(&give_back) {
            let _ = self.transport.abandon(m).await;
        }
        pass
    }

    /// The write a reply calls for when it can be recorded as it is taken: a forward
    /// success, in time, of a step the workflow has, whose next step's service is not
    /// known to be down. `None` leaves the reply to the full path.
    fn plan_reply(&self, message: &ReceivedMessage) -> Option<(StepWrite, Written)> {
        if message.body.len() > orderly_core::transport::MAX_BODY_BYTES {
            return None;
        }
        let reply: StepReply = serde_json::from_slice(&message.body).ok()?;
        let detail = match &reply.outcome {
            StepOutcome::Succeeded { detail } => detail.clone(),
            _ => return None,
        };
        // The signature is checked only of a reply this path would record; the rest
        // are checked once, on the full path.
        if reply.kind != StepKind::Do
            || self.clock.now() >= reply.complete_by
            || self.unsigned(message).is_some()
        {
            return None;
        }
        let flow = self.flow(reply.context.workflow.as_ref())?;
        self.check_reply(&flow, &reply).ok()?;
        // The next request continues the agent's span, as on the full path.
        let span = self.reply_span(&reply, message);
        let _entered = span.enter();
        let written = Written {
            order_id: reply.fence.order_id.clone(),
            last: reply.step_index + 1 >= flow.len(),
        };
        match self.step_succeeded(&flow, &reply, &detail) {
            (write, None) => Some((write, written)),
            (_, Some(_)) => None,
        }
    }

    /// Accounts for a forward step's write: `verdict` of it, whether its reply's
    /// `message` ended with it, and the park its next service calls for, if any.
    fn account(
        &self,
        written: Written,
        park: Option<Park>,
        verdict: orderly_core::Result<()>,
        consumed: bool,
        message: ReceivedMessage,
        ends: &mut Ends,
    ) {
        match verdict {
            Ok(()) => {
                ends.pass.applied += 1;
                if let Some(park) = park {
                    ends.parks.push(park);
                } else if !written.last {
                    ends.pass.requests += 1;
                } else {
                    // Completed with the write that recorded its last step.
                    ends.pass.completed += 1;
                    metrics::counter!("orderly_orders_processed_total").increment(1);
                    debug!(order_id = %written.order_id, instance_id = %self.cfg.instance, "order processed");
                }
                if !consumed {
                    ends.settle.push(message);
                }
            }
            Err(e) if e.is_retryable() => ends.retry.push(message),
            Err(e) if e.is_unusable() && !consumed => {
                ends.pass.rejected += 1;
                ends.unusable.push((written.order_id, e, message));
            }
            Err(e) => {
                debug!(error = %e, "reply refused by the store: dropped");
                ends.pass.dropped += 1;
                if !consumed {
                    ends.settle.push(message);
                }
            }
        }
    }

    /// Records `writes` one at a time (`messages[i]` asked for `writes[i]`): each
    /// one's verdict, and whether its message ended with it.
    async fn record_one_by_one(
        &self,
        writes: &[StepWrite],
        messages: &[ReceivedMessage],
    ) -> (Vec<orderly_core::Result<()>>, Vec<bool>) {
        let mut verdicts = Vec::with_capacity(writes.len());
        let mut ended = Vec::with_capacity(writes.len());
        for (w, m) in writes.iter().zip(messages) {
            match self
                .store
                .record_steps_consuming(std::slice::from_ref(w), std::slice::from_ref(m))
                .await
            {
                Ok(Consumed {
                    mut outcomes,
                    mut consumed,
                }) => {
                    verdicts.push(outcomes.pop().unwrap_or(Ok(())));
                    ended.push(consumed.pop().unwrap_or(false));
                }
                Err(e) => {
                    verdicts.push(Err(e));
                    ended.push(false);
                }
            }
        }
        (verdicts, ended)
    }

    /// Dead-letters a reply whose write the store refused as unusable (unreadable
    /// stored data, an invalid write, a next message that can never be sent), with the
    /// refusal as its reason: an operator finds it, and the order, left at its step,
    /// is recovered at its deadline. Never dropped in silence.
    async fn unusable(&self, order_id: &OrderId, e: &Error, message: &ReceivedMessage) {
        let problem = e.about(order_id);
        warn!(order_id = %order_id, instance_id = %self.cfg.instance, reason = e.kind(), problem = %problem, "step reply the store cannot use: dead-lettered");
        reject(self.transport.as_ref(), message, e.kind(), &problem).await;
    }

    /// The span of everything a reply causes here: it continues the agent's span
    /// that sent it, so the order's next request stays in the order's trace.
    pub(crate) fn reply_span(&self, reply: &StepReply, message: &ReceivedMessage) -> tracing::Span {
        let span = info_span!("reply", order_id = %reply.fence.order_id, instance_id = %self.cfg.instance, step = %reply.step, action = %reply.action, epoch = %reply.fence.epoch);
        orderly_core::tracecontext::continue_from(&span, &message.properties);
        span
    }
}
