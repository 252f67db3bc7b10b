//! The reply path: agents' replies applied under the fence they carry, each step
//! recorded and the next one started (or the order completed, failed, cancelled, or
//! undone) in as few transactions as the batch allows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orderly_core::messages::{OrderStatus, StatusNotice, StepKind, StepOutcome, StepReply};
use orderly_core::service::{Park, ServiceState};
use orderly_core::store::{Completion, Consumed, StepUpdate, StepWrite, Taken};
use orderly_core::transport::{Envelope, ReceivedMessage, decode_json, reject};
use orderly_core::workflow::Workflow;
use orderly_core::{Error, OrderId, ProcessState, StepStatus};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{Next, Pass, Scheduler, plan};

/// How many times a reply of a workflow version this scheduler does not run is given
/// back to the queue (for a scheduler that runs it) before it hands the order back.
const FOREIGN_REPLY_GIVE_BACKS: u32 = 3;

/// A forward step's write: whose, and whether it recorded the order's last step.
struct Written {
    order_id: orderly_core::OrderId,
    last: bool,
}

/// Where a pass collects what its replies led to.
struct Tally<'a> {
    pass: &'a mut Pass,
    settle: &'a mut Vec<ReceivedMessage>,
    retry: &'a mut Vec<ReceivedMessage>,
    parks: &'a mut Vec<Park>,
    /// Replies whose write the store cannot use: dead-lettered with the reason.
    unusable: &'a mut Vec<(OrderId, Error, ReceivedMessage)>,
}

impl Scheduler {
    /// Receives one batch of replies (waiting at most `wait` for the first) and
    /// applies them.
    pub async fn replies_once(&self, wait: Duration) -> orderly_core::Result<Pass> {
        // Where the store's database holds the replies queue, forward successes are
        // taken, recorded and their next requests sent in one transaction; the rest
        // (and every reply on other transports) come back held, for the path below.
        // When the first reply was taken (in the transaction): from then on the
        // time is the step writes', as on the other path.
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
        let received = match taken {
            Some(taken) => taken,
            None => {
                let messages = self
                    .transport
                    .receive(&self.cfg.replies, self.cfg.reply_batch, wait)
                    .await
                    .map_err(|e| Error::Queue(Box::new(e)))?;
                let recorded = messages.iter().map(|_| None).collect();
                Taken { messages, recorded }
            }
        };
        let mut pass = Pass::default();
        let mut settle: Vec<ReceivedMessage> = Vec::with_capacity(received.messages.len());
        let mut retry: Vec<ReceivedMessage> = Vec::new();
        let mut held = Vec::new();
        let mut unusable = Vec::new();
        let mut recorded = 0u64;
        let mut planned = planned
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (message, verdict) in received.messages.into_iter().zip(received.recorded) {
            let (Some((verdict, consumed)), Some(written)) =
                (verdict, planned.remove(&message.sequence_number))
            else {
                held.push(message);
                continue;
            };
            recorded += 1;
            let mut tally = Tally {
                pass: &mut pass,
                settle: &mut settle,
                retry: &mut retry,
                parks: &mut Vec::new(),
                unusable: &mut unusable,
            };
            self.account(written, None, verdict, consumed, message, &mut tally);
        }
        if recorded > 0 {
            if let Some(started) = first_taken.get() {
                metrics::histogram!("orderly_step_writes_seconds")
                    .record(started.elapsed().as_secs_f64());
            }
            metrics::counter!("orderly_steps_succeeded_total").increment(recorded);
            debug!(batch = recorded, "replies taken and recorded");
        }
        for (order_id, e, message) in unusable.drain(..) {
            self.unusable(&order_id, &e, &message).await;
        }
        let (replies, poison) = decode_json::<StepReply>(
            self.transport.as_ref(),
            held,
            orderly_core::transport::MAX_BODY_BYTES,
        )
        .await;
        pass.rejected += poison.len();
        for p in &poison {
            warn!(message_id = %p.message_id, reason = p.reason, problem = %p.description, "step reply dead-lettered");
        }
        if replies.is_empty() {
            if !settle.is_empty() {
                let _ = self.transport.complete_messages(&settle).await;
            }
            pass.retried += retry.len();
            for m in &retry {
                let _ = self.transport.abandon(m).await;
            }
            return Ok(pass);
        }
        debug!(batch = replies.len(), "replies received");
        let mut give_back: Vec<ReceivedMessage> = Vec::new();
        let mut forward: Vec<(Arc<Workflow>, StepReply, ReceivedMessage)> = Vec::new();
        for (reply, message) in replies {
            let Some(flow) = self.flow(reply.context.workflow.as_ref()) else {
                // Pinned to a version not loaded here: given back for a scheduler that
                // has it; after a few rounds (none may be running), the order itself
                // is handed back (Pending, no failure counted, the step re-sent under
                // the same idempotency key by whoever claims it) and the reply dropped.
                pass.foreign += 1;
                let why = self.not_here(reply.context.workflow.as_ref());
                if message.delivery_count < FOREIGN_REPLY_GIVE_BACKS {
                    debug!(order_id = %reply.fence.order_id, reason = %why, "reply given back");
                    give_back.push(message);
                    continue;
                }
                match self.store.release(&reply.fence, &why).await {
                    Err(e) if e.is_retryable() => retry.push(message),
                    Ok(()) => {
                        warn!(order_id = %reply.fence.order_id, reason = %why, "order left alone: handed back");
                        settle.push(message);
                    }
                    Err(e) => {
                        debug!(order_id = %reply.fence.order_id, error = %e, "reply of another workflow version dropped: the order moved on");
                        settle.push(message);
                    }
                }
                continue;
            };
            match self.check_reply(&flow, &reply) {
                Ok(()) => forward.push((flow, reply, message)),
                Err(problem) => {
                    warn!(order_id = %reply.fence.order_id, step = %reply.step, action = %reply.action, problem = %problem, "step reply for a step this workflow does not have: dead-lettered");
                    reject(self.transport.as_ref(), &message, "UnknownStep", &problem).await;
                    pass.rejected += 1;
                }
            }
        }
        // Forward successes and failures first, in one batch; compensation replies and
        // the rare paths after.
        let mut writes = Vec::new();
        let mut write_msgs = Vec::new();
        let mut write_replies = Vec::new();
        let mut later = Vec::new();
        // Requests an agent gave back because their service is down: their orders
        // wait for it (parked, not counted), all in one transaction.
        let mut deferred: Vec<(Park, ReceivedMessage)> = Vec::new();
        for (flow, reply, message) in forward {
            let span = self.reply_span(&reply, &message);
            let _entered = span.enter();
            if self.clock.now() >= reply.complete_by {
                debug!(order_id = %reply.fence.order_id, step = %reply.step, "reply after the deadline: the supervisor owns the order now");
                pass.dropped += 1;
                settle.push(message);
                continue;
            }
            match (&reply.kind, &reply.outcome) {
                (StepKind::Do, StepOutcome::Succeeded { detail }) => {
                    let (write, park) = self.step_succeeded(&flow, &reply, detail);
                    writes.push(write);
                    write_msgs.push(message);
                    write_replies.push((flow.len(), reply, span.clone(), park));
                }
                (kind, StepOutcome::Deferred { service, reason }) => {
                    let step = (*kind == StepKind::Do).then_some(reply.step_index);
                    let park = match self.services.as_ref().and_then(|v| v.get(service)) {
                        Some(health) if health.state != ServiceState::Up => {
                            Self::park_for(&reply.fence, step, &health)
                        }
                        _ => Park {
                            fence: reply.fence.clone(),
                            expect_step: step,
                            service: service.clone(),
                            reason: format!("waiting: {reason}; not counted as a failure"),
                        },
                    };
                    debug!(order_id = %reply.fence.order_id, service = %service, "request deferred by its agent: the order waits for its service");
                    deferred.push((park, message));
                }
                _ => later.push((flow, reply, message, span.clone())),
            }
        }
        if !deferred.is_empty() {
            let (parks, messages): (Vec<Park>, Vec<ReceivedMessage>) = deferred.into_iter().unzip();
            match self.park(&parks, &mut pass).await {
                Ok(()) => settle.extend(messages),
                Err(e) if e.is_retryable() => retry.extend(messages),
                Err(e) => return Err(e),
            }
        }
        // On the SQL queue the replies of recorded steps end in the same transaction.
        let (verdicts, consumed) = if writes.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let started = std::time::Instant::now();
            let applied = self
                .store
                .record_steps_consuming(&writes, &write_msgs)
                .await;
            metrics::histogram!("orderly_step_writes_seconds")
                .record(started.elapsed().as_secs_f64());
            metrics::counter!("orderly_steps_succeeded_total").increment(writes.len() as u64);
            debug!(
                batch = writes.len(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "step writes applied"
            );
            match applied {
                Ok(Consumed { outcomes, consumed }) => (outcomes, consumed),
                Err(e) if e.is_retryable() => {
                    retry.append(&mut write_msgs);
                    write_replies.clear();
                    (Vec::new(), Vec::new())
                }
                // One write the store cannot use fails the whole batch: each goes
                // alone, so only its reply is dead-lettered and the others are recorded.
                Err(e) if e.is_unusable() && writes.len() > 1 => {
                    warn!(error = %e, batch = writes.len(), "a batch of step writes was refused: recording them one by one");
                    self.record_one_by_one(&writes, &write_msgs).await
                }
                Err(e) => return Err(e),
            }
        };
        let mut parks = Vec::new();
        for ((((steps, reply, span, park), message), verdict), consumed) in write_replies
            .into_iter()
            .zip(write_msgs)
            .zip(verdicts)
            .zip(consumed)
        {
            let _entered = span.enter();
            let written = Written {
                order_id: reply.fence.order_id.clone(),
                last: reply.step_index + 1 >= steps,
            };
            let mut tally = Tally {
                pass: &mut pass,
                settle: &mut settle,
                retry: &mut retry,
                parks: &mut parks,
                unusable: &mut unusable,
            };
            self.account(written, park, verdict, consumed, message, &mut tally);
        }
        if let Err(e) = self.park(&parks, &mut pass).await {
            // Recorded but not parked: the supervisor finds each at its deadline and,
            // its service being down, parks it then (uncounted).
            warn!(error = %e, orders = parks.len(), "could not park orders whose next service is down");
        }
        for (flow, reply, message, span) in later {
            match self
                .apply_other(&flow, &reply, &mut pass)
                .instrument(span)
                .await
            {
                Ok(()) => settle.push(message),
                Err(e) if e.is_retryable() => retry.push(message),
                Err(e) if e.is_unusable() => {
                    self.unusable(&reply.fence.order_id, &e, &message).await;
                    pass.rejected += 1;
                }
                Err(e) => {
                    debug!(order_id = %reply.fence.order_id, error = %e, "reply refused by the store: dropped");
                    pass.dropped += 1;
                    settle.push(message);
                }
            }
        }
        for (order_id, e, message) in unusable {
            self.unusable(&order_id, &e, &message).await;
        }
        if !settle.is_empty() {
            // A lost lock means the reply comes back; applying it again is refused
            // (stale step) or repeats an idempotent write.
            let _ = self.transport.complete_messages(&settle).await;
        }
        pass.retried += retry.len();
        for m in retry.iter().chain(&give_back) {
            let _ = self.transport.abandon(m).await;
        }
        Ok(pass)
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
        if reply.kind != StepKind::Do || self.clock.now() >= reply.complete_by {
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
        tally: &mut Tally<'_>,
    ) {
        match verdict {
            Ok(()) => {
                tally.pass.applied += 1;
                if let Some(park) = park {
                    tally.parks.push(park);
                } else if !written.last {
                    tally.pass.requests += 1;
                } else {
                    // Completed with the write that recorded its last step.
                    tally.pass.completed += 1;
                    metrics::counter!("orderly_orders_processed_total").increment(1);
                    debug!(order_id = %written.order_id, instance_id = %self.cfg.instance, "order processed");
                }
                if !consumed {
                    tally.settle.push(message);
                }
            }
            Err(e) if e.is_retryable() => tally.retry.push(message),
            Err(e) if e.is_unusable() && !consumed => {
                tally.pass.rejected += 1;
                tally.unusable.push((written.order_id, e, message));
            }
            Err(e) => {
                debug!(error = %e, "reply refused by the store: dropped");
                tally.pass.dropped += 1;
                if !consumed {
                    tally.settle.push(message);
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

    /// Applies a reply other than a forward success: a permanent failure, or a
    /// compensation's outcome.
    pub(crate) async fn apply_other(
        &self,
        flow: &Workflow,
        reply: &StepReply,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        let fence = &reply.fence;
        match (&reply.kind, &reply.outcome) {
            (StepKind::Do, StepOutcome::Failed { error }) => {
                warn!(error = %error, "step failed permanently");
                let write = StepWrite {
                    complete: false,
                    fence: fence.clone(),
                    expect_step: Some(reply.step_index),
                    updates: vec![StepUpdate {
                        index: reply.step_index,
                        name: reply.step.clone(),
                        status: StepStatus::Failed,
                        detail: Some(error.clone()),
                        idempotency_key: plan::reply_key(reply),
                        irreversible: flow
                            .step(reply.step_index)
                            .is_some_and(orderly_core::workflow::StepDef::cannot_be_undone),
                    }],
                    sends: Vec::new(),
                };
                single(self.store.record_steps(&[write]).await?)?;
                pass.applied += 1;
                let steps = self.store.steps(&fence.order_id).await?;
                let undoable = steps.iter().any(|s| {
                    matches!(s.status, StepStatus::Succeeded | StepStatus::Started)
                        && flow.step(s.index).is_some_and(|d| d.compensation.is_some())
                });
                let mut context = reply.context.clone();
                let fixed = crate::plan::past_return(flow, &steps);
                if flow.compensate_on_error && !fixed.is_empty() {
                    // Undoing would leave the order half undone: nothing is.
                    let next =
                        Self::refuse_undoing(fence, Some(ProcessState::Error), &steps, &fixed);
                    self.execute(vec![next], pass).await
                } else if flow.compensate_on_error && undoable {
                    self.store
                        .begin_compensation(
                            fence,
                            ProcessState::Error,
                            &format!("step {} failed: {error}", reply.step),
                            &[],
                        )
                        .await?;
                    context.finish_as = Some(ProcessState::Error);
                    let next = self.plan_compensation(
                        flow,
                        fence,
                        reply.complete_by,
                        &context,
                        &steps,
                        None,
                    );
                    self.execute(vec![next], pass).await
                } else {
                    self.execute(
                        vec![Next::Fail(
                            fence.clone(),
                            format!("step {} failed: {error}", reply.step),
                        )],
                        pass,
                    )
                    .await
                }
            }
            (StepKind::Compensate, StepOutcome::Succeeded { detail }) => {
                let steps = self.store.steps(&fence.order_id).await?;
                let already = steps
                    .iter()
                    .any(|s| s.index == reply.step_index && s.status == StepStatus::Compensated);
                if already {
                    pass.dropped += 1;
                    return Ok(());
                }
                pass.applied += 1;
                let next = self.plan_compensation(
                    flow,
                    fence,
                    reply.complete_by,
                    &reply.context,
                    &steps,
                    Some((reply.step_index, detail)),
                );
                self.execute(vec![next], pass).await
            }
            (StepKind::Compensate, StepOutcome::Failed { error }) => {
                pass.applied += 1;
                let steps = self.store.steps(&fence.order_id).await?;
                let left: Vec<String> = steps
                    .iter()
                    .filter(|s| matches!(s.status, StepStatus::Started | StepStatus::Succeeded))
                    .map(|s| s.name.clone())
                    .collect();
                let error = format!(
                    "compensation {} of step {} failed: {error}; still to undo by hand: {}",
                    reply.action,
                    reply.step,
                    left.join(", ")
                );
                self.execute(vec![Next::Fail(fence.clone(), error)], pass)
                    .await
            }
            // Applied in the batch, before these.
            (StepKind::Do, StepOutcome::Succeeded { .. }) | (_, StepOutcome::Deferred { .. }) => {
                Ok(())
            }
        }
    }

    /// Carries out planned moves: writes in one batch, completions in one batch, the
    /// rest one by one. A write that ends a compensation is followed by the finish.
    pub(crate) async fn execute(
        &self,
        nexts: Vec<Next>,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        let mut writes = Vec::new();
        let mut completions = Vec::new();
        let mut finishes = Vec::new();
        let mut parks = Vec::new();
        for next in nexts {
            match next {
                Next::Write(w) => writes.push(w),
                Next::Park(p) => parks.push(p),
                Next::Complete(c) => completions.push(c),
                Next::Finish(w, finish_as, notify_to) => {
                    match single(self.store.record_steps(std::slice::from_ref(&w)).await?) {
                        Ok(()) => {
                            let steps = self.store.steps(&w.fence.order_id).await?;
                            finishes.push(Self::plan_finish(
                                &w.fence,
                                finish_as,
                                &steps,
                                notify_to.as_deref(),
                            ));
                        }
                        Err(e) if e.is_retryable() => return Err(e),
                        Err(e) => {
                            debug!(order_id = %w.fence.order_id, error = %e, "write refused: the order moved on");
                            pass.dropped += 1;
                        }
                    }
                }
                other => finishes.push(other),
            }
        }
        if !writes.is_empty() {
            let verdicts = self.store.record_steps(&writes).await?;
            for (w, verdict) in writes.iter().zip(verdicts) {
                match verdict {
                    Ok(()) => {
                        pass.requests += w.sends.iter().filter(|e| is_request(e)).count();
                    }
                    Err(e) if e.is_retryable() => return Err(e),
                    Err(e) => {
                        debug!(order_id = %w.fence.order_id, error = %e, "write refused: the order moved on");
                        pass.dropped += 1;
                    }
                }
            }
        }
        if !completions.is_empty() {
            self.complete(completions, pass).await?;
        }
        self.park(&parks, pass).await?;
        for finish in finishes {
            match finish {
                Next::Fail(fence, error) => match self.store.fail(&fence, &error, &[]).await {
                    Ok(()) => {
                        warn!(order_id = %fence.order_id, error = %error, "order failed");
                        pass.failed += 1;
                    }
                    Err(e) if e.is_retryable() => return Err(e),
                    Err(e) => debug!(order_id = %fence.order_id, error = %e, "fail refused"),
                },
                Next::Undone(fence, error) => {
                    match self.store.finish_undone(&fence, &error).await {
                        Ok(None) => {
                            warn!(order_id = %fence.order_id, error = %error, "order failed");
                            pass.failed += 1;
                        }
                        Ok(Some(generation)) => {
                            info!(order_id = %fence.order_id, generation, "undoing finished: the operator's retry runs afresh");
                        }
                        Err(e) if e.is_retryable() => return Err(e),
                        Err(e) => debug!(order_id = %fence.order_id, error = %e, "fail refused"),
                    }
                }
                Next::Cancel(fence, notify_to) => {
                    let notice = StatusNotice {
                        order_id: fence.order_id.clone(),
                        status: OrderStatus::Cancelled,
                        step: None,
                        detail: Some("cancelled; completed steps undone".into()),
                    };
                    let sends: Vec<Envelope> = notice
                        .envelope(notify_to.as_deref(), &fence.epoch.to_string())
                        .into_iter()
                        .collect();
                    match self
                        .store
                        .finish_cancelled(&fence, "cancelled; completed steps undone", &sends)
                        .await
                    {
                        Ok(()) => {
                            info!(order_id = %fence.order_id, "order cancelled after compensation");
                            pass.cancelled += 1;
                        }
                        Err(e) if e.is_retryable() => return Err(e),
                        Err(e) => debug!(order_id = %fence.order_id, error = %e, "cancel refused"),
                    }
                }
                Next::Write(_) | Next::Complete(_) | Next::Finish(..) | Next::Park(_) => {}
            }
        }
        Ok(())
    }

    pub(crate) async fn complete(
        &self,
        completions: Vec<Completion>,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        let outcome = self.store.complete_many(&completions).await?;
        pass.completed += outcome.completed.len();
        metrics::counter!("orderly_orders_processed_total")
            .increment(outcome.completed.len() as u64);
        metrics::counter!("orderly_completions_refused_total")
            .increment(outcome.refused.len() as u64);
        for id in &outcome.completed {
            debug!(order_id = %id, instance_id = %self.cfg.instance, "order processed");
        }
        for (id, e) in &outcome.refused {
            debug!(order_id = %id, error = %e, "completion refused: the order moved on");
        }
        Ok(())
    }
}

fn is_request(e: &Envelope) -> bool {
    e.message.message_id.starts_with("req:")
}

fn single(mut verdicts: Vec<orderly_core::Result<()>>) -> orderly_core::Result<()> {
    verdicts.pop().unwrap_or(Ok(()))
}
