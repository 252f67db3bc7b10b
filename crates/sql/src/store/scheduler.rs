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

use super::steps::{check_update, step_row, touch};
use super::{Event, SqlStore, checked_claim, timeout_micros};
use crate::driver::{Driver, q};
use crate::error::db;
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

mod ending;
mod recording;

use ending::*;
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

    async fn message_key(
        &self,
        fresh: orderly_core::signing::MessageKey,
        by: &str,
    ) -> Result<orderly_core::signing::MessageKey> {
        let mut conn = self.driver.acquire().await?;
        let stored = |row: Option<D::Row>| -> Result<Option<orderly_core::signing::MessageKey>> {
            row.map(|r| {
                let secret: String = Cols(&r).get("secret")?;
                orderly_core::signing::MessageKey::from_hex(&secret)
                    .map_err(orderly_core::Error::Corrupt)
            })
            .transpose()
        };
        let row = q(st::MESSAGE_KEY)
            .fetch_optional::<D>(&mut conn)
            .await
            .map_err(db)?;
        if let Some(key) = stored(row)? {
            return Ok(key);
        }
        let now = self.driver.now(&mut conn).await?;
        q(st::RECORD_MESSAGE_KEY)
            .bind(fresh.to_hex())
            .bind(Ts(now))
            .bind(by.to_owned())
            .execute::<D>(&mut conn)
            .await
            .map_err(db)?;
        // Whoever stored first, this is the one key.
        let row = q(st::MESSAGE_KEY)
            .fetch_optional::<D>(&mut conn)
            .await
            .map_err(db)?;
        stored(row)?.ok_or_else(|| {
            orderly_core::Error::Corrupt("the message key was stored but cannot be read".into())
        })
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
