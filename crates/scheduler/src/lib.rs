//! The scheduler role: claims due orders, drives each through its declared workflow
//! by sending step requests to agents, applies their replies under the fence they
//! carry, compensates completed steps when an order cannot finish, and completes it.
//!
//! Nothing here lives only in memory: an order's progress is its state row and step
//! records, and every step request and reply is a durable message, so a scheduler can
//! die at any point and another (or the supervisor) carries on. Replies go to one
//! shared queue and any scheduler instance may apply one: the write is fenced by the
//! (order, owner, epoch) the request carried, so a reply for a deposed owner is refused
//! by the store, not merely unlikely to be applied.
//!
//! Depends on `orderly-core` ports only; no database or queue client.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::messages::{
    OrderStatus, StatusNotice, StepContext, StepKind, StepOutcome, StepReply,
};
use orderly_core::store::{
    ClaimRequest, ClaimedOrder, Completion, SchedulerStore, StepUpdate, StepWrite,
};
use orderly_core::transport::{Envelope, QueueName, ReceivedMessage, Transport, receive_json};
use orderly_core::workflow::{Workflow, WorkflowFilter, WorkflowRef, Workflows};
use orderly_core::{Clock, Error, Fence, InstanceId, ProcessState, StepStatus};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

mod backoff;
mod plan;

pub use backoff::Backoff;

/// How a scheduler works.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// This instance; becomes `locked_by` of the orders it claims.
    pub instance: InstanceId,
    /// The workflows it runs: new orders start on the current version of the one they
    /// name (or the default); started orders carry on with the version they are
    /// pinned to, if it is loaded here (otherwise it leaves them to a scheduler that
    /// has it).
    pub workflows: Arc<Workflows>,
    /// Where agents reply.
    pub replies: QueueName,
    /// Most orders claimed at once.
    pub claim_batch: u32,
    /// Most replies applied at once.
    pub reply_batch: u32,
    /// An order's deadline after its claim (CompleteBy = claim time + this).
    pub processing_timeout: Duration,
    /// How long an idle loop waits before looking again.
    pub idle_wait: Duration,
    /// Most orders this instance holds at once; it claims no more until some finish.
    pub max_in_flight: u32,
    /// On shutdown: how long to keep applying replies to the orders it holds (claiming
    /// nothing new) before handing the rest back.
    pub shutdown_grace: Duration,
    /// How often it looks for Pending orders of workflows it does not run, to say so.
    pub unserved_check: Duration,
}

impl SchedulerConfig {
    /// A configuration for `workflows` with the defaults: batches of 64 and 256, a
    /// processing timeout of the longest total budget of its workflows, 50 ms idle
    /// wait.
    pub fn new(instance: InstanceId, workflows: Arc<Workflows>) -> Self {
        Self {
            instance,
            processing_timeout: workflows.total_budget(),
            workflows,
            replies: QueueName::parse(orderly_core::messages::queues::REPLIES)
                .unwrap_or_else(|_| unreachable!("literal queue name")),
            claim_batch: 64,
            reply_batch: 256,
            idle_wait: Duration::from_millis(50),
            max_in_flight: 1_000,
            shutdown_grace: Duration::from_secs(10),
            unserved_check: Duration::from_secs(30),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Orders claimed (or resumed).
    pub claimed: usize,
    /// Step and compensation requests sent.
    pub requests: usize,
    /// Replies applied.
    pub applied: usize,
    /// Replies dropped: stale fence, stale step, deadline passed, repeated.
    pub dropped: usize,
    /// Replies dead-lettered: undecodable, or for a step the workflow does not have.
    pub rejected: usize,
    /// Orders now Processed.
    pub completed: usize,
    /// Orders now Error.
    pub failed: usize,
    /// Orders now Cancelled.
    pub cancelled: usize,
    /// Replies given back, or orders handed back, because their workflow version is
    /// not loaded here.
    pub foreign: usize,
    /// Replies left for redelivery because the store was unavailable.
    pub retried: usize,
}

impl Pass {
    fn add(&mut self, o: Pass) {
        self.claimed += o.claimed;
        self.requests += o.requests;
        self.applied += o.applied;
        self.dropped += o.dropped;
        self.rejected += o.rejected;
        self.completed += o.completed;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.foreign += o.foreign;
        self.retried += o.retried;
    }

    /// Whether the pass found any work.
    pub fn is_idle(&self) -> bool {
        *self == Pass::default()
    }
}

/// A scheduler instance.
#[derive(Clone)]
pub struct Scheduler {
    store: Arc<dyn SchedulerStore>,
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
    cfg: SchedulerConfig,
    /// The claim filter of `cfg.workflows`, computed once.
    filter: Arc<WorkflowFilter>,
}

/// How many times a reply of a workflow version this scheduler does not run is given
/// back to the queue (for a scheduler that runs it) before it hands the order back.
const FOREIGN_REPLY_GIVE_BACKS: u32 = 3;

/// What to do next with an order the scheduler holds.
enum Next {
    /// Send this write (a step or compensation request).
    Write(StepWrite),
    /// Every step done: complete it.
    Complete(Completion),
    /// Undoing finished (or nothing to undo): end it in Error with this error.
    Fail(Fence, String),
    /// Undoing finished: end it Cancelled (and tell the client's queue, if any).
    Cancel(Fence, Option<String>),
    /// Record the last compensation, then finish as the order is marked to (the
    /// client's queue, if any, is told of a cancellation).
    Finish(StepWrite, Option<ProcessState>, Option<String>),
}

impl Scheduler {
    /// A scheduler over `store` and `transport`; `clock` decides when a deadline has
    /// passed on this side (the store decides for itself).
    pub fn new(
        store: Arc<dyn SchedulerStore>,
        transport: Arc<dyn Transport>,
        clock: Arc<dyn Clock>,
        cfg: SchedulerConfig,
    ) -> Self {
        let filter = Arc::new(cfg.workflows.filter());
        Self {
            store,
            transport,
            clock,
            cfg,
            filter,
        }
    }

    /// The workflow an order pinned to `reference` runs here, if this scheduler has it.
    fn flow(&self, reference: Option<&WorkflowRef>) -> Option<&Arc<Workflow>> {
        self.cfg.workflows.get(reference)
    }

    /// Why it leaves an order of `reference` alone.
    fn not_here(&self, reference: Option<&WorkflowRef>) -> String {
        let loaded: Vec<String> = self
            .cfg
            .workflows
            .references()
            .map(ToString::to_string)
            .collect();
        format!(
            "workflow {} is not loaded by scheduler {} (it runs {}); a scheduler with that \
             version's file must apply it",
            reference.map_or_else(|| "(default)".to_owned(), ToString::to_string),
            self.cfg.instance,
            loaded.join(", ")
        )
    }

    /// This instance's id.
    pub fn instance(&self) -> &InstanceId {
        &self.cfg.instance
    }

    /// Takes back the orders an earlier run with this instance id still holds (under
    /// a new epoch) and sends their current step again; the idempotency key makes the
    /// repeat harmless. Call once at start-up.
    pub async fn resume(&self) -> orderly_core::Result<Pass> {
        let orders = self.store.resume_owned(&self.cfg.instance).await?;
        if !orders.is_empty() {
            info!(instance_id = %self.cfg.instance, orders = orders.len(), "resumed orders held before a restart");
        }
        self.advance_claimed(orders).await
    }

    /// Claims one batch of due orders (fewer if it holds nearly its maximum) and sends
    /// each its next request.
    pub async fn claim_once(&self) -> orderly_core::Result<Pass> {
        let held = self.store.count_owned(&self.cfg.instance).await?;
        let room = i64::from(self.cfg.max_in_flight).saturating_sub(held);
        let limit = u32::try_from(room.min(i64::from(self.cfg.claim_batch))).unwrap_or(0);
        if limit == 0 {
            return Ok(Pass::default());
        }
        // Orders running forward get their first request in the claim's own
        // transaction; the rest (to be undone, or with every step done) after it.
        let plan = |order: &ClaimedOrder| self.first_request(order);
        let claimed = self
            .store
            .claim_and_start(
                &ClaimRequest {
                    owner: self.cfg.instance.clone(),
                    limit,
                    timeout: self.cfg.processing_timeout,
                    workflows: self.filter.clone(),
                },
                &plan,
            )
            .await?;
        let started = claimed.iter().filter(|(_, started)| *started).count();
        if started > 0 {
            metrics::counter!("orderly_orders_claimed_total").increment(started as u64);
            debug!(batch = started, "claimed and started");
        }
        let rest: Vec<ClaimedOrder> = claimed
            .into_iter()
            .filter_map(|(order, started)| (!started).then_some(order))
            .collect();
        let mut pass = self.advance_claimed(rest).await?;
        pass.claimed += started;
        pass.requests += started;
        Ok(pass)
    }

    /// The write that starts an order's current step, telling the client's queue (if
    /// any) that it is processing.
    fn start_write(
        &self,
        flow: &Workflow,
        order: &ClaimedOrder,
        context: &StepContext,
    ) -> StepWrite {
        let mut write = self.start_step(
            flow,
            &order.fence,
            order.current_step,
            order.complete_by,
            context,
        );
        let notice = StatusNotice {
            order_id: order.fence.order_id.clone(),
            status: OrderStatus::Processing,
            step: None,
            detail: None,
        };
        write
            .sends
            .extend(notice.envelope(order.reply_to.as_deref(), &order.fence.epoch.to_string()));
        write
    }

    /// The write that starts a forward-running order's current step (and tells the
    /// client it is processing), built in the order's `dispatch` span so its request
    /// starts the order's trace; `None` for an order to be undone or already done.
    fn first_request(&self, order: &ClaimedOrder) -> Option<StepWrite> {
        let flow = self.flow(order.workflow.as_ref())?;
        let def = flow.step(order.current_step)?;
        if order.finish_as.is_some() {
            return None;
        }
        let span = info_span!("dispatch", order_id = %order.fence.order_id, instance_id = %self.cfg.instance, step = %def.name, epoch = %order.fence.epoch);
        orderly_core::tracecontext::start_trace(&span);
        let _entered = span.enter();
        let context = StepContext {
            workflow: order.workflow.clone(),
            details: order.details.clone(),
            notify_to: order.reply_to.clone(),
            finish_as: None,
            generation: order.generation,
        };
        Some(self.start_write(flow, order, &context))
    }

    async fn advance_claimed(&self, claimed: Vec<ClaimedOrder>) -> orderly_core::Result<Pass> {
        let mut pass = Pass {
            claimed: claimed.len(),
            ..Pass::default()
        };
        if claimed.is_empty() {
            return Ok(pass);
        }
        metrics::counter!("orderly_orders_claimed_total").increment(claimed.len() as u64);
        debug!(batch = claimed.len(), "claimed");
        // A claim only takes orders of loaded versions; a resumed order may be of one
        // this restart no longer loads: handed back for a scheduler that has it.
        let (claimed, foreign): (Vec<ClaimedOrder>, Vec<ClaimedOrder>) = claimed
            .into_iter()
            .partition(|o| self.flow(o.workflow.as_ref()).is_some());
        for order in &foreign {
            let why = self.not_here(order.workflow.as_ref());
            warn!(order_id = %order.fence.order_id, reason = %why, "order left alone: handed back");
            if let Err(e) = self.store.release(&order.fence, &why).await {
                debug!(order_id = %order.fence.order_id, error = %e, "not handed back (it moved on)");
            }
        }
        pass.claimed -= foreign.len();
        let mut nexts = Vec::with_capacity(claimed.len());
        for order in &claimed {
            let Some(flow) = self.flow(order.workflow.as_ref()) else {
                continue;
            };
            // Each claim starts the order's trace; its requests carry it to the agents.
            let step = flow
                .step(order.current_step)
                .map_or("(complete)", |d| d.name.as_str());
            let span = info_span!("dispatch", order_id = %order.fence.order_id, instance_id = %self.cfg.instance, step, epoch = %order.fence.epoch);
            orderly_core::tracecontext::start_trace(&span);
            let steps = match order.finish_as {
                Some(_) => Some(self.store.steps(&order.fence.order_id).await?),
                None => None,
            };
            // Not held across an await: the requests below are built in the span.
            let _entered = span.enter();
            let context = StepContext {
                details: order.details.clone(),
                notify_to: order.reply_to.clone(),
                finish_as: order.finish_as,
                generation: order.generation,
                workflow: order.workflow.clone(),
            };
            let next = match steps {
                // Given up on, in a workflow that leaves completed steps in effect.
                Some(_)
                    if order.finish_as == Some(ProcessState::Error)
                        && !flow.compensate_on_error =>
                {
                    Next::Fail(
                        order.fence.clone(),
                        order
                            .last_error
                            .clone()
                            .unwrap_or_else(|| "gave up".to_owned()),
                    )
                }
                Some(steps) => self.plan_compensation(
                    flow,
                    &order.fence,
                    order.complete_by,
                    &context,
                    &steps,
                    None,
                ),
                None if order.current_step >= flow.len() => {
                    Next::Complete(self.completion(&order.fence, &context))
                }
                None => Next::Write(self.start_write(flow, order, &context)),
            };
            nexts.push(next);
        }
        let fences: Vec<Fence> = claimed.into_iter().map(|o| o.fence).collect();
        match self.execute(nexts, &mut pass).await {
            Ok(()) => Ok(pass),
            Err(e) => {
                // Hand the batch back rather than leave it to time out.
                for fence in &fences {
                    if let Err(release) = self
                        .store
                        .release(fence, "scheduler could not start it")
                        .await
                    {
                        debug!(order_id = %fence.order_id, error = %release, "release after a failed start");
                    }
                }
                Err(e)
            }
        }
    }

    /// The Pending orders this scheduler leaves alone because it does not run their
    /// workflow (or the version they are pinned to), as `(workflow, orders)`, each
    /// logged as a warning that says why. Another scheduler may run them; if none
    /// does, they wait until one that loads that workflow's file is started.
    pub async fn report_unserved(&self) -> orderly_core::Result<Vec<(String, i64)>> {
        let waiting: Vec<(String, i64)> = self
            .store
            .workflows_in_flight()
            .await?
            .into_iter()
            .filter(|c| {
                c.state == ProcessState::Pending
                    && !self
                        .cfg
                        .workflows
                        .serves(c.workflow.as_deref(), c.version.as_deref())
            })
            .map(|c| (c.label(), c.orders))
            .collect();
        for (workflow, orders) in &waiting {
            warn!(%workflow, orders, instance_id = %self.cfg.instance, "Pending orders of a workflow this scheduler does not run are left to a scheduler that runs it (start one with that workflow's file)");
        }
        Ok(waiting)
    }

    /// Receives one batch of replies (waiting at most `wait` for the first) and
    /// applies them.
    pub async fn replies_once(&self, wait: Duration) -> orderly_core::Result<Pass> {
        let (replies, poison) = receive_json::<StepReply>(
            self.transport.as_ref(),
            &self.cfg.replies,
            self.cfg.reply_batch,
            wait,
            orderly_core::transport::MAX_BODY_BYTES,
        )
        .await
        .map_err(|e| Error::Queue(Box::new(e)))?;
        let mut pass = Pass {
            rejected: poison.len(),
            ..Pass::default()
        };
        for p in &poison {
            warn!(message_id = %p.message_id, reason = p.reason, problem = %p.description, "step reply dead-lettered");
        }
        if replies.is_empty() {
            return Ok(pass);
        }
        debug!(batch = replies.len(), "replies received");
        let mut settle: Vec<ReceivedMessage> = Vec::with_capacity(replies.len());
        let mut retry: Vec<ReceivedMessage> = Vec::new();
        let mut give_back: Vec<ReceivedMessage> = Vec::new();
        let mut forward: Vec<(Arc<Workflow>, StepReply, ReceivedMessage)> = Vec::new();
        for (reply, message) in replies {
            let Some(flow) = self.flow(reply.context.workflow.as_ref()).cloned() else {
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
                    let _ = self
                        .transport
                        .dead_letter(&message, "UnknownStep", &problem)
                        .await;
                    pass.rejected += 1;
                }
            }
        }
        // Forward successes and failures first, in one batch; compensation replies and
        // the rare paths after.
        let mut writes = Vec::new();
        let mut write_msgs = Vec::new();
        let mut later = Vec::new();
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
                    writes.push(self.step_succeeded(&flow, &reply, detail));
                    write_msgs.push((flow.len(), reply, message, span.clone()));
                }
                _ => later.push((flow, reply, message, span.clone())),
            }
        }
        let verdicts = if writes.is_empty() {
            Vec::new()
        } else {
            let started = std::time::Instant::now();
            let verdicts = self.store.record_steps(&writes).await;
            metrics::histogram!("orderly_step_writes_seconds")
                .record(started.elapsed().as_secs_f64());
            metrics::counter!("orderly_steps_succeeded_total").increment(writes.len() as u64);
            debug!(
                batch = writes.len(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "step writes applied"
            );
            match verdicts {
                Ok(v) => v,
                Err(e) if e.is_retryable() => {
                    retry.extend(write_msgs.drain(..).map(|(_, _, m, _)| m));
                    Vec::new()
                }
                Err(e) => return Err(e),
            }
        };
        for ((steps, reply, message, span), verdict) in write_msgs.into_iter().zip(verdicts) {
            let _entered = span.enter();
            match verdict {
                Ok(()) => {
                    pass.applied += 1;
                    if reply.step_index + 1 < steps {
                        pass.requests += 1;
                    } else {
                        // Completed with the write that recorded its last step.
                        pass.completed += 1;
                        metrics::counter!("orderly_orders_processed_total").increment(1);
                        debug!(order_id = %reply.fence.order_id, instance_id = %self.cfg.instance, "order processed");
                    }
                    settle.push(message);
                }
                Err(e) if e.is_retryable() => retry.push(message),
                Err(e) => {
                    debug!(error = %e, "reply refused by the store: dropped");
                    pass.dropped += 1;
                    settle.push(message);
                }
            }
        }
        for (flow, reply, message, span) in later {
            match self
                .apply_other(&flow, &reply, &mut pass)
                .instrument(span)
                .await
            {
                Ok(()) => settle.push(message),
                Err(e) if e.is_retryable() => retry.push(message),
                Err(e) => {
                    debug!(order_id = %reply.fence.order_id, error = %e, "reply refused by the store: dropped");
                    pass.dropped += 1;
                    settle.push(message);
                }
            }
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

    /// One pass of both halves: claim, then apply the replies waiting now.
    pub async fn run_once(&self) -> orderly_core::Result<Pass> {
        let mut pass = self.claim_once().await?;
        pass.add(self.replies_once(Duration::ZERO).await?);
        Ok(pass)
    }

    /// Runs until `shutdown`: resumes its own orders, then claims and applies replies
    /// in two loops. Store or queue outages are logged and retried with back-off.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = info_span!("scheduler", instance_id = %self.cfg.instance);
        async move {
            let loaded: Vec<String> = self
                .cfg
                .workflows
                .references()
                .map(ToString::to_string)
                .collect();
            info!(workflows = %loaded.join(", "), default = %self.cfg.workflows.default_workflow().name, "scheduler started");
            let mut backoff = Backoff::new();
            loop {
                match self.resume().await {
                    Ok(_) => break,
                    Err(e) => {
                        warn!(error = %e, "could not resume held orders; retrying");
                        if backoff.sleep(&shutdown).await {
                            return;
                        }
                    }
                }
            }
            let claims = {
                let me = self.clone();
                let shutdown = shutdown.clone();
                async move {
                    let mut backoff = Backoff::new();
                    let mut next_check = tokio::time::Instant::now() + me.cfg.unserved_check;
                    while !shutdown.is_cancelled() {
                        if tokio::time::Instant::now() >= next_check {
                            next_check = tokio::time::Instant::now() + me.cfg.unserved_check;
                            if let Err(e) = me.report_unserved().await {
                                debug!(error = %e, "cannot count orders by workflow");
                            }
                        }
                        match me.claim_once().await {
                            Ok(p) if p.claimed > 0 => backoff.reset(),
                            Ok(_) => {
                                backoff.reset();
                                tokio::select! {
                                    () = shutdown.cancelled() => {}
                                    () = tokio::time::sleep(me.cfg.idle_wait) => {}
                                }
                            }
                            Err(e) => {
                                warn!(error = %e, "claim failed; retrying with back-off");
                                backoff.sleep(&shutdown).await;
                            }
                        }
                    }
                }
            };
            // Replies go on after the shutdown signal, for the orders it holds, until
            // none is left or the grace period ends; then the rest are handed back.
            let drained = CancellationToken::new();
            let drain = {
                let me = self.clone();
                let (shutdown, drained) = (shutdown.clone(), drained.clone());
                async move {
                    shutdown.cancelled().await;
                    let until = tokio::time::Instant::now() + me.cfg.shutdown_grace;
                    while tokio::time::Instant::now() < until {
                        match me.store.count_owned(&me.cfg.instance).await {
                            Ok(0) => break,
                            Ok(n) => debug!(held = n, "draining before stopping"),
                            Err(e) => debug!(error = %e, "cannot count held orders while draining"),
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    drained.cancel();
                }
            };
            let replies = {
                let me = self.clone();
                let shutdown = drained.clone();
                async move {
                    let mut backoff = Backoff::new();
                    while !shutdown.is_cancelled() {
                        let once = tokio::select! {
                            () = shutdown.cancelled() => break,
                            r = me.replies_once(me.cfg.idle_wait) => r,
                        };
                        match once {
                            Ok(_) => backoff.reset(),
                            Err(e) => {
                                warn!(error = %e, "applying replies failed; retrying with back-off");
                                backoff.sleep(&shutdown).await;
                            }
                        }
                    }
                }
            };
            tokio::join!(claims, replies, drain);
            self.hand_back().await;
            info!("scheduler stopped");
        }
        .instrument(span)
        .await;
    }

    /// Releases every order it still holds (back to Pending, no failure counted) so
    /// another scheduler takes them at once instead of after their deadline. A request
    /// of theirs still out will get a fenced-out reply; the new owner re-sends the step
    /// under the same idempotency key.
    async fn hand_back(&self) {
        let fences = match self.store.owned(&self.cfg.instance).await {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, "cannot list held orders at shutdown: the supervisor will recover them after their deadline");
                return;
            }
        };
        let mut released = 0;
        for fence in &fences {
            match self
                .store
                .release(fence, "scheduler shutting down: handed back")
                .await
            {
                Ok(()) => released += 1,
                Err(e) => {
                    debug!(order_id = %fence.order_id, error = %e, "not released (it moved on)")
                }
            }
        }
        if !fences.is_empty() {
            info!(
                held = fences.len(),
                released, "orders handed back at shutdown"
            );
        }
    }

    /// The span of everything a reply causes here: it continues the agent's span
    /// that sent it, so the order's next request stays in the order's trace.
    fn reply_span(&self, reply: &StepReply, message: &ReceivedMessage) -> tracing::Span {
        let span = info_span!("reply", order_id = %reply.fence.order_id, instance_id = %self.cfg.instance, step = %reply.step, action = %reply.action, epoch = %reply.fence.epoch);
        orderly_core::tracecontext::continue_from(&span, &message.properties);
        span
    }

    /// Applies a reply other than a forward success: a permanent failure, or a
    /// compensation's outcome.
    async fn apply_other(
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
                if flow.compensate_on_error && undoable {
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
            (StepKind::Do, StepOutcome::Succeeded { .. }) => Ok(()),
        }
    }

    /// Carries out planned moves: writes in one batch, completions in one batch, the
    /// rest one by one. A write that ends a compensation is followed by the finish.
    async fn execute(&self, nexts: Vec<Next>, pass: &mut Pass) -> orderly_core::Result<()> {
        let mut writes = Vec::new();
        let mut completions = Vec::new();
        let mut finishes = Vec::new();
        for next in nexts {
            match next {
                Next::Write(w) => writes.push(w),
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
                Next::Write(_) | Next::Complete(_) | Next::Finish(..) => {}
            }
        }
        Ok(())
    }

    async fn complete(
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
