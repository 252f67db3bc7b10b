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
            slot.1 = n;
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
        let OperatorMove {
            from,
            target,
            kind,
            actor,
            reason,
            sends,
            undo_first,
        } = mv;
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
            if undo_first
                && row.process_state == ProcessState::Pending
                && row.finish_as == Some(target)
            {
                return Ok(row); // already asked for
            }
            if !from.contains(&row.process_state) || !row.process_state.can_become(target) {
                return Err(Error::IllegalTransition {
                    order_id: order_id.clone(),
                    from: row.process_state,
                    to: target,
                });
            }
            // The steps that may have taken effect: none, and the cancel is at once;
            // one that can never be undone, and it is refused (undoing the others
            // would leave the order half undone). Rows of an older version, which do
            // not say whether a step can be undone, are caught by the scheduler that
            // claims the order to undo it.
            let mut undo = false;
            if undo_first {
                let mut fixed = Vec::new();
                for r in q(st::IN_EFFECT)
                    .bind(order_id.as_str())
                    .fetch_all::<D>(&mut tx)
                    .await
                    .map_err(db)?
                {
                    undo = true;
                    let c = Cols(&r);
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
            }
            let (to, kind, finish_as) = if undo {
                (
                    ProcessState::Pending,
                    HistoryKind::CancelRequested,
                    Some(target.as_str()),
                )
            } else {
                (target, kind, None)
            };
            let moved = q(st::OPERATOR_MOVE)
                .bind(order_id.as_str())
                .bind(row.process_state.as_str())
                .bind(Ts(now))
                .bind(row.lock_epoch.0)
                .bind(to.as_str())
                .bind(finish_as)
                .fetch_optional::<D>(&mut tx)
                .await
                .map_err(db)?;
            let Some(moved) = moved else { continue };
            let mut moved = Cols(&moved).state_row()?;
            // A retry runs the workflow again from the first step, under the
            // next generation, if any step was undone; first finishes undoing, if it
            // stopped half undone; else it continues.
            let mut reason = reason.to_owned();
            let mut kind = kind;
            if kind == HistoryKind::Resubmitted {
                let steps = Self::fetch_steps(&mut tx, order_id).await?;
                let plan = orderly_core::RetryPlan::for_order(
                    moved.generation,
                    moved.current_step,
                    &steps,
                );
                // Marked to finish undoing first, or restarted at once (its old step
                // records gone, the history keeping them); continuing changes nothing.
                let statement = match plan {
                    orderly_core::RetryPlan::Continue { .. } => None,
                    orderly_core::RetryPlan::UndoFirst { .. } => Some(st::UNDO_THEN_RETRY),
                    orderly_core::RetryPlan::FreshRun { .. } => Some(st::FRESH_RUN),
                };
                if let Some(statement) = statement {
                    let row = q(statement)
                        .bind(order_id.as_str())
                        .fetch_one::<D>(&mut tx)
                        .await
                        .map_err(db)?;
                    moved = Cols(&row).state_row()?;
                    reason = format!("{reason} ({})", plan.describe());
                }
                if matches!(plan, orderly_core::RetryPlan::FreshRun { .. }) {
                    q(st::CLEAR_STEPS)
                        .bind(order_id.as_str())
                        .execute::<D>(&mut tx)
                        .await
                        .map_err(db)?;
                    kind = HistoryKind::RetriedAfresh;
                }
            }
            let reason = reason.as_str();
            Self::append(
                &mut tx,
                Event {
                    order_id,
                    at: now,
                    actor: actor.as_str(),
                    kind,
                    from: Some(row.process_state),
                    to,
                    epoch: moved.lock_epoch.0,
                    step: None,
                    reason: Some(reason),
                },
            )
            .await?;
            let notice = (notify && moved.process_state == ProcessState::Cancelled)
                .then(|| {
                    orderly_core::messages::StatusNotice {
                        order_id: order_id.clone(),
                        status: orderly_core::messages::OrderStatus::Cancelled,
                        step: None,
                        detail: Some(reason.to_owned()),
                    }
                    .envelope(
                        moved.reply_to.as_deref(),
                        &format!("op{}", moved.lock_epoch),
                    )
                })
                .flatten();
            let Some(notice) = notice else {
                if moved.process_state == ProcessState::Pending {
                    self.commit_claimable(tx, now, sends).await?;
                } else {
                    self.commit_with(tx, now, sends).await?;
                }
                return Ok(moved);
            };
            let mut all = sends.to_vec();
            all.push(notice.clone());
            match self.commit_with(tx, now, &all).await {
                Ok(()) => return Ok(moved),
                Err(Error::Send(inner)) if matches!(&*inner, orderly_core::transport::TransportError::QueueNotFound(q) if *q == notice.queue) =>
                {
                    tracing::warn!(order_id = %order_id, queue = %notice.queue, "the client's queue does not exist: cancelled without telling it");
                    notify = false;
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unavailable(
            format!("order {order_id} kept changing; {kind} not applied, retry").into(),
        ))
    }
}

#[async_trait]
impl<D: Driver> OperatorStore for SqlStore<D> {
    async fn list(&self, filter: &OrderFilter) -> Result<Page> {
        let (text, args, limit) = st::list_query(filter, D::SQL.customer_of);
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

    async fn count_by_state(&self) -> Result<Vec<(ProcessState, i64)>> {
        let rows = q(st::COUNT_BY_STATE)
            .fetch_all::<D>(&mut *self.driver.acquire().await?)
            .await
            .map_err(db)?;
        tally(&rows, ProcessState::ALL.iter().map(|s| (*s, 0)).collect())
    }

    async fn finished_since(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<(ProcessState, i64)>> {
        let rows = q(st::FINISHED_SINCE)
            .bind(Ts(since))
            .fetch_all::<D>(&mut *self.driver.acquire().await?)
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
        let states: Vec<ProcessState> = if states.is_empty() {
            vec![ProcessState::Pending, ProcessState::Error]
        } else {
            states.to_vec()
        };
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
        if from == to {
            return Err(
                orderly_core::ValidationError::new("to", "is the version they have").into(),
            );
        }
        let (mut tx, now) = self.begin().await?;
        let mut flows = Vec::with_capacity(2);
        for (field, r) in [("from", from), ("to", to)] {
            let row = q(st::STORED_WORKFLOW)
                .bind(r.name.clone())
                .bind(r.version.clone())
                .fetch_optional::<D>(&mut tx)
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
        if let Err(why) = flows[0].compatible_with(&flows[1]) {
            return Err(orderly_core::ValidationError::new(
                "to",
                format!(
                    "{to} is not compatible with {from}, so orders pinned to {from} stay on it: {}",
                    why.join("; ")
                ),
            )
            .into());
        }
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
