//! The operator's port: browse orders, retry, cancel (undoing first where steps took
//! effect), alerts.

use async_trait::async_trait;
use orderly_core::history::HistoryKind;
use orderly_core::store::{Alert, Cursor, OperatorStore, OrderFilter, OrderView, Page};
use orderly_core::transport::Envelope;
use orderly_core::workflow::{Workflow, WorkflowRef};
use orderly_core::{Actor, Error, OrderId, ProcessState, Result, StateRow};

use super::{Event, SqlStore};
use crate::driver::{Driver, Q, SqlRow, q};
use crate::error::db;
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

/// An operator's move to `target`, allowed only from the states in `from`.
struct OperatorMove<'a> {
    from: &'a [ProcessState],
    target: ProcessState,
    kind: HistoryKind,
    actor: &'a Actor,
    reason: &'a str,
    sends: &'a [Envelope],
    /// A cancel that undoes first: an order whose steps may have taken effect goes
    /// back to Pending marked to end Cancelled once a scheduler has undone them.
    undo_first: bool,
}

impl<'a> OperatorMove<'a> {
    /// A cancel of a live or failed order: at once, or (`undo_first`) after its steps
    /// that may have taken effect are undone.
    fn cancel(actor: &'a Actor, reason: &'a str, sends: &'a [Envelope], undo_first: bool) -> Self {
        Self {
            from: &[
                ProcessState::Pending,
                ProcessState::Processing,
                ProcessState::Error,
            ],
            target: ProcessState::Cancelled,
            kind: HistoryKind::Cancelled,
            actor,
            reason,
            sends,
            undo_first,
        }
    }
}

/// How often an operator's read-then-move is retried when the order keeps changing.
const OPERATOR_ATTEMPTS: usize = 5;

/// Fills `slots` (every state to report, at zero) from `(process_state, n)` rows.
fn tally<R: SqlRow>(
    rows: &[R],
    mut slots: Vec<(ProcessState, i64)>,
) -> Result<Vec<(ProcessState, i64)>> {
    for r in rows {
        let c = Cols(r);
        let state = c.state("process_state")?;
        let n: i64 = c.get("n")?;
        if let Some(slot) = slots.iter_mut().find(|(s, _)| *s == state) {
            slot.1 += n;
        }
    }
    Ok(slots)
}

impl<D: Driver> SqlStore<D> {
    /// An operator's move of `order_id` to `target`, allowed only from `from`: lock
    /// and read the order's row, check, then a conditional update on (state, epoch).
    /// Tried again without the client's notice if the client's queue does not exist
    /// (and, should the update ever find the row changed, from the start).
    async fn operator_move(&self, order_id: &OrderId, mv: OperatorMove<'_>) -> Result<StateRow> {
        // An order cancelled at once tells the client's queue, if it has one; a
        // client queue that does not exist does not hold up the cancel.
        let mut notify = true;
        for _ in 0..OPERATOR_ATTEMPTS {
            let (mut tx, now) = self.begin().await?;
            // The row is held from here: a scheduler's write to it in flight (a step it
            // starts) is waited for and seen by the reads below, and a later one waits
            // for this move and then finds the order no longer its own.
            let Some(row) = Self::lock_state(&mut tx, order_id).await? else {
                return Err(Error::OrderNotFound(order_id.clone()));
            };
            if !Self::admits(order_id, &row, &mv)? {
                return Ok(row); // already asked for
            }
            let undo = mv.undo_first && Self::undo_needed(&mut tx, order_id).await?;
            let Some((moved, reason)) = Self::apply_move(&mut tx, now, &row, &mv, undo).await?
            else {
                continue;
            };
            match self
                .commit_move(tx, now, &moved, mv.sends, notify.then_some(&reason))
                .await
            {
                Ok(true) => return Ok(moved),
                Ok(false) => notify = false,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unavailable(
            format!(
                "order {order_id} kept changing; {} not applied, retry",
                mv.kind
            )
            .into(),
        ))
    }

    /// Whether `mv` is to be made on the order in `row`: false if it was already asked
    /// for (a cancel waiting for its undo); an error if the order cannot make it.
    fn admits(order_id: &OrderId, row: &StateRow, mv: &OperatorMove<'_>) -> Result<bool> {
        if mv.undo_first
            && row.process_state == ProcessState::Pending
            && row.finish_as == Some(mv.target)
        {
            return Ok(false);
        }
        if !mv.from.contains(&row.process_state) || !row.process_state.can_become(mv.target) {
            return Err(Error::IllegalTransition {
                order_id: order_id.clone(),
                from: row.process_state,
                to: mv.target,
            });
        }
        Ok(true)
    }

    /// Moves the order of the locked `row` as `mv` says (or, with `undo`, back to
    /// Pending to be undone first), with its history entry; a retry is planned as a
    /// fresh run or a continuation. Returns the moved row and the reason recorded;
    /// `None` if the row changed since it was read.
    async fn apply_move(
        tx: &mut D::Conn,
        now: chrono::DateTime<chrono::Utc>,
        row: &StateRow,
        mv: &OperatorMove<'_>,
        undo: bool,
    ) -> Result<Option<(StateRow, String)>> {
        let order_id = &row.order_id;
        let (to, mut kind, finish_as) = if undo {
            (
                ProcessState::Pending,
                HistoryKind::CancelRequested,
                Some(mv.target.as_str()),
            )
        } else {
            (mv.target, mv.kind, None)
        };
        let moved = q(st::OPERATOR_MOVE)
            .bind(order_id.as_str())
            .bind(row.process_state.as_str())
            .bind(Ts(now))
            .bind(row.lock_epoch.0)
            .bind(to.as_str())
            .bind(finish_as)
            .fetch_optional::<D>(&mut *tx)
            .await
            .map_err(db)?;
        let Some(moved) = moved else {
            return Ok(None);
        };
        let mut moved = Cols(&moved).state_row()?;
        let mut reason = mv.reason.to_owned();
        if kind == HistoryKind::Resubmitted {
            (moved, kind) = Self::plan_retry(tx, moved, &mut reason).await?;
        }
        Self::append(
            tx,
            Event {
                order_id,
                at: now,
                actor: mv.actor.as_str(),
                kind,
                from: Some(row.process_state),
                to,
                epoch: moved.lock_epoch.0,
                step: None,
                reason: Some(&reason),
            },
        )
        .await?;
        Ok(Some((moved, reason)))
    }

    /// Refuses a move between versions unless both are stored and `to` is compatible
    /// with `from` (the same steps), naming each difference.
    async fn check_compatible(
        tx: &mut D::Conn,
        from: &WorkflowRef,
        to: &WorkflowRef,
    ) -> Result<()> {
        let mut flows = Vec::with_capacity(2);
        for (field, r) in [("from", from), ("to", to)] {
            let row = q(st::STORED_WORKFLOW)
                .bind(r.name.clone())
                .bind(r.version.clone())
                .fetch_optional::<D>(&mut *tx)
                .await
                .map_err(db)?;
            let Some(row) = row else {
                return Err(orderly_core::ValidationError::new(
                    field,
                    format!("{r} is not stored (`orderly migrate --workflow FILE` stores it)"),
                )
                .into());
            };
            flows.push(Workflow::from_stored(
                &Cols(&row).get::<String>("definition")?,
                r,
            )?);
        }
        flows[0].compatible_with(&flows[1]).map_err(|why| {
            orderly_core::ValidationError::new(
                "to",
                format!(
                    "{to} is not compatible with {from}, so orders pinned to {from} stay on it: {}",
                    why.join("; ")
                ),
            )
            .into()
        })
    }

    /// Whether a cancel must undo first: some step may have taken effect. One that can
    /// never be undone refuses the cancel (undoing the others would leave the order
    /// half undone). Rows of an older version, which do not say whether a step can be
    /// undone, are caught by the scheduler that claims the order to undo it.
    async fn undo_needed(tx: &mut D::Conn, order_id: &OrderId) -> Result<bool> {
        let in_effect = q(st::IN_EFFECT)
            .bind(order_id.as_str())
            .fetch_all::<D>(tx)
            .await
            .map_err(db)?;
        let mut fixed = Vec::new();
        for r in &in_effect {
            let c = Cols(r);
            if c.get::<bool>("irreversible")? {
                fixed.push(c.get::<String>("name")?);
            }
        }
        if !fixed.is_empty() {
            return Err(Error::PastReturn {
                order_id: order_id.clone(),
                steps: fixed.join(", "),
            });
        }
        Ok(!in_effect.is_empty())
    }

    /// Applies the retry `RetryPlan` decides for the order just moved back to Pending:
    /// it continues (nothing changes), finishes undoing first (it stopped half
    /// undone), or runs the workflow again from the first step under the next
    /// generation (some step was undone; its old step records go, the history keeps
    /// them). Says which in `reason`; returns the row and the history kind.
    async fn plan_retry(
        tx: &mut D::Conn,
        moved: StateRow,
        reason: &mut String,
    ) -> Result<(StateRow, HistoryKind)> {
        let order_id = &moved.order_id;
        let steps = Self::fetch_steps(tx, order_id).await?;
        let plan = orderly_core::RetryPlan::for_order(moved.generation, moved.current_step, &steps);
        let statement = match plan {
            orderly_core::RetryPlan::Continue { .. } => {
                return Ok((moved, HistoryKind::Resubmitted));
            }
            orderly_core::RetryPlan::UndoFirst { .. } => st::UNDO_THEN_RETRY,
            orderly_core::RetryPlan::FreshRun { .. } => st::FRESH_RUN,
        };
        let row = q(statement)
            .bind(order_id.as_str())
            .fetch_one::<D>(tx)
            .await
            .map_err(db)?;
        let moved = Cols(&row).state_row()?;
        *reason = format!("{reason} ({})", plan.describe());
        if !matches!(plan, orderly_core::RetryPlan::FreshRun { .. }) {
            return Ok((moved, HistoryKind::Resubmitted));
        }
        q(st::CLEAR_STEPS)
            .bind(moved.order_id.as_str())
            .execute::<D>(tx)
            .await
            .map_err(db)?;
        Ok((moved, HistoryKind::RetriedAfresh))
    }

    /// Commits a move with its `sends` and, where it cancelled the order at once and
    /// `notify` gives the reason, the client's `cancelled` notice. `Ok(false)`: the
    /// client's queue does not exist, nothing was committed, and the move is to be
    /// made again without the notice.
    async fn commit_move(
        &self,
        tx: D::Tx,
        now: chrono::DateTime<chrono::Utc>,
        moved: &StateRow,
        sends: &[Envelope],
        notify: Option<&String>,
    ) -> Result<bool> {
        let notice = notify
            .filter(|_| moved.process_state == ProcessState::Cancelled)
            .and_then(|reason| {
                orderly_core::messages::StatusNotice {
                    order_id: moved.order_id.clone(),
                    status: orderly_core::messages::OrderStatus::Cancelled,
                    step: None,
                    detail: Some(reason.clone()),
                }
                .envelope(
                    moved.reply_to.as_deref(),
                    &format!("op{}", moved.lock_epoch),
                )
            });
        let Some(notice) = notice else {
            if moved.process_state == ProcessState::Pending {
                self.commit_claimable(tx, now, sends).await?;
            } else {
                self.commit_with(tx, now, sends).await?;
            }
            return Ok(true);
        };
        let mut all = sends.to_vec();
        all.push(notice.clone());
        match self.commit_with(tx, now, &all).await {
            Ok(()) => Ok(true),
            Err(Error::Send(inner)) if matches!(&*inner, orderly_core::transport::TransportError::QueueNotFound(q) if *q == notice.queue) =>
            {
                tracing::warn!(order_id = %moved.order_id, queue = %notice.queue, "the client's queue does not exist: cancelled without telling it");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl<D: Driver> OperatorStore for SqlStore<D> {
    async fn list(&self, filter: &OrderFilter) -> Result<Page> {
        let (text, args, limit) = st::list_query(filter, D::SQL.customer_orders);
        let mut query = Q::dynamic(text);
        for arg in args {
            query = match arg {
                st::Arg::Text(s) => query.bind(s),
                st::Arg::Int(i) => query.bind(i),
                st::Arg::Time(t) => query.bind(t),
            };
        }
        let mut conn = self.driver.acquire().await?;
        let rows = query.fetch_all::<D>(&mut conn).await.map_err(db)?;
        let mut orders = rows
            .iter()
            .map(|r| Cols(r).state_row())
            .collect::<Result<Vec<_>>>()?;
        let next = if orders.len() > limit as usize {
            orders.truncate(limit as usize);
            orders.last().map(|o| Cursor {
                created_at: o.created_at,
                order_id: o.order_id.clone(),
            })
        } else {
            None
        };
        Ok(Page { orders, next })
    }

    async fn get(&self, order_id: &OrderId) -> Result<OrderView> {
        let mut conn = self.driver.acquire().await?;
        let state = Self::fetch_state(&mut conn, order_id)
            .await?
            .ok_or_else(|| Error::OrderNotFound(order_id.clone()))?;
        let details = Self::fetch_details(&mut conn, order_id).await?;
        let steps = Self::fetch_steps(&mut conn, order_id).await?;
        let history = q(st::SELECT_HISTORY)
            .bind(order_id.as_str())
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Cols(r).history_event())
            .collect::<Result<Vec<_>>>()?;
        Ok(OrderView {
            state,
            details,
            steps,
            history,
        })
    }

    async fn activity(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<orderly_core::activity::MinuteActivity>> {
        self.activity_since(since).await
    }

    async fn ping(&self) -> Result<()> {
        q("SELECT 1")
            .execute::<D>(&mut *self.driver.acquire().await?)
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn store_now(&self) -> Result<chrono::DateTime<chrono::Utc>> {
        let mut conn = self.driver.acquire().await?;
        self.driver.now(&mut conn).await
    }

    async fn error_causes(&self) -> Result<Vec<orderly_core::triage::ErrorCause>> {
        self.causes_now().await
    }

    async fn error_cause_orders(
        &self,
        cause: &orderly_core::triage::CauseKey,
        limit: u32,
    ) -> Result<Vec<StateRow>> {
        self.cause_orders_now(cause, limit).await
    }

    async fn error_cause_ids(
        &self,
        causes: &[orderly_core::triage::CauseKey],
        limit: u32,
    ) -> Result<Vec<Vec<OrderId>>> {
        self.cause_ids_now(causes, limit).await
    }

    async fn steps_of_many(
        &self,
        orders: &[OrderId],
    ) -> Result<std::collections::HashMap<OrderId, Vec<orderly_core::StepRecord>>> {
        self.steps_of_many_now(orders).await
    }

    async fn count_by_state(&self) -> Result<Vec<(ProcessState, i64)>> {
        let mut conn = self.driver.acquire().await?;
        let mark = q(st::TALLY_MARK)
            .fetch_one::<D>(&mut conn)
            .await
            .map_err(db)?;
        let rows = q(st::COUNT_BY_STATE)
            .bind(Ts(Cols(&mark).ts("upto")?))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        tally(&rows, ProcessState::ALL.iter().map(|s| (*s, 0)).collect())
    }

    async fn finished_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<(ProcessState, i64)>> {
        let mut conn = self.driver.acquire().await?;
        let mark = q(st::TALLY_MARK)
            .fetch_one::<D>(&mut conn)
            .await
            .map_err(db)?;
        // The first whole minute from `since` on: the tallies count whole minutes.
        let first = orderly_core::activity::minute_of(since);
        let first = if first < since {
            first + chrono::Duration::minutes(1)
        } else {
            first
        };
        let rows = q(st::FINISHED_SINCE)
            .bind(Ts(since))
            .bind(Ts(first))
            .bind(Ts(Cols(&mark).ts("upto")?))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        let finals = [
            ProcessState::Processed,
            ProcessState::Error,
            ProcessState::Cancelled,
        ];
        tally(&rows, finals.map(|s| (s, 0)).to_vec())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, from = %from, to = %to, actor = %actor))]
    async fn move_version(
        &self,
        from: &WorkflowRef,
        to: &WorkflowRef,
        states: &[ProcessState],
        actor: &Actor,
        reason: &str,
        limit: u32,
    ) -> Result<Vec<OrderId>> {
        let states = movable(states)?;
        if from == to {
            return Err(
                orderly_core::ValidationError::new("to", "is the version they have").into(),
            );
        }
        let (mut tx, now) = self.begin().await?;
        Self::check_compatible(&mut tx, from, to).await?;
        let rows = q(st::MOVE_VERSION)
            .bind(from.name.clone())
            .bind(from.version.clone())
            .bind(to.version.clone())
            .bind(Ts(now))
            .bind(states[0].as_str())
            .bind(states.last().unwrap_or(&states[0]).as_str())
            .bind(i64::from(limit.min(orderly_core::store::MAX_BATCH)))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?;
        let why = format!("moved from {from} to {to} (compatible): {reason}");
        let mut moved = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let order_id = c.order_id("order_id")?;
            let state = c.state("process_state")?;
            Self::append(
                &mut tx,
                Event {
                    order_id: &order_id,
                    at: now,
                    actor: actor.as_str(),
                    kind: HistoryKind::VersionMoved,
                    from: Some(state),
                    to: state,
                    epoch: c.get("lock_epoch")?,
                    step: None,
                    reason: Some(&why),
                },
            )
            .await?;
            moved.push(order_id);
        }
        D::commit(tx).await.map_err(db)?;
        Ok(moved)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %order_id, actor = %actor))]
    async fn resubmit(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow> {
        let mv = OperatorMove {
            from: &[ProcessState::Error],
            target: ProcessState::Pending,
            kind: HistoryKind::Resubmitted,
            actor,
            reason,
            sends,
            undo_first: false,
        };
        self.operator_move(order_id, mv).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %order_id, actor = %actor))]
    async fn request_cancel(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow> {
        let mv = OperatorMove::cancel(actor, reason, sends, true);
        self.operator_move(order_id, mv).await
    }

    async fn alerts(&self, open_only: bool, limit: u32) -> Result<Vec<Alert>> {
        q(st::LIST_ALERTS)
            .bind(i32::from(open_only))
            .bind(i64::from(limit.clamp(1, orderly_core::store::MAX_BATCH)))
            .fetch_all::<D>(&mut *self.driver.acquire().await?)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Cols(r).alert())
            .collect()
    }

    async fn acknowledge_alert(&self, alert_id: i64, by: &Actor) -> Result<Option<Alert>> {
        let (mut tx, now) = self.begin().await?;
        q(st::ACK_ALERT)
            .bind(alert_id)
            .bind(by.as_str())
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        let row = q(st::ONE_ALERT)
            .bind(alert_id)
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?;
        let alert = row.map(|r| Cols(&r).alert()).transpose()?;
        D::commit(tx).await.map_err(db)?;
        Ok(alert)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %order_id, actor = %actor))]
    async fn cancel(
        &self,
        order_id: &OrderId,
        actor: &Actor,
        reason: &str,
        sends: &[Envelope],
    ) -> Result<StateRow> {
        let mv = OperatorMove::cancel(actor, reason, sends, false);
        self.operator_move(order_id, mv).await
    }
}

/// The states whose orders a version move takes (Pending and Error when none is
/// named); any other is refused, saying why.
fn movable(states: &[ProcessState]) -> Result<Vec<ProcessState>> {
    if let Some(s) = states
        .iter()
        .find(|s| !matches!(s, ProcessState::Pending | ProcessState::Error))
    {
        return Err(orderly_core::ValidationError::new(
            "state",
            format!(
                "{s}: only Pending and Error orders move to another version (an order in \
                 Processing finishes on the version it runs; a finished one has nothing left to run)"
            ),
        )
        .into());
    }
    if states.is_empty() {
        return Ok(vec![ProcessState::Pending, ProcessState::Error]);
    }
    Ok(states.to_vec())
}
