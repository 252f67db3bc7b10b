//! The PostgreSQL state store: production and scale.
//!
//! Claims take rows with `FOR UPDATE SKIP LOCKED`, so concurrent schedulers never wait
//! for one another and never get the same row. The hot paths (claim, batched
//! completion, step writes, the supervisor's sweep) are one statement each, one round
//! trip for a whole batch, history included. Deadlines are compared on the server's
//! clock (`now()`, the transaction's start), unless a test injects its own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use orderly_core::transport::ReceivedMessage;
use orderly_core::{Fence, Result, TimeSource};
use sqlx::Postgres;
use sqlx::postgres::PgRow;
use sqlx_core::transaction::TransactionManager;

use crate::driver::{
    Driver, HoldFor, List, MessageRow, NewOrderRow, Param, Q, Query, RecoveryRow, SendFor,
    SentAndCompleted, SentWith, StepRow, Touch, q,
};
use crate::error::db;
use crate::migrate;
use crate::rows::Cols;
use crate::store::SqlStore;
use crate::time::Ts;
use crate::wakeups::Wakeups;

mod conn;
#[cfg(feature = "counters")]
mod counters;
mod listen;
mod statements;

pub use conn::{ANSWER_TIMEOUT_SETTING, DEFAULT_ANSWER_TIMEOUT, PgConn, answer_timeout_from_env};
use conn::{Pools, Transactions, Within};
#[cfg(feature = "counters")]
pub use counters::{
    DatabaseLog, ServerCounters, TableWrites, begin_counting, database_log, end_counting,
    server_counters, vacuum, wait_quiet,
};

use statements as sql;

mod batches;

use batches::*;

mod open;

pub use open::*;

/// The text of the queue's take (parameters: queue, now or NULL, limit, deliveries
/// allowed, lock token, lock in milliseconds), for the tests that read the server's
/// plan of it.
#[doc(hidden)]
pub const TAKE: &str = statements::Q_RECEIVE;

/// Connections per store unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The PostgreSQL state store (the SQL queue and the outbox in the same database).
pub type PgStore = SqlStore<PgDriver>;

/// The PostgreSQL dialect of [`SqlStore`]: its pool and its clock.
#[derive(Debug, Clone)]
pub struct PgDriver {
    pools: Arc<Pools>,
    time: TimeSource,
    stats: Arc<crate::stats::Stats>,
    /// How long any answer is waited for ([`conn::answer_timeout_from_env`]).
    answer_timeout: Duration,
}

/// The fallback poll interval of idle receivers (notifications are the fast path).
const POLL: Duration = Duration::from_secs(1);

impl PgDriver {
    fn injected_now(&self) -> Option<Ts> {
        self.time.injected_now().map(Ts)
    }
}

/// Binds a list as an array.
fn bind_list(query: Query<Postgres>, list: List) -> Query<Postgres> {
    match list {
        List::I64s(v) => query.bind(v),
        List::Texts(v) => query.bind(v),
    }
}

fn prepare(q: Q<'_>) -> Query<Postgres> {
    crate::driver::prepare(q, bind_list)
}

#[async_trait]
impl Driver for PgDriver {
    const NAME: &'static str = "postgres";
    const SQL: crate::driver::Statements = sql::SQL;
    const MIGRATIONS: &'static [migrate::Migration] = migrate::POSTGRES;

    type Conn = PgConn;
    type Tx = Box<PgConn>;
    type Pooled = Box<PgConn>;
    type Row = PgRow;

    async fn begin_write(&self) -> Result<Self::Tx> {
        self.stats.write_alone();
        begin_to_the_end(self.pools.clone(), self.answer_timeout, None).await
    }

    /// The claim reads `order_state_claimable` in order with a plain index scan: it
    /// marks the entries of rows that have left Pending as dead, so the next claim
    /// skips them. Expecting few rows (a new table, or statistics from a quiet
    /// moment), the planner would otherwise pick a bitmap scan and a sort, which mark
    /// nothing: every claim re-read each such entry and its heap page until a vacuum
    /// (7,000 entries and 200 pages for an empty claim, 0.4 ms, in the bench). Set
    /// for this transaction only, in the same round trip as its `BEGIN`.
    async fn begin_claim(&self) -> Result<Self::Tx> {
        self.stats.write_alone();
        begin_to_the_end(
            self.pools.clone(),
            self.answer_timeout,
            Some("BEGIN; SET LOCAL enable_bitmapscan = off"),
        )
        .await
    }

    async fn commit(mut tx: Self::Tx) -> Result<(), sqlx::Error> {
        let (raw, watch) = tx.parts();
        Transactions::commit(raw).within(watch).await
    }

    async fn acquire(&self) -> Result<Self::Pooled> {
        let conn = self.pools.acquire(self.answer_timeout).await;
        Ok(Box::new(conn.map_err(db)?))
    }

    fn stats(&self) -> &Arc<crate::stats::Stats> {
        &self.stats
    }

    async fn now(&self, conn: &mut PgConn) -> Result<DateTime<Utc>> {
        let row = q(sql::NOW)
            .bind(self.injected_now())
            .fetch_one::<Self>(conn)
            .await
            .map_err(db)?;
        Ok(Cols(&row).ts("now")?)
    }

    fn now_param(&self) -> Param<'static> {
        Param::OptTs(self.injected_now())
    }

    fn clock_injected(&self) -> bool {
        matches!(self.time, orderly_core::clock::TimeSource::Clock(_))
    }

    /// Start-ups of several instances at once migrate one after the other.
    async fn lock_migrations(conn: &mut PgConn) -> Result<()> {
        let (raw, watch) = conn.parts();
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.orderly_migrations'))",
        )
        .execute(raw)
        .within(watch)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn run_script(conn: &mut PgConn, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sql)
            .execute(conn.unbounded())
            .await
            .map(|_| ())
    }

    async fn execute(conn: &mut PgConn, q: Q<'_>) -> Result<u64, sqlx::Error> {
        let (raw, watch) = conn.parts();
        Ok(prepare(q).execute(raw).within(watch).await?.rows_affected())
    }

    async fn fetch_all(conn: &mut PgConn, q: Q<'_>) -> Result<Vec<PgRow>, sqlx::Error> {
        let (raw, watch) = conn.parts();
        prepare(q).fetch_all(raw).within(watch).await
    }

    async fn fetch_optional(conn: &mut PgConn, q: Q<'_>) -> Result<Option<PgRow>, sqlx::Error> {
        let (raw, watch) = conn.parts();
        prepare(q).fetch_optional(raw).within(watch).await
    }

    /// The claim reads the clock itself and says it in each row.
    async fn claim_first(
        &self,
        conn: &mut PgConn,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Option<(Vec<ClaimedOrder>, DateTime<Utc>)>> {
        let (raw, watch) = conn.parts();
        let rows = claim_query(self.injected_now(), request, timeout_micros)?
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let now = Cols(first).ts("at")?;
        Ok(Some((claimed_orders(&rows, request)?, now)))
    }

    /// One statement on its own: claim, history and details in one round trip.
    async fn claim(
        &self,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let mut conn = self.acquire().await?;
        let (raw, watch) = conn.parts();
        let rows = claim_query(self.injected_now(), request, timeout_micros)?
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        claimed_orders(&rows, request)
    }

    async fn complete_in(
        conn: &mut PgConn,
        now: DateTime<Utc>,
        fences: &[&Fence],
    ) -> Result<HashSet<String>> {
        let (raw, watch) = conn.parts();
        order_ids(
            complete_query(Some(Ts(now)), fences)
                .fetch_all(raw)
                .within(watch)
                .await
                .map_err(db)?,
        )
    }

    /// One statement on its own: nothing else to commit with it.
    async fn complete(&self, fences: &[&Fence]) -> Result<HashSet<String>> {
        let mut conn = self.acquire().await?;
        let (raw, watch) = conn.parts();
        order_ids(
            complete_query(self.injected_now(), fences)
                .fetch_all(raw)
                .within(watch)
                .await
                .map_err(db)?,
        )
    }

    /// One statement: the touch, and the records and history of what it touched.
    async fn write_steps(
        conn: &mut PgConn,
        now: DateTime<Utc>,
        touches: &[Touch<'_>],
        rows: Vec<StepRow<'_>>,
    ) -> Result<HashSet<String>> {
        let (raw, watch) = conn.parts();
        let (ids, batch) = steps_batch(touches, &rows);
        let rows = sqlx::query(sql::WRITE_STEPS)
            .bind(Ts(now))
            .bind(ids)
            .bind(batch)
            .bind(HistoryKind::Completed.as_str())
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        order_ids(rows)
    }

    /// One statement: the touch, the records and history, the sends and the
    /// completions of what it touched.
    async fn write_steps_sending(
        conn: &mut PgConn,
        now: DateTime<Utc>,
        touches: &[Touch<'_>],
        rows: Vec<StepRow<'_>>,
        sends: &[SendFor<'_>],
        holds: &[HoldFor<'_>],
        origin: &str,
    ) -> Result<Option<SentWith>> {
        let (raw, watch) = conn.parts();
        let (ids, batch) = steps_batch(touches, &rows);
        let query = sqlx::query_as(sql::WRITE_STEPS_SENDING)
            .bind(Ts(now))
            .bind(ids)
            .bind(batch)
            .bind(HistoryKind::Completed.as_str());
        let rows = bind_sending(query, sends, holds, origin)
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        Ok(Some(sent_with(rows)))
    }

    // The batch statements are prepared once per connection and their plans kept: an
    // insert from `unnest` plans the same whatever the arrays hold, and an update finds
    // its rows by primary key and looks each up in its batch (no join to plan for the
    // batch's size). Parsing and planning each batch afresh was server work on every
    // write.
    async fn insert_orders(
        conn: &mut PgConn,
        now: DateTime<Utc>,
        actor: &str,
        orders: &[NewOrderRow<'_>],
    ) -> Result<HashSet<String>> {
        let (raw, watch) = conn.parts();
        let rows: Vec<(String,)> =
            bind_orders(sqlx::query_as(sql::INSERT_ORDERS), now, actor, orders)
                .fetch_all(raw)
                .within(watch)
                .await
                .map_err(db)?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// One statement: the new orders, their sends, the completions of their holds and
    /// the notification that orders can be claimed.
    async fn insert_orders_sending(
        conn: &mut PgConn,
        now: DateTime<Utc>,
        actor: &str,
        orders: &[NewOrderRow<'_>],
        sends: &[SendFor<'_>],
        holds: &[HoldFor<'_>],
        origin: &str,
    ) -> Result<Option<SentWith>> {
        let (raw, watch) = conn.parts();
        let query = bind_orders(
            sqlx::query_as(sql::INSERT_ORDERS_SENDING),
            now,
            actor,
            orders,
        );
        let rows = bind_sending(query, sends, holds, origin)
            .bind(crate::wakeups::CLAIMABLE)
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        Ok(Some(sent_with(rows)))
    }

    async fn recover(
        conn: &mut PgConn,
        now: DateTime<Utc>,
        actor: &str,
        recoveries: &[RecoveryRow],
    ) -> Result<HashSet<String>> {
        let (raw, watch) = conn.parts();
        let batch = batch_of(
            recoveries,
            |r| r.order_id.as_str(),
            |r| {
                serde_json::json!({
                    "epoch": r.epoch,
                    "failures": r.failure_count,
                    "state": r.state,
                    "finish_as": r.finish_as,
                    "next_at": r.next_attempt_at.map(Ts::to_text),
                    "reason": r.reason,
                    "kind": r.kind,
                })
            },
        );
        let rows = sqlx::query(sql::RECOVER)
            .bind(Ts(now))
            .bind(actor)
            .bind(
                recoveries
                    .iter()
                    .map(|r| r.order_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(batch)
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        order_ids(rows)
    }

    /// One statement for the whole batch, its duplicate check, its notification and the
    /// completions that go with it.
    async fn insert_messages(
        conn: &mut PgConn,
        now: Ts,
        queue: &str,
        dedup_ms: Option<i64>,
        rows: &[MessageRow<'_>],
        held: &[&ReceivedMessage],
        notice: &str,
    ) -> Result<SentAndCompleted, sqlx::Error> {
        let (raw, watch) = conn.parts();
        let sent = send_query(queue, Some(now), dedup_ms, rows, held, notice)
            .fetch_all(raw)
            .within(watch)
            .await?;
        Ok(sent_and_completed(sent))
    }

    /// The same statement as a send's, on a connection of its own.
    async fn send_and_complete_alone(
        &self,
        queue: &str,
        dedup_ms: Option<i64>,
        rows: &[MessageRow<'_>],
        held: &[&ReceivedMessage],
        notice: &str,
    ) -> Result<Option<SentAndCompleted>> {
        let mut conn = self.acquire().await?;
        self.stats.write_alone();
        let (raw, watch) = conn.parts();
        let sent = send_query(queue, self.injected_now(), dedup_ms, rows, held, notice)
            .fetch_all(raw)
            .within(watch)
            .await
            .map_err(db)?;
        Ok(Some(sent_and_completed(sent)))
    }

    /// `NOTIFY` inside the sending transaction: delivered to listeners at commit.
    async fn notify_sent(conn: &mut PgConn, what: &str) -> Result<(), sqlx::Error> {
        let (raw, watch) = conn.parts();
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(crate::wakeups::CHANNEL)
            .bind(what)
            .execute(raw)
            .within(watch)
            .await
            .map(|_| ())
    }

    /// Starts, once, a task that `LISTEN`s for sends from any process and wakes this
    /// store's receivers. It holds one connection of the pool. If the listener cannot
    /// connect (e.g. behind a transaction-pooling proxy) receivers still poll.
    fn start_listening(&self, wakeups: &Arc<Wakeups>) {
        use std::sync::atomic::Ordering;
        if wakeups.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        let pools = self.pools.clone();
        let answer_timeout = self.answer_timeout;
        let wakeups = Arc::downgrade(wakeups);
        tokio::spawn(async move {
            // Until the wake-ups are dropped: listen, and between connections poll.
            while listen::listen(&pools, answer_timeout, &wakeups)
                .await
                .is_continue()
            {
                let Some(w) = wakeups.upgrade() else { return };
                w.hearing_lost();
                drop(w);
                tokio::time::sleep(POLL).await;
            }
        });
    }
}
