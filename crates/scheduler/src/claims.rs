//! The claim path: orders claimed (or resumed after a restart) and their first
//! request sent in the claim's own transaction.

use orderly_core::messages::{OrderStatus, StatusNotice, StepContext};
use orderly_core::store::{ClaimRequest, ClaimedOrder, StepWrite};
use orderly_core::workflow::Workflow;
use orderly_core::{Fence, ProcessState};
use tracing::{debug, info, info_span, warn};

use crate::{Next, Pass, Scheduler};

impl Scheduler {
    /// Takes back the orders an earlier run with this instance id still holds (under
    /// a new epoch) and sends their current step again; the idempotency key makes the
    /// repeat harmless. Call once at start-up.
    pub async fn resume(&self) -> orderly_core::Result<Pass> {
        let orders = self.store.resume_owned(&self.cfg.instance).await?;
        self.holding.forget();
        if !orders.is_empty() {
            info!(instance_id = %self.cfg.instance, orders = orders.len(), "resumed orders held before a restart");
        }
        self.advance_claimed(orders).await
    }

    /// Claims one batch of due orders (fewer if it holds nearly its maximum) and sends
    /// each its next request.
    pub async fn claim_once(&self) -> orderly_core::Result<Pass> {
        Ok(self.claim_pass().await?.0)
    }

    /// [`Self::claim_once`], and how it ended: whether to claim again at once.
    pub(crate) async fn claim_pass(&self) -> orderly_core::Result<(Pass, ClaimEnd)> {
        let (batch, max) = (
            i64::from(self.cfg.claim_batch),
            i64::from(self.cfg.max_in_flight),
        );
        let room = match self.holding.reserve(batch, max) {
            Some(room) => room,
            None => {
                let held = self.store.count_owned(&self.cfg.instance).await?;
                self.holding.counted(held, batch, max)
            }
        };
        let limit = u32::try_from(room).unwrap_or(0);
        if limit == 0 {
            return Ok((Pass::default(), ClaimEnd::Full));
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
                    workflows: self.filter(),
                },
                &plan,
            )
            .await
            .inspect_err(|_| self.holding.forget())?;
        self.holding.claimed(room, claimed.len() as i64);
        let end = if claimed.len() < limit as usize {
            ClaimEnd::Drained
        } else {
            ClaimEnd::Batch
        };
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
        Ok((pass, end))
    }

    /// The write that starts an order's current step, telling the client's queue (if
    /// any) that it is processing.
    /// `resumed`: the order was this scheduler's before a restart, so its current step
    /// may have been sent already. An order back after a timeout or a failure
    /// (FailureCount > 0), or after waiting for its service, may have had its step sent
    /// too. Either way the step is sent as uncertain (asked about first, if it has a
    /// status probe).
    pub(crate) fn start_write(
        &self,
        flow: &Workflow,
        order: &ClaimedOrder,
        context: &StepContext,
        resumed: bool,
    ) -> StepWrite {
        let mut write = self.start_step(
            flow,
            &order.fence,
            order.current_step,
            order.complete_by,
            context,
            resumed || order.failure_count > 0 || order.waiting_on.is_some(),
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
    /// starts the order's trace; `None` for an order to be undone or already done, or
    /// whose step's service is down (it is parked after the claim).
    pub(crate) fn first_request(&self, order: &ClaimedOrder) -> Option<StepWrite> {
        let flow = self.flow(order.workflow.as_ref())?;
        let def = flow.step(order.current_step)?;
        if order.finish_as.is_some()
            || self
                .blocked(&def.queue, order.waiting_on.as_deref())
                .is_some()
        {
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
        Some(self.start_write(&flow, order, &context, false))
    }

    pub(crate) async fn advance_claimed(
        &self,
        claimed: Vec<ClaimedOrder>,
    ) -> orderly_core::Result<Pass> {
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
        self.hand_back_foreign(&foreign).await;
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
            // Not held across an await: the requests are built in the span.
            let _entered = span.enter();
            nexts.push(self.plan_claimed(&flow, order, steps));
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

    /// Hands back orders of workflow versions this scheduler does not run.
    async fn hand_back_foreign(&self, foreign: &[ClaimedOrder]) {
        for order in foreign {
            let why = self.not_here(order.workflow.as_ref());
            warn!(order_id = %order.fence.order_id, reason = %why, "order left alone: handed back");
            if let Err(e) = self.store.release(&order.fence, &why).await {
                debug!(order_id = %order.fence.order_id, error = %e, "not handed back (it moved on)");
            }
        }
    }

    /// What a claimed or resumed order does next. `steps`: its step records, read
    /// where it is marked to finish (`finish_as`) once its steps are undone.
    fn plan_claimed(
        &self,
        flow: &Workflow,
        order: &ClaimedOrder,
        steps: Option<Vec<orderly_core::StepRecord>>,
    ) -> Next {
        let context = StepContext {
            details: order.details.clone(),
            notify_to: order.reply_to.clone(),
            finish_as: order.finish_as,
            generation: order.generation,
            workflow: order.workflow.clone(),
        };
        match steps {
            // Given up on, in a workflow that leaves completed steps in effect.
            // (An undo in doubt, after a cancel's undoing stopped half way and an
            // operator retried it, is finished first all the same.)
            Some(ref steps)
                if order.finish_as == Some(ProcessState::Error)
                    && !flow.compensate_on_error
                    && !steps.iter().any(orderly_core::StepRecord::undo_in_doubt) =>
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
            // Its step's service is down: it waits, uncounted, until it is back.
            None if let Some(health) = flow
                .step(order.current_step)
                .and_then(|def| self.blocked(&def.queue, order.waiting_on.as_deref())) =>
            {
                Next::Park(Self::park_for(
                    &order.fence,
                    Some(order.current_step),
                    &health,
                ))
            }
            // Only resumed orders start here (a claim starts its forward-running
            // orders in its own transaction).
            None => Next::Write(self.start_write(flow, order, &context, true)),
        }
    }

    /// The Pending orders this scheduler leaves alone because it does not run their
    /// workflow (or the version they are pinned to), as `(workflow, orders)`, each
    /// logged as a warning that says why. Another scheduler may run them; if none
    /// does, they wait until one that loads that workflow's file is started.
    pub async fn report_unserved(&self) -> orderly_core::Result<Vec<(String, i64)>> {
        let workflows = self.workflows();
        let waiting: Vec<(String, i64)> = self
            .store
            .workflows_in_flight()
            .await?
            .into_iter()
            .filter(|c| {
                c.state == ProcessState::Pending
                    && !workflows.serves(c.workflow.as_deref(), c.version.as_deref())
            })
            .map(|c| (c.label(), c.orders))
            .collect();
        for (workflow, orders) in &waiting {
            warn!(%workflow, orders, instance_id = %self.cfg.instance, "Pending orders of a workflow version that is neither stored nor loaded here wait (`orderly migrate --workflow FILE` with its file stores it; the leading supervisor raises an alert)");
        }
        Ok(waiting)
    }
}

/// How a claim pass ended, for a claim loop deciding whether to claim again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimEnd {
    /// It took as many as it asked for: more may be waiting, so claim again at once.
    Batch,
    /// It took fewer than it asked for (none, maybe): everything claimable when it
    /// looked was taken. Claiming again at once would take the write turn to find
    /// nothing; wait for the next order made claimable (or the poll).
    Drained,
    /// It holds its maximum in flight and asked for none.
    Full,
}
