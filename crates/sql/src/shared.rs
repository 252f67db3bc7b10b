//! The store operations whose SQL is the same in both dialects, written once and
//! stamped onto `SqliteStore` and `PgStore` by [`store_ops!`]. (A macro over the two
//! concrete types rather than code generic over `sqlx::Database`: the bounds such
//! code needs would outweigh the code.)
//!
//! Each dialect module provides, on its store type:
//! - `begin_write(&self)`: a transaction that serializes with every other writer where
//!   needed (SQLite: `BEGIN IMMEDIATE`);
//! - `tx_now(&self, conn)`: the store's "now" inside that transaction (PostgreSQL:
//!   the server's clock; SQLite: the host's; either overridden by an injected clock);
//! - `claim_batch`, `complete_batch`, `find_expired_rows`, `recover_batch`: the hot
//!   paths, written per dialect;
//! - `sql::INSERT_ORDER` and `sql::SELECT_DETAILS`.

use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::{Fence, OrderId, ProcessState};

/// A history entry to append.
pub(crate) struct Event<'a> {
    pub order_id: &'a OrderId,
    pub at: DateTime<Utc>,
    pub actor: &'a str,
    pub kind: HistoryKind,
    pub from: Option<ProcessState>,
    pub to: ProcessState,
    pub epoch: i64,
    pub step: Option<i32>,
    pub reason: Option<&'a str>,
}

impl<'a> Event<'a> {
    /// The owner of a Processing order records `kind`, moving it to `to`.
    pub fn by_owner(
        fence: &'a Fence,
        at: DateTime<Utc>,
        kind: HistoryKind,
        to: ProcessState,
    ) -> Self {
        Self {
            order_id: &fence.order_id,
            at,
            actor: fence.owner.as_str(),
            kind,
            from: Some(ProcessState::Processing),
            to,
            epoch: fence.epoch.0,
            step: None,
            reason: None,
        }
    }
}

/// A fenced write that ends the owner's hold (`FAIL`, `RELEASE`): `$4` is `arg` (or
/// now), `$5` now; `kind` goes to the history and `sends` are enqueued with it.
pub(crate) struct OwnerEnd<'a> {
    pub sql: &'static str,
    pub arg: Option<String>,
    pub target: ProcessState,
    pub kind: HistoryKind,
    pub reason: &'a str,
    pub sends: &'a [orderly_core::transport::Envelope],
}

/// An operator's move to `target`, allowed only from the states in `from`.
pub(crate) struct OperatorMove<'a> {
    pub from: &'a [ProcessState],
    pub target: ProcessState,
    pub kind: HistoryKind,
    pub actor: &'a orderly_core::Actor,
    pub reason: &'a str,
    pub sends: &'a [orderly_core::transport::Envelope],
    /// A cancel that undoes first: an order whose steps may have taken effect goes
    /// back to Pending marked to end Cancelled once a scheduler has undone them.
    pub undo_first: bool,
}

/// How often an operator's read-then-move is retried when the order keeps changing.
pub(crate) const OPERATOR_ATTEMPTS: usize = 5;

macro_rules! store_ops {
    ($Store:ty, $DB:ty) => {
        use ::async_trait::async_trait;
        use ::orderly_core::history::HistoryKind;
        use ::orderly_core::step::StepRecord;
        use ::orderly_core::transport::Envelope;
        use ::orderly_core::store::{
            Alert, BatchOutcome, ClaimRequest, Completion, ClaimedOrder, Cursor, ExpiredOrder, IntakeStore, NewOrder,
            OperatorStore, OrderFilter, OrderView, Page, Recovered, RecoveryPolicy, SchedulerStore,
            StepUpdate, StepWrite, Submission, SubmitOutcome, SupervisorStore, bounded_text,
        };
        use ::orderly_core::{
            Actor, Error, Fence, InstanceId, OrderDetails, OrderId, ProcessState, Result, StateRow,
        };

        use $crate::error::{corrupt, db};
        use $crate::fence::refusal;
        use $crate::rows::Cols;
        use $crate::shared::{Event, OperatorMove, OwnerEnd, OPERATOR_ATTEMPTS};
        use $crate::statements as st;
        use $crate::time::Ts;

        type Conn = <$DB as ::sqlx::Database>::Connection;

        /// Fills `slots` (every state to report, at zero) from `(process_state, n)` rows.
        fn tally(
            rows: &[<$DB as ::sqlx::Database>::Row],
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

        impl $Store {
            /// Refuses the write unless `leader`'s term is the current one: the first
            /// statement of every leader's transaction.
            pub(crate) async fn check_leader(
                conn: &mut Conn,
                leader: &::orderly_core::leader::LeaderFence,
                now: ::chrono::DateTime<::chrono::Utc>,
            ) -> Result<()> {
                let n = ::sqlx::query(st::LEADER_GUARD)
                    .bind(&leader.name)
                    .bind(leader.epoch.0)
                    .bind(leader.holder.as_str())
                    .bind(Ts(now))
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?
                    .rows_affected();
                if n == 1 {
                    Ok(())
                } else {
                    Err(Error::Deposed {
                        name: leader.name.clone(),
                        holder: leader.holder.clone(),
                        epoch: leader.epoch,
                    })
                }
            }

            /// Applies pending migrations, each in the same transaction as its
            /// bookkeeping row and under the dialect's migration lock; returns the
            /// versions applied.
            pub async fn migrate(&self) -> Result<Vec<i64>> {
                let mut tx = self.begin_write().await?;
                self.lock_migrations(&mut tx).await?;
                ::sqlx::query($crate::migrate::CREATE_BOOKKEEPING).execute(&mut *tx).await.map_err(db)?;
                let applied: Vec<(i64, String)> =
                    ::sqlx::query_as("SELECT version, checksum FROM orderly_migrations")
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(db)?;
                let now = self.tx_now(&mut tx).await?;
                let mut done = Vec::new();
                for m in $crate::migrate::pending(&applied, Self::MIGRATIONS)? {
                    ::sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(db)?;
                    ::sqlx::query(
                        "INSERT INTO orderly_migrations (version, name, checksum, applied_at) \
                         VALUES ($1, $2, $3, $4)",
                    )
                    .bind(m.version)
                    .bind(m.name)
                    .bind(m.checksum())
                    .bind(Ts(now).to_text())
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                    ::tracing::info!(
                        dialect = <$DB as ::sqlx::Database>::NAME,
                        version = m.version,
                        name = m.name,
                        "applied migration"
                    );
                    done.push(m.version);
                }
                tx.commit().await.map_err(db)?;
                Ok(done)
            }

            /// Enqueues `sends` in the transaction, commits, then wakes their receivers:
            /// the state change and the messages it causes commit together or not at all.
            async fn commit_with(
                &self,
                mut tx: WriteTxn,
                now: ::chrono::DateTime<::chrono::Utc>,
                sends: &[Envelope],
            ) -> Result<()> {
                let send_error = |e| Error::Send(Box::new(e));
                match self.delivery {
                    $crate::Delivery::Queue => {
                        let woken = self.enqueue_all(&mut tx, now, sends).await.map_err(send_error)?;
                        tx.commit().await.map_err(db)?;
                        self.wake_queues(&woken);
                    }
                    $crate::Delivery::Outbox => {
                        self.write_outbox(&mut tx, now, sends).await.map_err(send_error)?;
                        tx.commit().await.map_err(db)?;
                        if !sends.is_empty() {
                            self.wakeups.outbox.notify_one();
                        }
                    }
                }
                Ok(())
            }

            async fn fetch_state(conn: &mut Conn, order_id: &OrderId) -> Result<Option<StateRow>> {
                let row = ::sqlx::query(st::SELECT_STATE)
                    .bind(order_id.as_str())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db)?;
                row.as_ref().map(|r| Cols(r).state_row()).transpose()
            }

            async fn fetch_steps(conn: &mut Conn, order_id: &OrderId) -> Result<Vec<StepRecord>> {
                ::sqlx::query(st::SELECT_STEPS)
                    .bind(order_id.as_str())
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|r| Cols(r).step_record())
                    .collect()
            }

            async fn append(conn: &mut Conn, ev: Event<'_>) -> Result<()> {
                ::sqlx::query(st::INSERT_HISTORY)
                    .bind(ev.order_id.as_str())
                    .bind(Ts(ev.at))
                    .bind(ev.actor)
                    .bind(ev.kind.as_str())
                    .bind(ev.from.map(ProcessState::as_str))
                    .bind(ev.to.as_str())
                    .bind(ev.epoch)
                    .bind(ev.step)
                    .bind(ev.reason.map(bounded_text))
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                Ok(())
            }

            /// Why a fenced write matched no row.
            async fn explain(
                conn: &mut Conn,
                fence: &Fence,
                now: ::chrono::DateTime<::chrono::Utc>,
                target: ProcessState,
            ) -> Error {
                match Self::fetch_state(conn, &fence.order_id).await {
                    Ok(row) => refusal(fence, row, now, target),
                    Err(e) => e,
                }
            }

            /// A fenced write that ends the owner's hold (`FAIL`, `RELEASE`): `$4` is
            /// `arg`, `$5` now. Appends `kind` to the history on success.
            async fn finish_owned(&self, fence: &Fence, end: OwnerEnd<'_>) -> Result<()> {
                let OwnerEnd { sql, arg, target, kind, reason, sends } = end;
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let mut q = ::sqlx::query(sql)
                    .bind(fence.order_id.as_str())
                    .bind(fence.owner.as_str())
                    .bind(fence.epoch.0);
                q = match arg {
                    Some(text) => q.bind(text),
                    None => q.bind(Ts(now)),
                };
                let n = q
                    .bind(Ts(now))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?
                    .rows_affected();
                if n == 0 {
                    return Err(Self::explain(&mut tx, fence, now, target).await);
                }
                let event = Event { reason: Some(reason), ..Event::by_owner(fence, now, kind, target) };
                Self::append(&mut tx, event)
                .await?;
                self.commit_with(tx, now, sends).await
            }

            /// Why a step write matched no row: [`refusal`], or `StaleStep` when only the
            /// step guard failed.
            async fn explain_step(
                conn: &mut Conn,
                fence: &Fence,
                now: ::chrono::DateTime<::chrono::Utc>,
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

            /// One write of a `record_steps` batch: `Some(refusal)` if it was refused
            /// (nothing of it written), `None` if applied.
            async fn apply_step_write(
                conn: &mut Conn,
                w: &StepWrite,
                now: ::chrono::DateTime<::chrono::Utc>,
            ) -> Result<Option<Error>> {
                let fence = &w.fence;
                if w.updates.is_empty() {
                    let n = ::sqlx::query(st::TOUCH)
                        .bind(fence.order_id.as_str())
                        .bind(fence.owner.as_str())
                        .bind(fence.epoch.0)
                        .bind(Ts(now))
                        .bind(w.expect_step.unwrap_or(-1))
                        .execute(&mut *conn)
                        .await
                        .map_err(db)?
                        .rows_affected();
                    if n == 0 {
                        return Ok(Some(Self::explain_step(conn, fence, now, w.expect_step).await));
                    }
                    return Ok(None);
                }
                for (i, step) in w.updates.iter().enumerate() {
                    let expect = if i == 0 { w.expect_step } else { None };
                    let detail = step.detail.as_deref().map(bounded_text);
                    let n = ::sqlx::query(st::TOUCH_FOR_STEP_AT)
                        .bind(fence.order_id.as_str())
                        .bind(fence.owner.as_str())
                        .bind(fence.epoch.0)
                        .bind(step.status.as_str())
                        .bind(Ts(now))
                        .bind(step.index)
                        .bind(detail)
                        .bind(expect.unwrap_or(-1))
                        .execute(&mut *conn)
                        .await
                        .map_err(db)?
                        .rows_affected();
                    if n == 0 {
                        if i == 0 {
                            return Ok(Some(Self::explain_step(conn, fence, now, expect).await));
                        }
                        // The first update held under this transaction's lock: only a
                        // concurrent writer could break it, and the caller may retry.
                        return Err(Error::Unavailable(
                            format!("write to order {} raced with another writer; retry", fence.order_id).into(),
                        ));
                    }
                    ::sqlx::query(st::UPSERT_STEP)
                        .bind(fence.order_id.as_str())
                        .bind(step.index)
                        .bind(&step.name)
                        .bind(step.status.as_str())
                        .bind(&step.idempotency_key)
                        .bind(detail)
                        .bind(fence.epoch.0)
                        .bind(Ts(now))
                        .execute(&mut *conn)
                        .await
                        .map_err(db)?;
                    let kind = match step.status {
                        ::orderly_core::StepStatus::Started => HistoryKind::StepStarted,
                        ::orderly_core::StepStatus::Succeeded => HistoryKind::StepSucceeded,
                        ::orderly_core::StepStatus::Failed => HistoryKind::StepFailed,
                        ::orderly_core::StepStatus::Compensated => HistoryKind::StepCompensated,
                    };
                    let event = Event {
                        step: Some(step.index),
                        reason: detail,
                        ..Event::by_owner(fence, now, kind, ProcessState::Processing)
                    };
                    Self::append(conn, event).await?;
                }
                Ok(None)
            }

            /// Records one new order (details, Pending state row, first history entry)
            /// in the caller's transaction; a repeat is `Duplicate`, the same id with
            /// other details `OrderIdConflict`, and neither writes anything.
            async fn insert_order(
                conn: &mut Conn,
                order: &NewOrder,
                actor: &Actor,
                now: ::chrono::DateTime<::chrono::Utc>,
            ) -> Result<SubmitOutcome> {
                let details = order.details.to_json();
                let inserted = ::sqlx::query(sql::INSERT_ORDER)
                    .bind(order.order_id.as_str())
                    .bind(&details)
                    .bind(Ts(now))
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?
                    .rows_affected();
                if inserted == 0 {
                    let stored: String = ::sqlx::query_scalar(sql::SELECT_DETAILS)
                        .bind(order.order_id.as_str())
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(db)?;
                    let stored = OrderDetails::from_json(&stored)
                        .map_err(|e| corrupt("orders.details", e))?;
                    return if stored == order.details {
                        Ok(SubmitOutcome::Duplicate)
                    } else {
                        Err(Error::OrderIdConflict(order.order_id.clone()))
                    };
                }
                ::sqlx::query(st::INSERT_STATE)
                    .bind(order.order_id.as_str())
                    .bind(Ts(now))
                    .bind(order.reply_to.as_deref())
                    .bind(order.workflow.as_deref())
                    .execute(&mut *conn)
                    .await
                    .map_err(db)?;
                Self::append(
                    conn,
                    Event {
                        order_id: &order.order_id,
                        at: now,
                        actor: actor.as_str(),
                        kind: HistoryKind::Submitted,
                        from: None,
                        to: ProcessState::Pending,
                        epoch: 0,
                        step: None,
                        reason: None,
                    },
                )
                .await?;
                Ok(SubmitOutcome::Accepted)
            }

            /// An operator's move of `order_id` to `target`, allowed only from `from`:
            /// read, check, then a conditional update on (state, epoch), retried if the
            /// order changed in between.
            async fn operator_move(&self, order_id: &OrderId, mv: OperatorMove<'_>) -> Result<StateRow> {
                let OperatorMove { from, target, kind, actor, reason, sends, undo_first } = mv;
                // An order cancelled at once tells the client's queue, if it has one; a
                // client queue that does not exist does not hold up the cancel.
                let mut notify = true;
                for _ in 0..OPERATOR_ATTEMPTS {
                    let mut tx = self.begin_write().await?;
                    let now = self.tx_now(&mut tx).await?;
                    let Some(row) = Self::fetch_state(&mut tx, order_id).await? else {
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
                    let undo = undo_first && {
                        let effects: i64 = ::sqlx::query_scalar(st::HAS_EFFECTS)
                            .bind(order_id.as_str())
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(db)?;
                        effects > 0
                    };
                    let (to, kind, finish_as) = if undo {
                        (ProcessState::Pending, HistoryKind::CancelRequested, Some(target.as_str()))
                    } else {
                        (target, kind, None)
                    };
                    let moved = ::sqlx::query(st::OPERATOR_MOVE)
                        .bind(order_id.as_str())
                        .bind(row.process_state.as_str())
                        .bind(Ts(now))
                        .bind(row.lock_epoch.0)
                        .bind(to.as_str())
                        .bind(finish_as)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(db)?;
                    let Some(moved) = moved else { continue };
                    let mut moved = Cols(&moved).state_row()?;
                    // A retry runs the workflow again from the first step, under the
                    // next generation, if any step was undone; else it continues.
                    let mut reason = reason.to_owned();
                    let mut kind = kind;
                    if kind == HistoryKind::Resubmitted {
                        let steps = Self::fetch_steps(&mut tx, order_id).await?;
                        let plan = ::orderly_core::RetryPlan::for_order(
                            moved.generation,
                            moved.current_step,
                            &steps,
                        );
                        if matches!(plan, ::orderly_core::RetryPlan::FreshRun { .. }) {
                            let fresh = ::sqlx::query(st::FRESH_RUN)
                                .bind(order_id.as_str())
                                .fetch_one(&mut *tx)
                                .await
                                .map_err(db)?;
                            moved = Cols(&fresh).state_row()?;
                            ::sqlx::query(st::CLEAR_STEPS)
                                .bind(order_id.as_str())
                                .execute(&mut *tx)
                                .await
                                .map_err(db)?;
                            kind = HistoryKind::RetriedAfresh;
                            reason = format!("{reason} ({})", plan.describe());
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
                            ::orderly_core::messages::StatusNotice {
                                order_id: order_id.clone(),
                                status: ::orderly_core::messages::OrderStatus::Cancelled,
                                step: None,
                                detail: Some(reason.to_owned()),
                            }
                            .envelope(moved.reply_to.as_deref(), &format!("op{}", moved.lock_epoch))
                        })
                        .flatten();
                    let Some(notice) = notice else {
                        self.commit_with(tx, now, sends).await?;
                        return Ok(moved);
                    };
                    let mut all = sends.to_vec();
                    all.push(notice.clone());
                    match self.commit_with(tx, now, &all).await {
                        Ok(()) => return Ok(moved),
                        Err(Error::Send(inner))
                            if matches!(&*inner, ::orderly_core::transport::TransportError::QueueNotFound(q) if *q == notice.queue) =>
                        {
                            ::tracing::warn!(order_id = %order_id, queue = %notice.queue, "the client's queue does not exist: cancelled without telling it");
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
        impl IntakeStore for $Store {
            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %order.order_id, actor = %actor))]
            async fn submit(&self, order: &NewOrder, actor: &Actor, sends: &[Envelope]) -> Result<SubmitOutcome> {
                order.validate()?;
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let outcome = Self::insert_order(&mut tx, order, actor, now).await?;
                if outcome == SubmitOutcome::Accepted {
                    self.commit_with(tx, now, sends).await?;
                }
                Ok(outcome)
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, batch = batch.len(), actor = %actor))]
            async fn submit_many(&self, batch: &[Submission], actor: &Actor) -> Result<Vec<Result<SubmitOutcome>>> {
                if batch.is_empty() {
                    return Ok(Vec::new());
                }
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let mut outcomes = Vec::with_capacity(batch.len());
                let mut sends = Vec::new();
                for s in batch {
                    if let Err(invalid) = s.order.validate() {
                        outcomes.push(Err(invalid.into()));
                        continue;
                    }
                    let outcome = match Self::insert_order(&mut tx, &s.order, actor, now).await {
                        Err(e @ Error::OrderIdConflict(_)) => Err(e),
                        Err(e) => return Err(e),
                        Ok(o) => Ok(o),
                    };
                    if matches!(outcome, Ok(SubmitOutcome::Accepted)) {
                        sends.extend(s.sends.iter().cloned());
                    }
                    outcomes.push(outcome);
                }
                self.commit_with(tx, now, &sends).await?;
                Ok(outcomes)
            }
        }

        #[async_trait]
        impl SchedulerStore for $Store {
            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, instance_id = %request.owner, limit = request.limit))]
            async fn claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedOrder>> {
                let timeout = $crate::shared::checked_claim(request)?;
                self.claim_batch(request, timeout).await
            }

            async fn claim_and_start(
                &self,
                request: &ClaimRequest,
                plan: &(dyn for<'c> Fn(&'c ClaimedOrder) -> Option<StepWrite> + Send + Sync),
            ) -> Result<Vec<(ClaimedOrder, bool)>> {
                let timeout = $crate::shared::checked_claim(request)?;
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let claimed = Self::claim_in(&mut tx, request, timeout, now).await?;
                if claimed.is_empty() {
                    return Ok(Vec::new());
                }
                let planned: Vec<Option<StepWrite>> = claimed.iter().map(|c| plan(c)).collect();
                let started: Vec<bool> = planned.iter().map(Option::is_some).collect();
                let writes: Vec<StepWrite> = planned.into_iter().flatten().collect();
                let refusals = self.apply_step_writes(&mut tx, &writes, now).await?;
                if let Some(refused) = refusals.into_iter().flatten().next() {
                    // Just claimed in this transaction: a refusal means a planning
                    // error. Nothing is claimed or sent.
                    return Err(refused);
                }
                let sends: Vec<Envelope> = writes.into_iter().flat_map(|w| w.sends).collect();
                self.commit_with(tx, now, &sends).await?;
                Ok(claimed.into_iter().zip(started).collect())
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch, step = step.index, status = %step.status))]
            async fn record_step(&self, fence: &Fence, step: &StepUpdate, sends: &[Envelope]) -> Result<StepRecord> {
                if step.index < 0 || step.name.is_empty() || step.name.len() > 100 {
                    return Err(::orderly_core::ValidationError::new(
                        "step",
                        "index must be >= 0 and name 1 to 100 characters",
                    )
                    .into());
                }
                let detail = step.detail.as_deref().map(bounded_text);
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let n = ::sqlx::query(st::TOUCH_FOR_STEP)
                    .bind(fence.order_id.as_str())
                    .bind(fence.owner.as_str())
                    .bind(fence.epoch.0)
                    .bind(step.status.as_str())
                    .bind(Ts(now))
                    .bind(step.index)
                    .bind(detail)
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?
                    .rows_affected();
                if n == 0 {
                    return Err(Self::explain(&mut tx, fence, now, ProcessState::Processing).await);
                }
                let row = ::sqlx::query(st::UPSERT_STEP)
                    .bind(fence.order_id.as_str())
                    .bind(step.index)
                    .bind(&step.name)
                    .bind(step.status.as_str())
                    .bind(&step.idempotency_key)
                    .bind(detail)
                    .bind(fence.epoch.0)
                    .bind(Ts(now))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let record = Cols(&row).step_record()?;
                let kind = match step.status {
                    ::orderly_core::StepStatus::Started => HistoryKind::StepStarted,
                    ::orderly_core::StepStatus::Succeeded => HistoryKind::StepSucceeded,
                    ::orderly_core::StepStatus::Failed => HistoryKind::StepFailed,
                    ::orderly_core::StepStatus::Compensated => HistoryKind::StepCompensated,
                };
                let event = Event {
                    step: Some(step.index),
                    reason: detail,
                    ..Event::by_owner(fence, now, kind, ProcessState::Processing)
                };
                Self::append(&mut tx, event)
                .await?;
                self.commit_with(tx, now, sends).await?;
                Ok(record)
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
            async fn extend(
                &self,
                fence: &Fence,
                by: ::std::time::Duration,
            ) -> Result<::chrono::DateTime<::chrono::Utc>> {
                let by = ::chrono::Duration::microseconds($crate::shared::timeout_micros(by)?);
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let deadline = ::sqlx::query_scalar::<_, Ts>(st::EXTEND)
                    .bind(fence.order_id.as_str())
                    .bind(fence.owner.as_str())
                    .bind(fence.epoch.0)
                    .bind(Ts(now + by))
                    .bind(Ts(now))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?;
                match deadline {
                    Some(deadline) => {
                        tx.commit().await.map_err(db)?;
                        Ok(deadline.0)
                    }
                    None => Err(Self::explain(&mut tx, fence, now, ProcessState::Processing).await),
                }
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, batch = completions.len()))]
            async fn complete_many(&self, completions: &[Completion]) -> Result<BatchOutcome> {
                if completions.is_empty() {
                    return Ok(BatchOutcome::default());
                }
                // The same order twice in one batch completes (and is reported) once.
                let mut seen = ::std::collections::HashSet::with_capacity(completions.len());
                if completions.iter().all(|c| seen.insert(&c.fence.order_id)) {
                    return self.complete_batch(completions).await;
                }
                let mut seen = ::std::collections::HashSet::with_capacity(completions.len());
                let unique: Vec<Completion> =
                    completions.iter().filter(|c| seen.insert(&c.fence.order_id)).cloned().collect();
                self.complete_batch(&unique).await
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
            async fn fail(&self, fence: &Fence, error: &str, sends: &[Envelope]) -> Result<()> {
                let error = bounded_text(error);
                let end = OwnerEnd {
                    sql: st::FAIL,
                    arg: Some(error.to_owned()),
                    target: ProcessState::Error,
                    kind: HistoryKind::Failed,
                    reason: error,
                    sends,
                };
                self.finish_owned(fence, end)
                .await
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
            async fn release(&self, fence: &Fence, reason: &str) -> Result<()> {
                let end = OwnerEnd {
                    sql: st::RELEASE,
                    arg: None,
                    target: ProcessState::Pending,
                    kind: HistoryKind::Released,
                    reason,
                    sends: &[],
                };
                self.finish_owned(fence, end)
                .await
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, batch = writes.len()))]
            async fn record_steps(&self, writes: &[StepWrite]) -> Result<Vec<Result<()>>> {
                if writes.is_empty() {
                    return Ok(Vec::new());
                }
                for w in writes {
                    for step in &w.updates {
                        if step.index < 0 || step.name.is_empty() || step.name.len() > 100 {
                            return Err(::orderly_core::ValidationError::new(
                                "step",
                                "index must be >= 0 and name 1 to 100 characters",
                            )
                            .into());
                        }
                    }
                }
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let refusals = self.apply_step_writes(&mut tx, writes, now).await?;
                let mut verdicts = Vec::with_capacity(writes.len());
                let mut sends = Vec::new();
                let mut completing = Vec::new();
                for (w, refused) in writes.iter().zip(refusals) {
                    match refused {
                        None => {
                            sends.extend(w.sends.iter().cloned());
                            if w.complete {
                                completing.push(&w.fence);
                            }
                            verdicts.push(Ok(()));
                        }
                        Some(refused) => verdicts.push(Err(refused)),
                    }
                }
                // The last step's record and the completion commit together.
                if !completing.is_empty() {
                    let done = Self::complete_in(&mut tx, &completing, now).await?;
                    if let Some(f) = completing.iter().find(|f| !done.contains(f.order_id.as_str())) {
                        // Under the same fence and deadline the step write just passed:
                        // refuse the whole batch rather than leave it half done.
                        return Err(Error::Unavailable(
                            format!("order {} could not be completed with its last step; retry", f.order_id).into(),
                        ));
                    }
                }
                self.commit_with(tx, now, &sends).await?;
                Ok(verdicts)
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, instance_id = %owner))]
            async fn resume_owned(&self, owner: &InstanceId) -> Result<Vec<ClaimedOrder>> {
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let rows = ::sqlx::query(st::RESUME_OWNED)
                    .bind(owner.as_str())
                    .bind(Ts(now))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db)?;
                let mut resumed = Vec::with_capacity(rows.len());
                for r in &rows {
                    let c = Cols(r);
                    let order_id = c.order_id("order_id")?;
                    let epoch = ::orderly_core::Epoch(c.get("lock_epoch")?);
                    let details: String = ::sqlx::query_scalar(sql::SELECT_DETAILS)
                        .bind(order_id.as_str())
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db)?;
                    let details = OrderDetails::from_json(&details)
                        .map_err(|e| corrupt("orders.details", e))?;
                    let fence = Fence { order_id, owner: owner.clone(), epoch };
                    let event = Event {
                        reason: Some("scheduler restarted with the same instance id"),
                        ..Event::by_owner(&fence, now, HistoryKind::Resumed, ProcessState::Processing)
                    };
                    Self::append(&mut tx, event).await?;
                    resumed.push(ClaimedOrder {
                        complete_by: c.ts("complete_by")?,
                        current_step: c.get("current_step")?,
                        failure_count: c.get("failure_count")?,
                        details,
                        reply_to: c.get("reply_to")?,
                        finish_as: c.opt_state("finish_as")?,
                        generation: c.get("generation")?,
                        last_error: c.get("last_error")?,
                        workflow: c.workflow_ref()?,
                        fence,
                    });
                }
                tx.commit().await.map_err(db)?;
                Ok(resumed)
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
            async fn begin_compensation(
                &self,
                fence: &Fence,
                finish_as: ProcessState,
                reason: &str,
                sends: &[Envelope],
            ) -> Result<()> {
                if !matches!(finish_as, ProcessState::Error | ProcessState::Cancelled) {
                    return Err(::orderly_core::ValidationError::new(
                        "finish_as",
                        "must be Error or Cancelled",
                    )
                    .into());
                }
                let end = OwnerEnd {
                    sql: st::BEGIN_COMPENSATION,
                    arg: Some(finish_as.as_str().to_owned()),
                    target: ProcessState::Processing,
                    kind: HistoryKind::CompensationStarted,
                    reason,
                    sends,
                };
                self.finish_owned(fence, end).await
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %fence.order_id, instance_id = %fence.owner, epoch = %fence.epoch))]
            async fn finish_cancelled(&self, fence: &Fence, reason: &str, sends: &[Envelope]) -> Result<()> {
                let end = OwnerEnd {
                    sql: st::FINISH_CANCELLED,
                    arg: None,
                    target: ProcessState::Cancelled,
                    kind: HistoryKind::Cancelled,
                    reason,
                    sends,
                };
                self.finish_owned(fence, end).await
            }

            async fn workflows_in_flight(&self) -> Result<Vec<::orderly_core::store::WorkflowCount>> {
                let rows = ::sqlx::query(st::WORKFLOWS_IN_FLIGHT)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?;
                rows.iter()
                    .map(|r| {
                        let c = Cols(r);
                        Ok(::orderly_core::store::WorkflowCount {
                            workflow: c.get("workflow")?,
                            version: c.get("workflow_version")?,
                            state: c.state("process_state")?,
                            orders: c.get("n")?,
                        })
                    })
                    .collect()
            }

            async fn count_owned(&self, owner: &InstanceId) -> Result<i64> {
                ::sqlx::query_scalar(st::COUNT_OWNED)
                    .bind(owner.as_str())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db)
            }

            async fn owned(&self, owner: &InstanceId) -> Result<Vec<Fence>> {
                ::sqlx::query(st::OWNED)
                    .bind(owner.as_str())
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|r| {
                        let c = Cols(r);
                        Ok(Fence {
                            order_id: c.order_id("order_id")?,
                            owner: owner.clone(),
                            epoch: ::orderly_core::Epoch(c.get("lock_epoch")?),
                        })
                    })
                    .collect()
            }

            async fn steps(&self, order_id: &OrderId) -> Result<Vec<StepRecord>> {
                let mut conn = self.pool.acquire().await.map_err(db)?;
                Self::fetch_steps(&mut conn, order_id).await
            }
        }

        #[async_trait]
        impl SupervisorStore for $Store {
            async fn find_expired(&self, limit: u32) -> Result<Vec<ExpiredOrder>> {
                let rows = ::sqlx::query(sql::FIND_EXPIRED)
                    .bind(self.now_param())
                    .bind(i64::from(limit.min(::orderly_core::store::MAX_BATCH)))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?;
                rows.iter()
                    .map(|r| {
                        let c = Cols(r);
                        Ok(ExpiredOrder {
                            order_id: c.order_id("order_id")?,
                            locked_by: c
                                .get::<Option<String>>("locked_by")?
                                .map(InstanceId::parse)
                                .transpose()
                                .map_err(|e| corrupt("locked_by", e))?,
                            lock_epoch: ::orderly_core::Epoch(c.get("lock_epoch")?),
                            complete_by: c.ts("complete_by")?,
                            failure_count: c.get("failure_count")?,
                        })
                    })
                    .collect()
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, instance_id = %leader.holder, epoch = %leader.epoch, limit))]
            async fn recover_expired(
                &self,
                leader: &::orderly_core::leader::LeaderFence,
                policy: &RecoveryPolicy,
                limit: u32,
            ) -> Result<Vec<Recovered>> {
                policy.validate()?;
                if limit == 0 {
                    return Ok(Vec::new());
                }
                self.recover_batch(leader, policy, limit.min(::orderly_core::store::MAX_BATCH))
                    .await
            }

            async fn unpublished_alerts(&self, limit: u32) -> Result<Vec<Alert>> {
                ::sqlx::query(st::UNPUBLISHED_ALERTS)
                    .bind(i64::from(limit.min(::orderly_core::store::MAX_BATCH)))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|r| Cols(r).alert())
                    .collect()
            }

            async fn mark_alerts_published(
                &self,
                leader: &::orderly_core::leader::LeaderFence,
                alert_ids: &[i64],
                sends: &[Envelope],
            ) -> Result<Vec<i64>> {
                if alert_ids.is_empty() {
                    return Ok(Vec::new());
                }
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                Self::check_leader(&mut tx, leader, now).await?;
                let mut marked = Vec::with_capacity(alert_ids.len());
                for id in alert_ids {
                    let n = ::sqlx::query(st::MARK_ALERT_PUBLISHED)
                        .bind(*id)
                        .bind(Ts(now))
                        .execute(&mut *tx)
                        .await
                        .map_err(db)?
                        .rows_affected();
                    if n > 0 {
                        marked.push(*id);
                    }
                }
                self.commit_with(tx, now, sends).await?;
                Ok(marked)
            }
        }

        #[async_trait]
        impl ::orderly_core::leader::LeadershipStore for $Store {
            async fn begin_term(
                &self,
                name: &str,
                holder: &InstanceId,
            ) -> Result<::orderly_core::leader::LeaderFence> {
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let epoch: i64 = ::sqlx::query_scalar(st::BEGIN_TERM)
                    .bind(name)
                    .bind(holder.as_str())
                    .bind(Ts(now))
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                tx.commit().await.map_err(db)?;
                Ok(::orderly_core::leader::LeaderFence {
                    name: name.to_owned(),
                    holder: holder.clone(),
                    epoch: ::orderly_core::Epoch(epoch),
                })
            }

            async fn acquire_lease(
                &self,
                name: &str,
                holder: &InstanceId,
                lease: ::std::time::Duration,
            ) -> Result<Option<::orderly_core::leader::LeaderFence>> {
                let lease = ::chrono::Duration::from_std(lease)
                    .map_err(|_| ::orderly_core::ValidationError::new("lease", "too long"))?;
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let epoch: Option<i64> = ::sqlx::query_scalar(st::ACQUIRE_LEASE)
                    .bind(name)
                    .bind(holder.as_str())
                    .bind(Ts(now))
                    .bind(Ts(now + lease))
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?;
                tx.commit().await.map_err(db)?;
                Ok(epoch.map(|epoch| ::orderly_core::leader::LeaderFence {
                    name: name.to_owned(),
                    holder: holder.clone(),
                    epoch: ::orderly_core::Epoch(epoch),
                }))
            }

            async fn renew_lease(
                &self,
                fence: &::orderly_core::leader::LeaderFence,
                lease: ::std::time::Duration,
            ) -> Result<bool> {
                let lease = ::chrono::Duration::from_std(lease)
                    .map_err(|_| ::orderly_core::ValidationError::new("lease", "too long"))?;
                self.set_lease_expiry(fence, lease).await
            }

            async fn release_lease(&self, fence: &::orderly_core::leader::LeaderFence) -> Result<bool> {
                self.set_lease_expiry(fence, ::chrono::Duration::zero()).await
            }

            async fn term(&self, name: &str) -> Result<Option<::orderly_core::leader::Term>> {
                let row = ::sqlx::query(st::SELECT_TERM)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db)?;
                row.map(|r| {
                    let c = Cols(&r);
                    Ok(::orderly_core::leader::Term {
                        fence: ::orderly_core::leader::LeaderFence {
                            name: c.get("name")?,
                            holder: InstanceId::parse(c.get::<String>("holder")?)
                                .map_err(|e| corrupt("leadership.holder", e))?,
                            epoch: ::orderly_core::Epoch(c.get("epoch")?),
                        },
                        lease_expires_at: c.opt_ts("lease_expires_at")?,
                        started_at: c.ts("started_at")?,
                        renewed_at: c.ts("renewed_at")?,
                    })
                })
                .transpose()
            }
        }

        impl $Store {
            /// Sets the SQL lease of a current term to expire `lease` from now.
            async fn set_lease_expiry(
                &self,
                fence: &::orderly_core::leader::LeaderFence,
                lease: ::chrono::Duration,
            ) -> Result<bool> {
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                let n = ::sqlx::query(st::SET_LEASE_EXPIRY)
                    .bind(&fence.name)
                    .bind(fence.epoch.0)
                    .bind(fence.holder.as_str())
                    .bind(Ts(now))
                    .bind(Ts(now + lease))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?
                    .rows_affected();
                tx.commit().await.map_err(db)?;
                Ok(n == 1)
            }
        }

        #[async_trait]
        impl OperatorStore for $Store {
            async fn list(&self, filter: &OrderFilter) -> Result<Page> {
                let (text, args, limit) = st::list_query(filter);
                let mut q = ::sqlx::query(::sqlx::AssertSqlSafe(text));
                for arg in args {
                    q = match arg {
                        st::Arg::Text(s) => q.bind(s),
                        st::Arg::Int(i) => q.bind(i),
                        st::Arg::Time(t) => q.bind(t),
                    };
                }
                let rows = q.fetch_all(&self.pool).await.map_err(db)?;
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
                let mut conn = self.pool.acquire().await.map_err(db)?;
                let state = Self::fetch_state(&mut conn, order_id)
                    .await?
                    .ok_or_else(|| Error::OrderNotFound(order_id.clone()))?;
                let details: String = ::sqlx::query_scalar(sql::SELECT_DETAILS)
                    .bind(order_id.as_str())
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db)?;
                let details =
                    OrderDetails::from_json(&details).map_err(|e| corrupt("orders.details", e))?;
                let steps = Self::fetch_steps(&mut conn, order_id).await?;
                let history = ::sqlx::query(st::SELECT_HISTORY)
                    .bind(order_id.as_str())
                    .fetch_all(&mut *conn)
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

            async fn count_by_state(&self) -> Result<Vec<(ProcessState, i64)>> {
                let rows = ::sqlx::query(st::COUNT_BY_STATE)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?;
                tally(&rows, ProcessState::ALL.iter().map(|s| (*s, 0)).collect())
            }

            async fn finished_since(
                &self,
                since: ::chrono::DateTime<::chrono::Utc>,
            ) -> Result<Vec<(ProcessState, i64)>> {
                let rows = ::sqlx::query(st::FINISHED_SINCE)
                    .bind(Ts(since))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?;
                let finals = [ProcessState::Processed, ProcessState::Error, ProcessState::Cancelled];
                tally(&rows, finals.map(|s| (s, 0)).to_vec())
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %order_id, actor = %actor))]
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
                self.operator_move(order_id, mv)
                .await
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %order_id, actor = %actor))]
            async fn request_cancel(
                &self,
                order_id: &OrderId,
                actor: &Actor,
                reason: &str,
                sends: &[Envelope],
            ) -> Result<StateRow> {
                let mv = OperatorMove {
                    from: &[ProcessState::Pending, ProcessState::Processing, ProcessState::Error],
                    target: ProcessState::Cancelled,
                    kind: HistoryKind::Cancelled,
                    actor,
                    reason,
                    sends,
                    undo_first: true,
                };
                self.operator_move(order_id, mv).await
            }

            async fn alerts(&self, open_only: bool, limit: u32) -> Result<Vec<Alert>> {
                ::sqlx::query(st::LIST_ALERTS)
                    .bind(i32::from(open_only))
                    .bind(i64::from(limit.clamp(1, ::orderly_core::store::MAX_BATCH)))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(db)?
                    .iter()
                    .map(|r| Cols(r).alert())
                    .collect()
            }

            async fn acknowledge_alert(&self, alert_id: i64, by: &Actor) -> Result<Option<Alert>> {
                let mut tx = self.begin_write().await?;
                let now = self.tx_now(&mut tx).await?;
                ::sqlx::query(st::ACK_ALERT)
                    .bind(alert_id)
                    .bind(by.as_str())
                    .bind(Ts(now))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                let row = ::sqlx::query(st::ONE_ALERT)
                    .bind(alert_id)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(db)?;
                let alert = row.map(|r| Cols(&r).alert()).transpose()?;
                tx.commit().await.map_err(db)?;
                Ok(alert)
            }

            #[::tracing::instrument(level = "debug", skip_all, fields(dialect = <$DB as ::sqlx::Database>::NAME, order_id = %order_id, actor = %actor))]
            async fn cancel(
                &self,
                order_id: &OrderId,
                actor: &Actor,
                reason: &str,
                sends: &[Envelope],
            ) -> Result<StateRow> {
                let mv = OperatorMove {
                    from: &[ProcessState::Pending, ProcessState::Processing, ProcessState::Error],
                    target: ProcessState::Cancelled,
                    kind: HistoryKind::Cancelled,
                    actor,
                    reason,
                    sends,
                    undo_first: false,
                };
                self.operator_move(order_id, mv)
                .await
            }
        }
    };
}
pub(crate) use store_ops;

/// A processing timeout or extension in microseconds: more than zero, at most 7 days.
/// Checks a claim's limit and timeout; the timeout in microseconds.
pub(crate) fn checked_claim(
    request: &orderly_core::store::ClaimRequest,
) -> orderly_core::Result<i64> {
    if request.limit == 0 || request.limit > orderly_core::store::MAX_BATCH {
        return Err(orderly_core::ValidationError::new(
            "limit",
            format!("must be 1 to {}", orderly_core::store::MAX_BATCH),
        )
        .into());
    }
    timeout_micros(request.timeout)
}

pub(crate) fn timeout_micros(d: std::time::Duration) -> orderly_core::Result<i64> {
    const MAX: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
    if d.is_zero() || d > MAX {
        return Err(orderly_core::ValidationError::new(
            "timeout",
            "must be more than 0 and at most 7 days",
        )
        .into());
    }
    Ok(d.as_micros() as i64)
}
