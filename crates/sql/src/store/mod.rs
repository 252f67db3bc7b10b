//! The SQL state store, written once for both dialects over a [`Driver`].
//!
//! Where each transition is decided:
//! - intake (`Submitted`): [`intake`];
//! - claim, step progress, completion, failure, hand-back, compensation, resume:
//!   [`scheduler`] and [`steps`] (step progress is [`steps::progress`]);
//! - timeout recovery (failure count, back-off, give-up, reason):
//!   `RecoveryPolicy::decide` in `orderly-core`, applied by [`supervisor`];
//! - operator retry, cancel: [`operator`];
//! - an alert when an order enters Error: the `order_state_raises_alert` trigger of
//!   migration 0004 (named where `Alert` is defined in `orderly-core`), published by
//!   [`supervisor`].
//!
//! Every transition appends to the order's history in the same transaction, with its
//! kind bound as a parameter.

mod activity;
mod causes;
#[cfg(test)]
mod claim_wait_tests;
mod conditions;
#[cfg(test)]
mod conformance;
mod intake;
mod leadership;
mod operator;
mod retention;
mod scheduler;
mod services;
#[cfg(test)]
mod services_news_tests;
mod steps;
mod supervisor;
mod tally;

use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::step::StepRecord;
use orderly_core::store::{ClaimRequest, MAX_BATCH, Taken, bounded_text};
use orderly_core::transport::{Envelope, QueueName, ReceivedMessage};
use orderly_core::{Error, Fence, OrderId, ProcessState, Result, StateRow, ValidationError};

use crate::driver::Head;
use crate::driver::{Driver, Q, Receive, q};
use crate::error::db;
use crate::fence::refusal;
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

/// The longest a claimer that found nothing waits for the clock alone while other
/// processes' writes are heard: a safety net, for orders made claimable by a write
/// whose wake-up was lost.
pub(crate) const CLAIM_SAFETY_POLL: std::time::Duration = std::time::Duration::from_secs(5);

/// The SQL state store over one dialect's driver: SQLite
/// ([`SqliteStore`](crate::SqliteStore)) or PostgreSQL ([`PgStore`](crate::PgStore)).
/// It also serves the SQL queue and the outbox in the same database.
#[derive(Debug, Clone)]
pub struct SqlStore<D> {
    pub(crate) driver: D,
    pub(crate) wakeups: std::sync::Arc<crate::wakeups::Wakeups>,
    pub(crate) delivery: crate::Delivery,
    /// Per hot table, the horizon its latest vacuum ran under, and whether a skip
    /// under it was reported ([`SqlStore::tidy_now`]).
    pub(crate) vacuumed_under:
        std::sync::Arc<std::sync::Mutex<crate::store::retention::VacuumedUnder>>,
}

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

impl<D> SqlStore<D> {
    /// A store over `driver`, its queues woken through `wakeups`.
    pub(crate) fn new(driver: D, wakeups: std::sync::Arc<crate::wakeups::Wakeups>) -> Self {
        Self {
            driver,
            wakeups,
            delivery: crate::Delivery::Queue,
            vacuumed_under: Default::default(),
        }
    }

    /// Sends the messages state changes cause to `delivery` from now on.
    pub fn with_delivery(mut self, delivery: crate::Delivery) -> Self {
        self.delivery = delivery;
        self
    }
}

impl<D: Driver> SqlStore<D> {
    /// What this store did so far: write transactions, batch sizes per stage.
    pub fn stats(&self) -> std::sync::Arc<crate::stats::Stats> {
        self.driver.stats().clone()
    }

    /// Applies pending migrations, each in the same transaction as its bookkeeping row
    /// and under the dialect's migration lock; returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<i64>> {
        let mut tx = self.driver.begin_write().await?;
        D::lock_migrations(&mut tx).await?;
        D::run_script(&mut tx, crate::migrate::CREATE_BOOKKEEPING)
            .await
            .map_err(db)?;
        let applied = q("SELECT version, checksum FROM orderly_migrations")
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok((c.get::<i64>("version")?, c.get::<String>("checksum")?))
            })
            .collect::<Result<Vec<_>>>()?;
        let now = self.driver.now(&mut tx).await?;
        let mut done = Vec::new();
        for m in crate::migrate::pending(&applied, D::MIGRATIONS)? {
            D::run_script(&mut tx, m.sql).await.map_err(db)?;
            q(
                "INSERT INTO orderly_migrations (version, name, checksum, applied_at) \
               VALUES ($1, $2, $3, $4)",
            )
            .bind(m.version)
            .bind(m.name)
            .bind(m.checksum())
            .bind(Ts(now).to_text())
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
            tracing::info!(
                dialect = D::NAME,
                version = m.version,
                name = m.name,
                "applied migration"
            );
            done.push(m.version);
        }
        D::commit(tx).await.map_err(db)?;
        Ok(done)
    }

    /// Waits up to `wait` for messages on `queue` of this database, locks up to `max`
    /// of them in a write transaction and hands it to `act`, which acts on them in it
    /// and commits. A batch `act` fails for a reason that may pass is rolled back (the
    /// messages with it) and the error returned; for any other reason it is rolled
    /// back and the messages received plainly (their delivery counted, so one that
    /// always fails ends in the dead letters), held for the caller. Messages delivered
    /// too often are dead-lettered: on PostgreSQL by the take itself, in the same
    /// transaction; on SQLite, when one is first in line, by the receive's own path,
    /// and those after them are handed over held.
    pub(crate) async fn take_with<T, F, Fut>(
        &self,
        queue: &QueueName,
        max: u32,
        wait: std::time::Duration,
        act: F,
    ) -> Result<Taken<T>>
    where
        F: Fn(D::Tx, DateTime<Utc>, Vec<ReceivedMessage>) -> Fut,
        Fut: std::future::Future<Output = Result<Taken<T>>>,
    {
        if max == 0 || max > orderly_core::transport::MAX_MESSAGES {
            return Err(orderly_core::ValidationError::new(
                "max",
                format!("must be 1 to {}", orderly_core::transport::MAX_MESSAGES),
            )
            .into());
        }
        let act = &act;
        let found = self
            .until_found(queue, wait, || self.take_once(queue, max, act))
            .await?;
        Ok(found.unwrap_or_else(|| Taken::held(Vec::new())))
    }

    /// One look at `queue` for [`Self::take_with`]: up to `max` messages taken in a
    /// write transaction and acted on by `act` in it ([`Self::act_on_taken`]), or, with
    /// messages delivered too often first in line (SQLite), those received plainly and
    /// held for the caller. `None`: nothing to take; with it, whether the take got all
    /// there was.
    async fn take_once<T, F, Fut>(
        &self,
        queue: &QueueName,
        max: u32,
        act: &F,
    ) -> Result<Option<(Taken<T>, bool)>>
    where
        F: Fn(D::Tx, DateTime<Utc>, Vec<ReceivedMessage>) -> Fut,
        Fut: std::future::Future<Output = Result<Taken<T>>>,
    {
        let queue_error = |e| Error::Queue(Box::new(e));
        let (tx, now, messages) = match D::SQL.q_receive {
            // The take is the transaction's first statement and reads its clock.
            Receive::OneStatement { in_tx, .. } => {
                let mut tx = self.driver.begin_write().await?;
                let (messages, now) = self
                    .take_first(&mut tx, in_tx, queue, max)
                    .await
                    .map_err(queue_error)?;
                (tx, now, messages)
            }
            Receive::LookThenTake(look) => {
                match self.head(look, queue).await.map_err(queue_error)? {
                    Head::Empty => return Ok(None),
                    // Delivered too often first in line: the receive's own path
                    // dead-letters them; whatever it delivers is the caller's.
                    Head::Exhausted => {
                        let messages = self.receive_now(queue, max).await.map_err(queue_error)?;
                        let all = messages.len() < max as usize;
                        return Ok((!messages.is_empty()).then(|| (Taken::held(messages), all)));
                    }
                    Head::Ready => {
                        let (mut tx, now) = self.begin().await?;
                        let messages = self
                            .take_in(&mut tx, look.take_in_tx, now, queue, max)
                            .await
                            .map_err(queue_error)?;
                        (tx, now, messages)
                    }
                }
            }
        };
        if messages.is_empty() {
            D::commit(tx).await.map_err(db)?;
            return Ok(None);
        }
        self.act_on_taken(queue, max, act, tx, now, messages)
            .await
            .map(Some)
    }

    /// `act` on `messages`, taken in `tx` at `now`. A failure that may pass is the
    /// caller's to retry (the take rolled back with it); any other rolls back and the
    /// messages are received plainly, held for the caller. With the outcome, whether
    /// the take got all there was.
    async fn act_on_taken<T, F, Fut>(
        &self,
        queue: &QueueName,
        max: u32,
        act: &F,
        tx: D::Tx,
        now: DateTime<Utc>,
        messages: Vec<ReceivedMessage>,
    ) -> Result<(Taken<T>, bool)>
    where
        F: Fn(D::Tx, DateTime<Utc>, Vec<ReceivedMessage>) -> Fut,
        Fut: std::future::Future<Output = Result<Taken<T>>>,
    {
        let all = messages.len() < max as usize;
        match act(tx, now, messages).await {
            Ok(taken) => Ok((taken, all)),
            Err(e) if e.is_retryable() => Err(e),
            Err(e) => {
                tracing::warn!(queue = %queue, error = %e, "messages could not be acted on as they were taken; received for the caller");
                let messages = self
                    .receive_now(queue, max)
                    .await
                    .map_err(|e| Error::Queue(Box::new(e)))?;
                Ok((Taken::held(messages), false))
            }
        }
    }

    /// A write transaction and its "now".
    pub(crate) async fn begin(&self) -> Result<(D::Tx, DateTime<Utc>)> {
        let mut tx = self.driver.begin_write().await?;
        let now = self.driver.now(&mut tx).await?;
        Ok((tx, now))
    }

    /// The holds whose delivery a commit ends: of `messages[i]` for each `outcomes[i]`
    /// that `ends` (the item is settled for good), when this store's database is also
    /// its transport (its sends go to its own queue). No messages, or a store on the
    /// outbox: none, the caller's to settle.
    pub(crate) fn to_consume<'m, T>(
        &self,
        messages: Option<&'m [orderly_core::transport::ReceivedMessage]>,
        outcomes: &[T],
        ends: impl Fn(&T) -> bool,
    ) -> Consuming<'m> {
        let Some(messages) = messages.filter(|_| self.delivery == crate::Delivery::Queue) else {
            return Consuming {
                items: outcomes.len(),
                slots: Vec::new(),
                held: Vec::new(),
            };
        };
        let (slots, held): (Vec<usize>, Vec<_>) = messages
            .iter()
            .zip(outcomes)
            .enumerate()
            .filter(|(_, (_, o))| ends(o))
            .map(|(i, (m, _))| (i, m))
            .unzip();
        if !held.is_empty() {
            self.driver.stats().batch("consume", held.len());
        }
        Consuming {
            items: outcomes.len(),
            slots,
            held,
        }
    }

    /// Enqueues `sends` in the transaction, commits, then wakes their receivers: the
    /// state change and the messages it causes commit together or not at all.
    pub(crate) async fn commit_with(
        &self,
        tx: D::Tx,
        now: DateTime<Utc>,
        sends: &[Envelope],
    ) -> Result<()> {
        self.commit_consuming(tx, now, sends, &[]).await.map(|_| ())
    }

    /// [`Self::commit_with`], ending in the same transaction (in the statement of its
    /// first send, if any) the deliveries `held` ([`Self::to_consume`]); returns, hold
    /// by hold, whether it was ended (not: a message this queue does not hold for that
    /// delivery, such as another transport's or one whose lock was lost).
    pub(crate) async fn commit_consuming(
        &self,
        mut tx: D::Tx,
        now: DateTime<Utc>,
        sends: &[Envelope],
        held: &[&orderly_core::transport::ReceivedMessage],
    ) -> Result<Vec<bool>> {
        let send_error = |e| Error::Send(Box::new(e));
        match self.delivery {
            crate::Delivery::Queue => {
                let (woken, ended) = self
                    .enqueue_all(&mut tx, now, sends, held)
                    .await
                    .map_err(send_error)?;
                D::commit(tx).await.map_err(db)?;
                self.wake_queues(&woken);
                Ok(ended)
            }
            crate::Delivery::Outbox => {
                self.write_outbox(&mut tx, now, sends)
                    .await
                    .map_err(send_error)?;
                D::commit(tx).await.map_err(db)?;
                if !sends.is_empty() {
                    self.wakeups.outbox.notify_one();
                }
                Ok(vec![false; held.len()])
            }
        }
    }

    /// [`Self::commit_with`] for a transaction that made orders claimable: schedulers
    /// of other processes hear of it at commit (PostgreSQL `NOTIFY`), this process's
    /// right after it.
    pub(crate) async fn commit_claimable(
        &self,
        tx: D::Tx,
        now: DateTime<Utc>,
        sends: &[Envelope],
    ) -> Result<()> {
        self.commit_claimable_consuming(tx, now, sends, &[])
            .await
            .map(|_| ())
    }

    /// [`Self::commit_claimable`] ending deliveries as [`Self::commit_consuming`] does.
    pub(crate) async fn commit_claimable_consuming(
        &self,
        mut tx: D::Tx,
        now: DateTime<Utc>,
        sends: &[Envelope],
        held: &[&orderly_core::transport::ReceivedMessage],
    ) -> Result<Vec<bool>> {
        D::notify_sent(&mut tx, &self.wakeups.notice(crate::wakeups::CLAIMABLE))
            .await
            .map_err(db)?;
        let ended = self.commit_consuming(tx, now, sends, held).await?;
        self.wakeups.wake_claimers();
        Ok(ended)
    }

    /// Waits until orders may have become claimable since `*seen` (a count this
    /// updates), or `within` passes.
    ///
    /// While other processes' writes are heard (the wake-ups say when orders become
    /// claimable), the wait is timed by the store, not by `within`: until the next
    /// order comes due by the clock alone (a retry's back-off, a resumed order's turn),
    /// at most [`CLAIM_SAFETY_POLL`]; `within` still while an order is due now that this
    /// claimer did not take (another's, or a version it does not run), and while
    /// nothing is heard, or the clock is injected.
    pub(crate) async fn wait_claimable_for(&self, seen: &mut u64, within: std::time::Duration) {
        let woken = self.wakeups.claims.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if self.wakeups.claims.sent() == *seen {
            self.driver.start_listening(&self.wakeups);
            let wait = self.claim_wait(within).await;
            let _ = tokio::time::timeout(wait, woken).await;
        }
        *seen = self.wakeups.claims.sent();
    }

    /// How long a claimer that found nothing may wait for the clock alone (see
    /// [`Self::wait_claimable_for`]).
    async fn claim_wait(&self, within: std::time::Duration) -> std::time::Duration {
        let next = q(D::SQL.next_claimable).bind(self.driver.now_param());
        self.until_due(next, CLAIM_SAFETY_POLL, "claimable orders")
            .await
            .unwrap_or(within)
    }

    /// Whether a wait may be timed by the store rather than by its poll: other
    /// processes' writes are heard (their wake-ups say when something changes) and the
    /// clock is the real one.
    pub(crate) fn waits_timed_by_store(&self) -> bool {
        self.wakeups
            .hearing
            .load(std::sync::atomic::Ordering::Acquire)
            && !self.driver.clock_injected()
    }

    /// While [`Self::waits_timed_by_store`], how long until the time `next` reads (one
    /// row: `due`, NULL when nothing waits, and the store's `now`), at most `safety`.
    /// `None`, for the caller's own poll, otherwise: while something is due now, or
    /// when the store cannot tell (said in the log with `of`: a queue, or claimable
    /// orders).
    pub(crate) async fn until_due(
        &self,
        next: crate::driver::Q<'_>,
        safety: std::time::Duration,
        of: &str,
    ) -> Option<std::time::Duration> {
        if !self.waits_timed_by_store() {
            return None;
        }
        let due = async {
            let mut conn = self.driver.acquire().await?;
            let row = next.fetch_one::<D>(&mut conn).await.map_err(db)?;
            let c = Cols(&row);
            Ok::<_, Error>((c.opt_ts("due")?, c.ts("now")?))
        };
        match due.await {
            Ok((None, _)) => Some(safety),
            Ok((Some(due), now)) => match (due - now).to_std() {
                Ok(until) if !until.is_zero() => Some(until.min(safety)),
                _ => None,
            },
            Err(e) => {
                tracing::debug!(of, error = %e, "cannot tell when the next one comes due");
                None
            }
        }
    }

    /// Refuses the write unless `leader`'s term is the current one: the first statement
    /// of every leader's transaction.
    pub(crate) async fn check_leader(
        conn: &mut D::Conn,
        leader: &orderly_core::leader::LeaderFence,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let n = q(st::LEADER_GUARD)
            .bind(&leader.name)
            .bind(leader.epoch.0)
            .bind(leader.holder.as_str())
            .bind(Ts(now))
            .execute::<D>(conn)
            .await
            .map_err(db)?;
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

    pub(crate) async fn fetch_state(
        conn: &mut D::Conn,
        order_id: &OrderId,
    ) -> Result<Option<StateRow>> {
        Self::state_by(conn, q(st::SELECT_STATE), order_id).await
    }

    /// [`Self::fetch_state`], holding the row for the rest of the transaction (PostgreSQL;
    /// on SQLite the write transaction already holds the whole file). A writer that
    /// changed the row and has not committed is waited for, so what the transaction
    /// reads after this (the order's steps) includes what that writer did with it.
    pub(crate) async fn lock_state(
        conn: &mut D::Conn,
        order_id: &OrderId,
    ) -> Result<Option<StateRow>> {
        let select = format!("{}{}", st::SELECT_STATE, D::SQL.for_update);
        Self::state_by(conn, Q::dynamic(select), order_id).await
    }

    /// The state row of `order_id` read by `select` (a form of [`st::SELECT_STATE`]).
    async fn state_by(
        conn: &mut D::Conn,
        select: Q<'_>,
        order_id: &OrderId,
    ) -> Result<Option<StateRow>> {
        let row = select
            .bind(order_id.as_str())
            .fetch_optional::<D>(conn)
            .await
            .map_err(db)?;
        row.as_ref().map(|r| Cols(r).state_row()).transpose()
    }

    pub(crate) async fn fetch_steps(
        conn: &mut D::Conn,
        order_id: &OrderId,
    ) -> Result<Vec<StepRecord>> {
        q(st::SELECT_STEPS)
            .bind(order_id.as_str())
            .fetch_all::<D>(conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Cols(r).step_record())
            .collect()
    }

    /// The stored details of `order_id`.
    pub(crate) async fn fetch_details(
        conn: &mut D::Conn,
        order_id: &OrderId,
    ) -> Result<orderly_core::OrderDetails> {
        let row = q(D::SQL.select_details)
            .bind(order_id.as_str())
            .fetch_one::<D>(conn)
            .await
            .map_err(db)?;
        let details: String = Cols(&row).get("details")?;
        orderly_core::OrderDetails::from_json(&details)
            .map_err(|e| crate::error::corrupt("orders.details", e))
    }

    pub(crate) async fn append(conn: &mut D::Conn, ev: Event<'_>) -> Result<()> {
        q(st::INSERT_HISTORY)
            .bind(ev.order_id.as_str())
            .bind(Ts(ev.at))
            .bind(ev.actor)
            .bind(ev.kind.as_str())
            .bind(ev.from.map(ProcessState::as_str))
            .bind(ev.to.as_str())
            .bind(ev.epoch)
            .bind(ev.step)
            .bind(ev.reason.map(bounded_text))
            .execute::<D>(conn)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Why a fenced write matched no row.
    pub(crate) async fn explain(
        conn: &mut D::Conn,
        fence: &Fence,
        now: DateTime<Utc>,
        target: ProcessState,
    ) -> Error {
        match Self::fetch_state(conn, &fence.order_id).await {
            Ok(row) => refusal(fence, row, now, target),
            Err(e) => e,
        }
    }
}

/// The deliveries a commit is to end ([`SqlStore::to_consume`]): `held[k]` is the
/// message of item `slots[k]`, of `items` in all.
pub(crate) struct Consuming<'m> {
    items: usize,
    slots: Vec<usize>,
    pub held: Vec<&'m orderly_core::transport::ReceivedMessage>,
}

impl Consuming<'_> {
    /// Item by item, whether its message was consumed, from the commit's verdicts on
    /// `held`.
    pub fn consumed(&self, ended: Vec<bool>) -> Vec<bool> {
        let mut consumed = vec![false; self.items];
        for (&i, ended) in self.slots.iter().zip(ended) {
            consumed[i] = ended;
        }
        consumed
    }
}

/// Checks a claim's limit and timeout; the timeout in microseconds.
pub(crate) fn checked_claim(request: &ClaimRequest) -> Result<i64> {
    if request.limit == 0 || request.limit > MAX_BATCH {
        return Err(ValidationError::new("limit", format!("must be 1 to {MAX_BATCH}")).into());
    }
    timeout_micros(request.timeout)
}

/// A processing timeout or extension in microseconds: more than zero, at most 7 days.
pub(crate) fn timeout_micros(d: std::time::Duration) -> Result<i64> {
    const MAX: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
    if d.is_zero() || d > MAX {
        return Err(
            ValidationError::new("timeout", "must be more than 0 and at most 7 days").into(),
        );
    }
    Ok(d.as_micros() as i64)
}

/// The history kind a step status records.
pub(crate) fn step_kind(status: orderly_core::StepStatus) -> HistoryKind {
    use orderly_core::StepStatus;
    match status {
        StepStatus::Started => HistoryKind::StepStarted,
        StepStatus::Succeeded => HistoryKind::StepSucceeded,
        StepStatus::Failed => HistoryKind::StepFailed,
        StepStatus::Compensated => HistoryKind::StepCompensated,
    }
}
