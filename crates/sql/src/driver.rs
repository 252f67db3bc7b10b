//! The seam between the store's logic and a SQL dialect.
//!
//! The store, queue and outbox (`store/`, `queue/`, `outbox.rs`) are written once,
//! generic over a [`Driver`]. A driver maps statements to its database: it binds
//! [`Param`]s, runs a [`Q`] on a connection, hands back rows that decode through
//! [`SqlRow`], and runs the few hot statements whose shape differs by dialect
//! (a claim, a batch of completions, step writes, recoveries, message inserts) from
//! values the shared code has already decided: which rows, with which values (a
//! record's attempts, an entry's reason cut to length, each new order once). Each
//! dialect's SQL text lives in its `statements.rs`, under the same names in both
//! ([`Statements`]); the conformance suite (`store/conformance.rs`) runs the same calls
//! on both and requires the same rows.

use std::collections::HashSet;
use std::ops::DerefMut;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use orderly_core::transport::ReceivedMessage;
use orderly_core::{Fence, Result};

use crate::migrate::Migration;
use crate::time::Ts;
use crate::wakeups::Wakeups;

mod bind;
mod cols;
mod texts;
mod writes;

pub(crate) use bind::*;
pub(crate) use cols::*;
pub(crate) use texts::*;
pub(crate) use writes::*;

/// A SQL dialect: its connections, how it binds and runs statements, and its hot
/// statements. Everything it is given is decided; it decides nothing.
#[async_trait]
pub(crate) trait Driver: Send + Sync + 'static {
    /// The dialect's name, in logs.
    const NAME: &'static str;
    /// Its text of the statements the shared code runs.
    const SQL: Statements;
    /// Its migrations, in order.
    const MIGRATIONS: &'static [Migration];

    type Conn: Send;
    /// A write transaction (serialized with other writers where the dialect needs it).
    type Tx: Send + DerefMut<Target = Self::Conn>;
    /// A connection from the pool, for reads.
    type Pooled: Send + DerefMut<Target = Self::Conn>;
    type Row: SqlRow + 'static;

    async fn begin_write(&self) -> Result<Self::Tx>;
    /// A write transaction for a claim: [`Self::begin_write`] with whatever the
    /// dialect needs for the claim to read its index well.
    async fn begin_claim(&self) -> Result<Self::Tx> {
        self.begin_write().await
    }
    async fn commit(tx: Self::Tx) -> Result<(), sqlx::Error>;
    async fn acquire(&self) -> Result<Self::Pooled>;
    /// This handle's counters (write transactions, batch sizes).
    fn stats(&self) -> &std::sync::Arc<crate::stats::Stats>;

    /// "Now" inside a transaction: the injected clock if any, else the dialect's clock
    /// (PostgreSQL: the server's; SQLite: the host's).
    async fn now(&self, conn: &mut Self::Conn) -> Result<DateTime<Utc>>;
    /// "Now" as a parameter of a statement run on its own (PostgreSQL: NULL for the
    /// server's clock unless one is injected).
    fn now_param(&self) -> Param<'static>;
    /// Whether time is an injected clock (tests), which moves only when told, so
    /// that no wait may be timed by when the store says something comes due.
    fn clock_injected(&self) -> bool;

    /// Makes concurrent start-ups migrate one after the other.
    async fn lock_migrations(conn: &mut Self::Conn) -> Result<()>;
    /// Runs a migration's script.
    async fn run_script(conn: &mut Self::Conn, sql: &'static str) -> Result<(), sqlx::Error>;

    async fn execute(conn: &mut Self::Conn, q: Q<'_>) -> Result<u64, sqlx::Error>;
    async fn fetch_all(conn: &mut Self::Conn, q: Q<'_>) -> Result<Vec<Self::Row>, sqlx::Error>;
    async fn fetch_optional(
        conn: &mut Self::Conn,
        q: Q<'_>,
    ) -> Result<Option<Self::Row>, sqlx::Error>;

    /// Claims up to the request's limit as the first statement of the caller's
    /// transaction, with the claims' history (kind `Claimed`), on the transaction's
    /// clock (PostgreSQL: read by the claim itself, no round trip of its own); returns
    /// what it claimed and that clock's now, or `None` if it claimed nothing.
    async fn claim_first(
        &self,
        conn: &mut Self::Conn,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Option<(Vec<ClaimedOrder>, DateTime<Utc>)>>;
    /// [`Driver::claim_first`] as a transaction of its own.
    async fn claim(&self, request: &ClaimRequest, timeout_micros: i64)
    -> Result<Vec<ClaimedOrder>>;

    /// Completes the orders `fences` hold inside the caller's transaction, with their
    /// history (kind `Completed`); returns the ids it completed.
    async fn complete_in(
        conn: &mut Self::Conn,
        now: DateTime<Utc>,
        fences: &[&Fence],
    ) -> Result<HashSet<String>>;
    /// [`Driver::complete_in`] as a transaction of its own.
    async fn complete(&self, fences: &[&Fence]) -> Result<HashSet<String>>;

    /// The fenced touches of a batch of step writes (at most one per order) and, for
    /// the orders it touched, their step records and history entries (`rows`, in
    /// order); returns the ids of the orders it touched. A refused touch writes none
    /// of its rows. A touched order whose touch `complete`s is completed with it
    /// (Processed, its lock released, its Completed entry after its steps'), or the
    /// whole call fails (retryable) and the caller rolls back.
    async fn write_steps(
        conn: &mut Self::Conn,
        now: DateTime<Utc>,
        touches: &[Touch<'_>],
        rows: Vec<StepRow<'_>>,
    ) -> Result<HashSet<String>>;
    /// [`Self::write_steps`] that, for the orders it touched and no others, also
    /// inserts their messages `sends` (into queues that detect no duplicates) and
    /// completes their holds `holds`, in the same statement; other processes hear, at
    /// commit, of each queue that got any (the origin `origin`, as in
    /// [`crate::wakeups::Wakeups::notice`]). `None` where the dialect has no such
    /// statement: the caller writes, then sends.
    async fn write_steps_sending(
        _conn: &mut Self::Conn,
        _now: DateTime<Utc>,
        _touches: &[Touch<'_>],
        _rows: Vec<StepRow<'_>>,
        _sends: &[SendFor<'_>],
        _holds: &[HoldFor<'_>],
        _origin: &str,
    ) -> Result<Option<SentWith>> {
        Ok(None)
    }
    /// [`Self::insert_orders`] that, for the orders it inserted and no others, also
    /// inserts their messages `sends` and completes their holds `holds`, as
    /// [`Self::write_steps_sending`], and, if it inserted any, lets other processes
    /// hear at commit that orders can be claimed. `None` where the dialect has no such
    /// statement.
    async fn insert_orders_sending(
        _conn: &mut Self::Conn,
        _now: DateTime<Utc>,
        _actor: &str,
        _orders: &[NewOrderRow<'_>],
        _sends: &[SendFor<'_>],
        _holds: &[HoldFor<'_>],
        _origin: &str,
    ) -> Result<Option<SentWith>> {
        Ok(None)
    }
    /// Inserts the orders whose id is new (details, Pending state row, Submitted
    /// history entry by `actor`); `orders` names each id once. Returns the ids inserted.
    async fn insert_orders(
        conn: &mut Self::Conn,
        now: DateTime<Utc>,
        actor: &str,
        orders: &[NewOrderRow<'_>],
    ) -> Result<HashSet<String>>;

    /// Applies decided recoveries (each still Processing under its epoch and past its
    /// deadline) with their history, by `actor`; returns the ids it applied.
    async fn recover(
        conn: &mut Self::Conn,
        now: DateTime<Utc>,
        actor: &str,
        recoveries: &[RecoveryRow],
    ) -> Result<HashSet<String>>;

    /// Inserts messages into `queue` unless (with a duplicate window `dedup_ms` long)
    /// their id was seen within the window, and completes the holds `held` (deletes
    /// the messages still held under their lock tokens, locks not expired at `now`), in
    /// the caller's transaction; returns how many it inserted and the holds it
    /// completed. No rows: it only completes (`queue` unused). If it inserted any,
    /// other processes hear `notice` at commit, as from [`Self::notify_sent`].
    async fn insert_messages(
        conn: &mut Self::Conn,
        now: Ts,
        queue: &str,
        dedup_ms: Option<i64>,
        rows: &[MessageRow<'_>],
        held: &[&ReceivedMessage],
        notice: &str,
    ) -> Result<SentAndCompleted, sqlx::Error>;
    /// A send of `rows` to `queue` and the completion of the holds `held` (as
    /// [`Self::insert_messages`], its duplicate window `dedup_ms` long; `None`: none)
    /// as ONE statement on a connection of its own,
    /// which reads the clock itself (`now`: the injected clock, if any) and is a
    /// transaction by itself: one round trip where a transaction takes five (`BEGIN`,
    /// the clock, the send, the completion, `COMMIT`). `None` where the dialect has no
    /// such statement (SQLite: a write takes the writer's turn like any other); the
    /// caller then runs them in a transaction.
    async fn send_and_complete_alone(
        &self,
        _queue: &str,
        _dedup_ms: Option<i64>,
        _rows: &[MessageRow<'_>],
        _held: &[&ReceivedMessage],
        _notice: &str,
    ) -> Result<Option<SentAndCompleted>> {
        Ok(None)
    }
    /// Tells other processes, at commit, that `what` happened: a queue's name (it has
    /// new messages) or [`crate::wakeups::CLAIMABLE`] (orders can be claimed).
    async fn notify_sent(conn: &mut Self::Conn, what: &str) -> Result<(), sqlx::Error>;
    /// Starts, once, waking `wakeups` on other processes' sends (where the dialect can).
    fn start_listening(&self, wakeups: &Arc<Wakeups>);
}

/// What is first in line on a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// No visible message.
    Empty,
    /// A message to deliver.
    Ready,
    /// A message delivered too often: to be dead-lettered.
    Exhausted,
}

/// How an item of a write that sent ([`crate::store::SqlStore::settle_sent`]) ends its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// In the write's own statement: its write was applied.
    InWrite,
    /// Now, after the write: its item is settled for good all the same.
    After,
    /// Not: kept, to be tried again or settled by the caller.
    Kept,
}
