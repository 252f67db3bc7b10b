//! Carrying out the moves the plan decided (`Next`): step writes in one batch,
//! completions in one batch, parks in one transaction, and the ends of orders (fail,
//! finish undoing, cancel) one by one. A write that ends a compensation is followed by
//! the finish the order is marked for.

use orderly_core::messages::{OrderStatus, StatusNotice};
use orderly_core::store::{Completion, StepWrite};
use orderly_core::transport::Envelope;
use orderly_core::{Fence, ProcessState};
use tracing::{debug, info, warn};

use crate::{Next, Pass, Scheduler};

impl Scheduler {
    /// Carries out planned moves: writes in one batch, completions in one batch, parks
    /// together, the rest one by one.
    pub(crate) async fn execute(
        &self,
        nexts: Vec<Next>,
        pass: &mut Pass,
    ) -> orderly_core::Result<()> {
        let mut writes = Vec::new();
        let mut completions = Vec::new();
        let mut ends = Vec::new();
        let mut parks = Vec::new();
        for next in nexts {
            match next {
                Next::Write(w) => writes.push(w),
                Next::Park(p) => parks.push(p),
                Next::Complete(c) => completions.push(c),
                Next::Finish(w, finish_as, notify_to) => {
                    ends.extend(self.last_undo(w, finish_as, notify_to, pass).await?);
                }
                end => ends.push(end),
            }
        }
        self.write_batch(&writes, pass).await?;
        if !completions.is_empty() {
            self.complete(completions, pass).await?;
        }
        self.park(&parks, pass).await?;
        for end in ends {
            self.end(end, pass).await?;
        }
        Ok(())
    }

    /// Records the last compensation of an order, then plans the finish it is marked
    /// for; `None` if the store refused the write (the order moved on).
    async fn last_undo(
        &self,
        w: StepWrite,
        finish_as: Option<ProcessState>,
        notify_to: Option<String>,
        pass: &mut Pass,
    ) -> orderly_core::Result<Option<Next>> {
        match single(self.store.record_steps(std::slice::from_ref(&w)).await?) {
            Ok(()) => {
                let steps = self.store.steps(&w.fence.order_id).await?;
                Ok(Some(Self::plan_finish(
                    &w.fence,
                    finish_as,
                    &steps,
                    notify_to.as_deref(),
                )))
            }
            Err(e) if e.is_retryable() => Err(e),
            Err(e) => {
                debug!(order_id = %w.fence.order_id, error = %e, "write refused: the order moved on");
                pass.dropped += 1;
                Ok(None)
            }
        }
    }

    /// Records step writes in one batch, counting the requests they send; a write the
    /// store refuses (the order moved on) is dropped, an outage fails the batch.
    async fn write_batch(&self, writes: &[StepWrite], pass: &mut Pass) -> orderly_core::Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        let verdicts = self.store.record_steps(writes).await?;
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
        Ok(())
    }

    /// Ends an order: in Error, after its undoing (in Error, or into the fresh run an
    /// operator's retry waits for), or Cancelled after its undoing.
    async fn end(&self, end: Next, pass: &mut Pass) -> orderly_core::Result<()> {
        let (fence, outcome) = match end {
            Next::Fail(fence, error) => {
                let outcome = self.store.fail(&fence, &error, &[]).await.map(|()| {
                    warn!(order_id = %fence.order_id, error = %error, "order failed");
                    pass.failed += 1;
                });
                (fence, outcome)
            }
            Next::Undone(fence, error) => {
                let outcome = self.store.finish_undone(&fence, &error).await.map(|fresh| {
                    if let Some(generation) = fresh {
                        info!(order_id = %fence.order_id, generation, "undoing finished: the operator's retry runs afresh");
                    } else {
                        warn!(order_id = %fence.order_id, error = %error, "order failed");
                        pass.failed += 1;
                    }
                });
                (fence, outcome)
            }
            Next::Cancel(fence, notify_to) => {
                let outcome = self
                    .cancel_undone(&fence, notify_to.as_deref())
                    .await
                    .map(|()| {
                        info!(order_id = %fence.order_id, "order cancelled after compensation");
                        pass.cancelled += 1;
                    });
                (fence, outcome)
            }
            Next::Write(_) | Next::Complete(_) | Next::Finish(..) | Next::Park(_) => return Ok(()),
        };
        match outcome {
            Err(e) if e.is_retryable() => Err(e),
            Err(e) => {
                debug!(order_id = %fence.order_id, error = %e, "the order's end refused: it moved on");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }

    /// Ends an undone order Cancelled, telling the client's queue (`notify_to`), if any.
    async fn cancel_undone(
        &self,
        fence: &Fence,
        notify_to: Option<&str>,
    ) -> orderly_core::Result<()> {
        let notice = StatusNotice {
            order_id: fence.order_id.clone(),
            status: OrderStatus::Cancelled,
            step: None,
            detail: Some("cancelled; completed steps undone".into()),
        };
        let sends: Vec<Envelope> = notice
            .envelope(notify_to, &fence.epoch.to_string())
            .into_iter()
            .collect();
        self.store
            .finish_cancelled(fence, "cancelled; completed steps undone", &sends)
            .await
    }

    /// Completes orders whose every step is done, in one batch.
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

/// The one verdict of a one-write batch.
pub(crate) fn single(mut verdicts: Vec<orderly_core::Result<()>>) -> orderly_core::Result<()> {
    verdicts.pop().unwrap_or(Ok(()))
}
