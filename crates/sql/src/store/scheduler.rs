//! The scheduler's port: claim, record steps, complete, fail, hand back, compensate,
//! resume after a restart.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::step::StepRecord;
use orderly_core::store::{
    BatchOutcome, ClaimRequest, ClaimedOrder, Completion, Consumed, SchedulerStore, StepUpdate,
    StepWrite, Taken, WorkflowCount, bounded_text, check_consuming,
};
use orderly_core::transport::{Envelope, QueueName, ReceivedMessage};
use orderly_core::{Epoch, Fence, InstanceId, OrderId, ProcessState, Result};

use super::steps::{WrittenAndSent, check_update, step_row, touch};
use super::{Event, SqlStore, checked_claim, timeout_micros};
use crate::driver::{Driver, Q, q};
use crate::error::db;
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

/// A fenced write that ends or changes the owner's hold: `statement` binds `$1` order,
/// `$2` owner, `$3` epoch, `$4` its argument (or now), `$5` now; `kind` goes to the
/// history and `sends` are enqueued with it.
struct OwnerEnd<'a> {
    statement: &'static str,
    arg: Option<String>,
    target: ProcessState,
    kind: HistoryKind,
    reason: &'a str,
    sends: &'a [Envelope],
}

impl<D: Driver> SqlStore<D> {
    async fn finish_owned(&self, fence: &Fence, end: OwnerEnd<'_>) -> Result<()> {
        let (tx, now) = self.begin().await?;
        self.finish_owned_in(tx, now, fence, end).await
    }

    /// [`Self::finish_owned`] in the open transaction `tx`, begun at `now`.
    async fn finish_owned_in(
        &self,
        mut tx: D::Tx,
        now: chrono::DateTime<chrono::Utc>,
        fence: &Fence,
        end: OwnerEnd<'_>,
    ) -> Result<()> {
        let OwnerEnd {
            statement,
            arg,
            target,
            kind,
            reason,
            sends,
        } = end;
        let fenced: Q<'_> = q(statement)
            .bind(fence.order_id.as_str())
            .bind(fence.owner.as_str())
            .bind(fence.epoch.0);
        let fenced = match arg {
            Some(text) => fenced.bind(text),
            None => fenced.bind(Ts(now)),
        };
        let n = fenced
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        if n == 0 {
            return Err(Self::explain(&mut tx, fence, now, target).await);
        }
        let event = Event {
            reason: Some(reason),
            ..Event::by_owner(fence, now, kind, target)
        };
        Self::append(&mut tx, event).await?;
        if target == ProcessState::Pending {
            self.commit_claimable(tx, now, sends).await
        } else {
            self.commit_with(tx, now, sends).await
        }
    }

    /// Completes a batch of distinct orders; refusals are explained after the commit.
    async fn complete_batch(&self, completions: &[Completion]) -> Result<BatchOutcome> {
        let fences: Vec<&Fence> = completions.iter().map(|c| &c.fence).collect();
        let done = if completions.iter().all(|c| c.sends.is_empty()) {
            self.driver.complete(&fences).await?
        } else {
            let (mut tx, now) = self.begin().await?;
            let done = D::complete_in(&mut tx, now, &fences).await?;
            // Only completed orders' messages are sent.
            let sends: Vec<Envelope> = completions
                .iter()
                .filter(|c| done.contains(c.fence.order_id.as_str()))
                .flat_map(|c| c.sends.iter().cloned())
                .collect();
            self.commit_with(tx, now, &sends).await?;
            done
        };
        let (completed, refused): (Vec<&Fence>, Vec<&Fence>) = fences
            .iter()
            .partition(|f| done.contains(f.order_id.as_str()));
        let mut outcome = BatchOutcome {
            completed: completed.iter().map(|f| f.order_id.clone()).collect(),
            refused: Vec::with_capacity(refused.len()),
        };
        if !refused.is_empty() {
            let mut conn = self.driver.acquire().await?;
            let now = self.driver.now(&mut conn).await?;
            for fence in refused {
                let why = Self::explain(&mut conn, fence, now, ProcessState::Processed).await;
                outcome.refused.push((fence.order_id.clone(), why));
            }
        }
        Ok(outcome)
    }
}

/// The owner's end of an order in Error with `error` (cut to the stored length), a
/// failure counted like a timeout, sending `sends`.
fn failing<'a>(error: &'a str, sends: &'a [Envelope]) -> OwnerEnd<'a> {
    let error = bounded_text(error);
    OwnerEnd {
        statement: st::FAIL,
        arg: Some(error.to_owned()),
        target: ProcessState::Error,
        kind: HistoryKind::Failed,
        reason: error,
        sends,
    }
}

#[async_trait]
impl<D: Driver> SchedulerStore for SqlStore<D> {
    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, instance_id = %request.owner, limit = request.limit))]
    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedOrder>> {
        let timeout = checked_claim(request)?;
        let claimed = self.driver.claim(request, timeout).await?;
        self.driver.stats().batch("claim", claimed.len());
        Ok(claimed)
    }

    async fn wait_claimable(&self, seen: &mut u64, within: std::time::Duration) {
        self.wait_claimable_for(seen, within).await;
    }

    async fn claim_and_start(
        &self,
        request: &ClaimRequest,
        plan: &(dyn for<'c> Fn(&'c ClaimedOrder) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Vec<(ClaimedOrder, bool)>> {
        let timeout = checked_claim(request)?;
        let mut tx = self.driver.begin_claim().await?;
        let Some((claimed, now)) = self.driver.claim_first(&mut tx, request, timeout).await? else {
            self.driver.stats().batch("claim", 0);
            return Ok(Vec::new());
        };
        self.driver.stats().batch("claim", claimed.len());
        let planned: Vec<Option<StepWrite>> = claimed.iter().map(plan).collect();
        let started: Vec<bool> = planned.iter().map(Option::is_some).collect();
        let writes: Vec<StepWrite> = planned.into_iter().flatten().collect();
        if let Some(done) = self.write_and_send(&mut tx, &writes, now, None).await? {
            if let Some(refused) = done.refusals.into_iter().flatten().next() {
                return Err(refused);
            }
            D::commit(tx).await.map_err(db)?;
            self.wake_queues(&done.woken);
            return Ok(claimed.into_iter().zip(started).collect());
        }
        let refusals = Self::apply_step_writes(&mut tx, &writes, now).await?;
        if let Some(refused) = refusals.into_iter().flatten().next() {
            // Just claimed in this transaction: a refusal means a planning error.
            // Nothing is claimed or sent.
            return Err(refused);
        }
        let sends: Vec<Envelope> = writes.into_iter().flat_map(|w| w.sends).collect();
        self.commit_with(tx, now, &sends).await?;
        Ok(claimed.into_iter().zip(started).collect())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch, step = step.index, status = %step.status))]
    async fn record_step(
        &self,
        fence: &Fence,
        step: &StepUpdate,
        sends: &[Envelope],
    ) -> Result<StepRecord> {
        check_update(step)?;
        let (mut tx, now) = self.begin().await?;
        let touched = D::write_steps(
            &mut tx,
            now,
            &[touch(fence, None, std::slice::from_ref(step), false)],
            vec![step_row(fence, step)],
        )
        .await?;
        if touched.is_empty() {
            return Err(Self::explain(&mut tx, fence, now, ProcessState::Processing).await);
        }
        let record = Self::fetch_steps(&mut tx, &fence.order_id)
            .await?
            .into_iter()
            .find(|r| r.index == step.index)
            .ok_or_else(|| {
                crate::error::corrupt("order_steps", "the step just written is missing")
            })?;
        self.commit_with(tx, now, sends).await?;
        Ok(record)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
    async fn extend(&self, fence: &Fence, by: std::time::Duration) -> Result<DateTime<Utc>> {
        let by = chrono::Duration::microseconds(timeout_micros(by)?);
        let (mut tx, now) = self.begin().await?;
        let deadline = q(st::EXTEND)
            .bind(fence.order_id.as_str())
            .bind(fence.owner.as_str())
            .bind(fence.epoch.0)
            .bind(Ts(now + by))
            .bind(Ts(now))
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?;
        match deadline {
            Some(row) => {
                let deadline = Cols(&row).ts("complete_by")?;
                D::commit(tx).await.map_err(db)?;
                Ok(deadline)
            }
            None => Err(Self::explain(&mut tx, fence, now, ProcessState::Processing).await),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, batch = completions.len()))]
    async fn complete_many(&self, completions: &[Completion]) -> Result<BatchOutcome> {
        if completions.is_empty() {
            return Ok(BatchOutcome::default());
        }
        // The same order twice in one batch completes (and is reported) once.
        let mut seen = HashSet::with_capacity(completions.len());
        if completions.iter().all(|c| seen.insert(&c.fence.order_id)) {
            return self.complete_batch(completions).await;
        }
        let mut seen = HashSet::with_capacity(completions.len());
        let unique: Vec<Completion> = completions
            .iter()
            .filter(|c| seen.insert(&c.fence.order_id))
            .cloned()
            .collect();
        self.complete_batch(&unique).await
    }

    /// Error: the `order_state_raises_alert` trigger raises its alert.
    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
    async fn fail(&self, fence: &Fence, error: &str, sends: &[Envelope]) -> Result<()> {
        self.finish_owned(fence, failing(error, sends)).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
    async fn finish_undone(&self, fence: &Fence, error: &str) -> Result<Option<i32>> {
        let (mut tx, now) = self.begin().await?;
        let afresh = q(st::RUN_AFRESH_AFTER_UNDO)
            .bind(fence.order_id.as_str())
            .bind(fence.owner.as_str())
            .bind(fence.epoch.0)
            .bind(Ts(now))
            .bind(Ts(now))
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?;
        let Some(row) = afresh else {
            return self
                .finish_owned_in(tx, now, fence, failing(error, &[]))
                .await
                .map(|()| None);
        };
        let generation: i32 = Cols(&row).get("generation")?;
        q(st::CLEAR_STEPS)
            .bind(fence.order_id.as_str())
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        let reason = format!(
            "{}; undoing finished, so the operator's retry runs afresh from the first step (generation {generation})",
            bounded_text(error)
        );
        let event = Event {
            reason: Some(&reason),
            ..Event::by_owner(
                fence,
                now,
                HistoryKind::RetriedAfresh,
                ProcessState::Pending,
            )
        };
        Self::append(&mut tx, event).await?;
        self.commit_claimable(tx, now, &[]).await?;
        Ok(Some(generation))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
    async fn release(&self, fence: &Fence, reason: &str) -> Result<()> {
        let end = OwnerEnd {
            statement: st::RELEASE,
            arg: None,
            target: ProcessState::Pending,
            kind: HistoryKind::Released,
            reason,
            sends: &[],
        };
        self.finish_owned(fence, end).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, batch = parks.len()))]
    async fn park_many(
        &self,
        parks: &[orderly_core::service::Park],
    ) -> Result<Vec<Result<orderly_core::service::Parked>>> {
        self.park_batch(parks).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, batch = writes.len()))]
    async fn record_steps(&self, writes: &[StepWrite]) -> Result<Vec<Result<()>>> {
        Ok(self.record_step_batch(writes, None).await?.outcomes)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, batch = writes.len()))]
    async fn record_steps_consuming(
        &self,
        writes: &[StepWrite],
        messages: &[ReceivedMessage],
    ) -> Result<Consumed<Result<()>>> {
        check_consuming(writes.len(), messages)?;
        self.record_step_batch(writes, Some(messages)).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, queue = %queue))]
    async fn take_and_record(
        &self,
        queue: &QueueName,
        max: u32,
        wait: std::time::Duration,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Option<Taken>> {
        if self.delivery != crate::Delivery::Queue {
            return Ok(None);
        }
        self.take_with(queue, max, wait, |tx, now, messages| {
            self.record_taken(tx, now, messages, plan)
        })
        .await
        .map(Some)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, instance_id = %owner))]
    async fn resume_owned(&self, owner: &InstanceId) -> Result<Vec<ClaimedOrder>> {
        let (mut tx, now) = self.begin().await?;
        let rows = q(st::RESUME_OWNED)
            .bind(owner.as_str())
            .bind(Ts(now))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?;
        let mut resumed = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let order_id = c.order_id("order_id")?;
            let details = Self::fetch_details(&mut tx, &order_id).await?;
            let fence = Fence {
                order_id,
                owner: owner.clone(),
                epoch: Epoch(c.get("lock_epoch")?),
            };
            let event = Event {
                reason: Some("scheduler restarted with the same instance id"),
                ..Event::by_owner(&fence, now, HistoryKind::Resumed, ProcessState::Processing)
            };
            Self::append(&mut tx, event).await?;
            resumed.push(c.claimed(fence, details)?);
        }
        D::commit(tx).await.map_err(db)?;
        Ok(resumed)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
    async fn begin_compensation(
        &self,
        fence: &Fence,
        finish_as: ProcessState,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<()> {
        if !matches!(finish_as, ProcessState::Error | ProcessState::Cancelled) {
            return Err(orderly_core::ValidationError::new(
                "finish_as",
                "must be Error or Cancelled",
            )
            .into());
        }
        let end = OwnerEnd {
            statement: st::BEGIN_COMPENSATION,
            arg: Some(finish_as.as_str().to_owned()),
            target: ProcessState::Processing,
            kind: HistoryKind::CompensationStarted,
            reason,
            sends,
        };
        self.finish_owned(fence, end).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
    async fn finish_cancelled(
        &self,
        fence: &Fence,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<()> {
        let end = OwnerEnd {
            statement: st::FINISH_CANCELLED,
            arg: None,
            target: ProcessState::Cancelled,
            kind: HistoryKind::Cancelled,
            reason,
            sends,
        };
        self.finish_owned(fence, end).await
    }

    async fn workflows_in_flight(&self) -> Result<Vec<WorkflowCount>> {
        let mut conn = self.driver.acquire().await?;
        let rows = q(st::WORKFLOWS_IN_FLIGHT)
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                Ok(WorkflowCount {
                    workflow: c.get("workflow")?,
                    version: c.get("workflow_version")?,
                    state: c.state("process_state")?,
                    orders: c.get("n")?,
                })
            })
            .collect()
    }

    async fn record_workflows(
        &self,
        workflows: &[std::sync::Arc<orderly_core::workflow::Workflow>],
        by: &str,
    ) -> Result<usize> {
        let mut conn = self.driver.acquire().await?;
        let now = self.driver.now(&mut conn).await?;
        let mut added = 0;
        for w in workflows {
            added += q(st::RECORD_WORKFLOW)
                .bind(w.name.clone())
                .bind(w.version())
                .bind(w.to_stored())
                .bind(Ts(now))
                .bind(by.to_owned())
                .execute::<D>(&mut conn)
                .await
                .map_err(db)?;
        }
        Ok(usize::try_from(added).unwrap_or(usize::MAX))
    }

    async fn stored_workflows(&self) -> Result<Vec<orderly_core::store::StoredWorkflow>> {
        let mut conn = self.driver.acquire().await?;
        let rows = q(st::STORED_WORKFLOWS)
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                Ok(orderly_core::store::StoredWorkflow {
                    reference: orderly_core::workflow::WorkflowRef {
                        name: c.get("name")?,
                        version: c.get("version")?,
                    },
                    definition: c.get("definition")?,
                    first_seen_at: c.ts("first_seen_at")?,
                    first_seen_by: c.get("first_seen_by")?,
                })
            })
            .collect()
    }

    async fn count_owned(&self, owner: &InstanceId) -> Result<i64> {
        let mut conn = self.driver.acquire().await?;
        let row = q(st::COUNT_OWNED)
            .bind(owner.as_str())
            .fetch_one::<D>(&mut conn)
            .await
            .map_err(db)?;
        Cols(&row).get("n")
    }

    async fn owned(&self, owner: &InstanceId) -> Result<Vec<Fence>> {
        let mut conn = self.driver.acquire().await?;
        q(st::OWNED)
            .bind(owner.as_str())
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok(Fence {
                    order_id: c.order_id("order_id")?,
                    owner: owner.clone(),
                    epoch: Epoch(c.get("lock_epoch")?),
                })
            })
            .collect()
    }

    async fn steps(&self, order_id: &OrderId) -> Result<Vec<StepRecord>> {
        let mut conn = self.driver.acquire().await?;
        Self::fetch_steps(&mut conn, order_id).await
    }
}

impl<D: Driver> SqlStore<D> {
    /// A batch of step writes in one transaction, ending the deliveries of the
    /// `messages` that asked for them where the write was applied or refused for good.
    async fn record_step_batch(
        &self,
        writes: &[StepWrite],
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Consumed<Result<()>>> {
        if writes.is_empty() {
            return Ok(Consumed::none(Vec::new()));
        }
        for w in writes {
            w.updates.iter().try_for_each(check_update)?;
        }
        self.driver.stats().batch("record steps", writes.len());
        let (tx, now) = self.begin().await?;
        self.record_in(tx, now, writes, messages).await
    }

    /// Plans a write for each of `messages` (locked in `tx`), applies those planned and
    /// ends their messages in `tx`, and commits.
    async fn record_taken(
        &self,
        tx: D::Tx,
        now: DateTime<Utc>,
        messages: Vec<ReceivedMessage>,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Taken> {
        // A write that fails validation is left to the caller, whose record refuses it.
        let planned: Vec<Option<StepWrite>> = messages
            .iter()
            .map(|m| plan(m).filter(|w| w.updates.iter().try_for_each(check_update).is_ok()))
            .collect();
        let (writes, asked): (Vec<StepWrite>, Vec<ReceivedMessage>) = planned
            .iter()
            .zip(&messages)
            .filter_map(|(w, m)| w.clone().map(|w| (w, m.clone())))
            .unzip();
        let mut recorded: Vec<Option<(Result<()>, bool)>> = messages.iter().map(|_| None).collect();
        if writes.is_empty() {
            D::commit(tx).await.map_err(db)?;
            return Ok(Taken { messages, recorded });
        }
        self.driver.stats().batch("record steps", writes.len());
        let Consumed { outcomes, consumed } =
            self.record_in(tx, now, &writes, Some(&asked)).await?;
        let slots = planned
            .iter()
            .enumerate()
            .filter(|(_, w)| w.is_some())
            .map(|(i, _)| i);
        for ((i, outcome), consumed) in slots.zip(outcomes).zip(consumed) {
            recorded[i] = Some((outcome, consumed));
        }
        Ok(Taken { messages, recorded })
    }

    /// Applies `writes` in `tx`, ends the messages of those settled for good (when
    /// `messages` are given, one per write) and commits with what they send.
    async fn record_in(
        &self,
        mut tx: D::Tx,
        now: DateTime<Utc>,
        writes: &[StepWrite],
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Consumed<Result<()>>> {
        // The last step's record and the completion are one write; where the dialect
        // can, the sends and the completions of the deliveries are in it too.
        if let Some(done) = self.write_and_send(&mut tx, writes, now, messages).await? {
            return self.commit_written(tx, done).await;
        }
        let refusals = Self::apply_step_writes(&mut tx, writes, now).await?;
        let mut verdicts = Vec::with_capacity(writes.len());
        let mut sends = Vec::new();
        for (w, refused) in writes.iter().zip(refusals) {
            match refused {
                None => {
                    sends.extend(w.sends.iter().cloned());
                    verdicts.push(Ok(()));
                }
                Some(refused) => verdicts.push(Err(refused)),
            }
        }
        // A write refused for a reason that may pass keeps its reply, to be tried again;
        // one the store cannot use keeps it for the caller to dead-letter.
        let consuming = self.to_consume(messages, &verdicts, |v: &Result<()>| {
            v.as_ref()
                .err()
                .is_none_or(orderly_core::Error::is_moved_on)
        });
        let ended = self
            .commit_consuming(tx, now, &sends, &consuming.held)
            .await?;
        let consumed = consuming.consumed(ended);
        Ok(Consumed {
            outcomes: verdicts,
            consumed,
        })
    }

    /// Commits what [`Self::write_and_send`] did and wakes the queues it sent to.
    async fn commit_written(
        &self,
        tx: D::Tx,
        done: WrittenAndSent,
    ) -> Result<Consumed<Result<()>>> {
        let WrittenAndSent {
            refusals,
            ended,
            woken,
        } = done;
        D::commit(tx).await.map_err(db)?;
        self.wake_queues(&woken);
        Ok(Consumed {
            outcomes: refusals
                .into_iter()
                .map(|r| r.map_or(Ok(()), Err))
                .collect(),
            consumed: ended,
        })
    }
}
