//! Step writes: the fenced touch of the order (its step progress decided here, in
//! [`progress`]), the step records, and their history, in the caller's transaction.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use orderly_core::store::{StepUpdate, StepWrite, bounded_text};
use orderly_core::transport::{QueueName, ReceivedMessage};
use orderly_core::{Error, Fence, ProcessState, Result, StepStatus};

use super::{SqlStore, step_kind};
use crate::driver::Ending;
use crate::driver::{Driver, HoldFor, StepRow, Touch};
use crate::fence::refusal;

/// What a write's updates do to the order's row: the step it moves to (the step after
/// the highest one that succeeded; -1: none), and the error of the last one that
/// failed (`None`: no step failed; `Some(None)`: one failed without a detail).
pub(crate) fn progress(updates: &[StepUpdate]) -> (i32, Option<Option<String>>) {
    let new_step = updates
        .iter()
        .filter(|u| u.status == StepStatus::Succeeded)
        .map(|u| u.index + 1)
        .max()
        .unwrap_or(-1);
    let failed = updates
        .iter()
        .rev()
        .find(|u| u.status == StepStatus::Failed)
        .map(|u| u.detail.as_deref().map(|d| bounded_text(d).to_owned()));
    (new_step, failed)
}

/// The touch of `fence`'s order for `updates`, at step `expect` (if given), completing
/// the order with them if `complete`.
pub(crate) fn touch<'a>(
    fence: &'a Fence,
    expect: Option<i32>,
    updates: &[StepUpdate],
    complete: bool,
) -> Touch<'a> {
    let (new_step, failed) = progress(updates);
    Touch {
        fence,
        expect: expect.unwrap_or(-1),
        new_step,
        failed: failed.is_some(),
        error: failed.flatten(),
        complete,
    }
}

/// The record (and history entry) of one update.
pub(crate) fn step_row<'a>(fence: &'a Fence, step: &'a StepUpdate) -> StepRow<'a> {
    StepRow {
        fence,
        index: step.index,
        name: &step.name,
        status: step.status.as_str(),
        idempotency_key: &step.idempotency_key,
        detail: step.detail.as_deref().map(|d| bounded_text(d).to_owned()),
        kind: step_kind(step.status).as_str(),
        irreversible: step.irreversible,
        attempts: i32::from(step.status == StepStatus::Started),
    }
}

/// Refuses an update with an out-of-range index or name.
pub(crate) fn check_update(step: &StepUpdate) -> Result<()> {
    if step.index < 0 || step.name.is_empty() || step.name.len() > 100 {
        return Err(orderly_core::ValidationError::new(
            "step",
            "index must be >= 0 and name 1 to 100 characters",
        )
        .into());
    }
    Ok(())
}

/// What [`SqlStore::write_and_send`] did: per write its refusal (`None`: applied) and
/// whether its delivery was ended (none without deliveries), and the queues to wake
/// once it has committed.
pub(crate) struct WrittenAndSent {
    pub refusals: Vec<Option<Error>>,
    pub ended: Vec<bool>,
    pub woken: Vec<QueueName>,
}

/// The writes of a batch that go together ([`Driver::write_steps`]: with updates, for
/// distinct orders and distinct steps), and those applied one after the other.
fn bulk_and_alone(writes: &[StepWrite]) -> (Vec<usize>, Vec<usize>) {
    let mut seen = HashSet::new();
    (0..writes.len()).partition(|&i| {
        let w = &writes[i];
        let mut steps = HashSet::new();
        !w.updates.is_empty()
            && w.updates.iter().all(|u| steps.insert(u.index))
            && seen.insert(w.fence.order_id.as_str())
    })
}

/// The deliveries of `writes` (`holds`, one per write; none without them), each ended
/// if its write is applied.
fn holds_of<'a>(writes: &'a [StepWrite], holds: Option<&'a [ReceivedMessage]>) -> Vec<HoldFor<'a>> {
    holds
        .unwrap_or_default()
        .iter()
        .zip(writes)
        .map(|(held, w)| HoldFor {
            order_id: w.fence.order_id.as_str(),
            held,
        })
        .collect()
}

/// How a write's delivery ends, by its refusal: an applied write's in the write itself;
/// one refused because the order moved on after it; one refused for a reason that may
/// pass is kept, to be tried again, and one the store cannot use is kept for the
/// caller to dead-letter with the reason.
fn ending_of(refusal: Option<&Error>) -> Ending {
    match refusal {
        None => Ending::InWrite,
        Some(e) if e.is_moved_on() => Ending::After,
        Some(_) => Ending::Kept,
    }
}

/// The touches and step rows of the writes `bulk`.
fn touches_and_rows<'w>(
    writes: &'w [StepWrite],
    bulk: &[usize],
) -> (Vec<Touch<'w>>, Vec<StepRow<'w>>) {
    let touches = bulk
        .iter()
        .map(|&i| {
            let w = &writes[i];
            touch(&w.fence, w.expect_step, &w.updates, w.complete)
        })
        .collect();
    let rows = bulk
        .iter()
        .flat_map(|&i| {
            writes[i]
                .updates
                .iter()
                .map(move |u| step_row(&writes[i].fence, u))
        })
        .collect();
    (touches, rows)
}

impl<D: Driver> SqlStore<D> {
    /// Why a step write matched no row: [`refusal`], or `StaleStep` when only the step
    /// guard failed.
    pub(crate) async fn explain_step(
        conn: &mut D::Conn,
        fence: &Fence,
        now: DateTime<Utc>,
        expect: Option<i32>,
    ) -> Error {
        let row = match Self::fetch_state(conn, &fence.order_id).await {
            Ok(row) => row,
            Err(e) => return e,
        };
        if let (Some(r), Some(expected)) = (&row, expect)
            && r.locked_by.as_ref() == Some(&fence.owner)
            && r.lock_epoch == fence.epoch
            && r.process_state == ProcessState::Processing
            && r.complete_by.is_some_and(|d| d > now)
            && r.current_step != expected
        {
            return Error::StaleStep {
                order_id: fence.order_id.clone(),
                expected,
                current: r.current_step,
            };
        }
        refusal(fence, row, now, ProcessState::Processing)
    }

    /// The writes of a batch in the caller's transaction: `Some(refusal)` for each
    /// refused write (nothing of it written). Writes with updates, for distinct orders
    /// and distinct steps, go together ([`Driver::write_steps`]: the touch, records and
    /// history of all of them); the others one after the other, in order.
    pub(crate) async fn apply_step_writes(
        conn: &mut D::Conn,
        writes: &[StepWrite],
        now: DateTime<Utc>,
    ) -> Result<Vec<Option<Error>>> {
        let (bulk, alone) = bulk_and_alone(writes);
        let mut refusals: Vec<Option<Error>> = writes.iter().map(|_| None).collect();
        if !bulk.is_empty() {
            let (touches, rows) = touches_and_rows(writes, &bulk);
            let touched = D::write_steps(conn, now, &touches, rows).await?;
            for &i in &bulk {
                let w = &writes[i];
                if !touched.contains(w.fence.order_id.as_str()) {
                    refusals[i] =
                        Some(Self::explain_step(conn, &w.fence, now, w.expect_step).await);
                }
            }
        }
        for i in alone {
            refusals[i] = Self::apply_step_write(conn, &writes[i], now).await?;
        }
        Ok(refusals)
    }

    /// [`Self::apply_step_writes`] with, in the same statement, the sends of the
    /// writes applied and the completion of their deliveries (`holds`, one per write):
    /// where the dialect has such a statement ([`Driver::write_steps_sending`]), the
    /// store sends through its queue, and every write and send can go in it (writes
    /// with updates, for distinct orders and distinct steps; sends as
    /// [`Self::sends_for`]). `None` otherwise, with nothing done: the caller applies,
    /// then sends.
    pub(crate) async fn write_and_send(
        &self,
        conn: &mut D::Conn,
        writes: &[StepWrite],
        now: DateTime<Utc>,
        holds: Option<&[ReceivedMessage]>,
    ) -> Result<Option<WrittenAndSent>> {
        if !D::SQL.writes_send || self.delivery != crate::Delivery::Queue || writes.is_empty() {
            return Ok(None);
        }
        let (bulk, alone) = bulk_and_alone(writes);
        if !alone.is_empty() {
            return Ok(None);
        }
        let Some(sends) = self
            .sends_for(
                &mut *conn,
                writes
                    .iter()
                    .map(|w| (w.fence.order_id.as_str(), w.sends.as_slice())),
            )
            .await
            .map_err(|e| Error::Send(Box::new(e)))?
        else {
            return Ok(None);
        };
        let holds_for = holds_of(writes, holds);
        let (touches, rows) = touches_and_rows(writes, &bulk);
        let Some(sent) = D::write_steps_sending(
            conn,
            now,
            &touches,
            rows,
            &sends,
            &holds_for,
            self.wakeups.origin(),
        )
        .await?
        else {
            return Ok(None);
        };
        let mut refusals: Vec<Option<Error>> = writes.iter().map(|_| None).collect();
        for (i, w) in writes.iter().enumerate() {
            if !sent.applied.contains(w.fence.order_id.as_str()) {
                refusals[i] = Some(Self::explain_step(conn, &w.fence, now, w.expect_step).await);
            }
        }
        let woken = sent.woken(&sends);
        let ended = self
            .settle_sent(conn, now, &sent, writes.len(), holds, |i| {
                ending_of(refusals[i].as_ref())
            })
            .await?;
        Ok(Some(WrittenAndSent {
            refusals,
            ended,
            woken,
        }))
    }

    /// One write, update by update: `Some(refusal)` if it was refused (nothing of it
    /// written), `None` if applied. A write without updates only checks the fence.
    async fn apply_step_write(
        conn: &mut D::Conn,
        w: &StepWrite,
        now: DateTime<Utc>,
    ) -> Result<Option<Error>> {
        let fence = &w.fence;
        if w.updates.is_empty() {
            let touched = D::write_steps(
                conn,
                now,
                &[touch(fence, w.expect_step, &[], w.complete)],
                Vec::new(),
            )
            .await?;
            if touched.is_empty() {
                return Ok(Some(
                    Self::explain_step(conn, fence, now, w.expect_step).await,
                ));
            }
            return Ok(None);
        }
        for (i, step) in w.updates.iter().enumerate() {
            let expect = if i == 0 { w.expect_step } else { None };
            // The order completes with its last update.
            let complete = w.complete && i + 1 == w.updates.len();
            let touched = D::write_steps(
                conn,
                now,
                &[touch(fence, expect, std::slice::from_ref(step), complete)],
                vec![step_row(fence, step)],
            )
            .await?;
            if touched.is_empty() {
                if i == 0 {
                    return Ok(Some(Self::explain_step(conn, fence, now, expect).await));
                }
                // The first update held under this transaction's lock: only a concurrent
                // writer could break it, and the caller may retry.
                return Err(Error::Unavailable(
                    format!(
                        "write to order {} raced with another writer; retry",
                        fence.order_id
                    )
                    .into(),
                ));
            }
        }
        Ok(None)
    }
}
