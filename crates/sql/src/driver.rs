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

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
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

/// A value bound to a statement parameter.
#[derive(Debug, Clone)]
pub(crate) enum Param<'a> {
    Text(Cow<'a, str>),
    OptText(Option<Cow<'a, str>>),
    I64(i64),
    OptI64(Option<i64>),
    I32(i32),
    OptI32(Option<i32>),
    Bool(bool),
    Ts(Ts),
    OptTs(Option<Ts>),
    Bytes(&'a [u8]),
    /// Bytes the statement takes over (a batch built for it), bound without a copy.
    OwnedBytes(Vec<u8>),
    /// A list: bound as the dialect binds lists (see [`prepare`]).
    List(List),
}

/// A list parameter: an array on PostgreSQL, a JSON array on SQLite (read there with
/// `json_each`).
#[derive(Debug, Clone)]
pub(crate) enum List {
    I64s(Vec<i64>),
    Texts(Vec<String>),
}

/// A statement ready to run on a dialect.
pub(crate) type Query<DB> = sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// `q` as a statement of `DB`: scalars bound the same way in every dialect (borrowed
/// text and bytes are encoded straight from the borrow), lists by `bind_list`.
pub(crate) fn prepare<DB>(q: Q<'_>, bind_list: fn(Query<DB>, List) -> Query<DB>) -> Query<DB>
where
    DB: sqlx::Database,
    for<'e> &'e str: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<&'e str>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> &'e [u8]: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Vec<u8>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> i64: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<i64>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> i32: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<i32>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> bool: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Ts: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
    for<'e> Option<Ts>: sqlx::Encode<'e, DB> + sqlx::Type<DB>,
{
    let query = match q.sql {
        Cow::Borrowed(sql) => sqlx::query(sql),
        Cow::Owned(sql) => sqlx::query(sqlx::AssertSqlSafe(sql)),
    };
    q.params
        .into_iter()
        .fold(query, |query, param| match param {
            Param::Text(v) => query.bind(&*v),
            Param::OptText(v) => query.bind(v.as_deref()),
            Param::I64(v) => query.bind(v),
            Param::OptI64(v) => query.bind(v),
            Param::I32(v) => query.bind(v),
            Param::OptI32(v) => query.bind(v),
            Param::Bool(v) => query.bind(v),
            Param::Ts(v) => query.bind(v),
            Param::OptTs(v) => query.bind(v),
            Param::Bytes(v) => query.bind(v),
            Param::OwnedBytes(v) => query.bind(v),
            Param::List(list) => bind_list(query, list),
        })
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(v: &'a str) -> Self {
        Param::Text(Cow::Borrowed(v))
    }
}
impl<'a> From<&'a String> for Param<'a> {
    fn from(v: &'a String) -> Self {
        Param::Text(Cow::Borrowed(v))
    }
}
impl From<String> for Param<'_> {
    fn from(v: String) -> Self {
        Param::Text(Cow::Owned(v))
    }
}
impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Param::OptText(v.map(Cow::Borrowed))
    }
}
impl From<Option<String>> for Param<'_> {
    fn from(v: Option<String>) -> Self {
        Param::OptText(v.map(Cow::Owned))
    }
}
impl From<i64> for Param<'_> {
    fn from(v: i64) -> Self {
        Param::I64(v)
    }
}
impl From<Option<i64>> for Param<'_> {
    fn from(v: Option<i64>) -> Self {
        Param::OptI64(v)
    }
}
impl From<i32> for Param<'_> {
    fn from(v: i32) -> Self {
        Param::I32(v)
    }
}
impl From<Option<i32>> for Param<'_> {
    fn from(v: Option<i32>) -> Self {
        Param::OptI32(v)
    }
}
impl From<bool> for Param<'_> {
    fn from(v: bool) -> Self {
        Param::Bool(v)
    }
}
impl From<Ts> for Param<'_> {
    fn from(v: Ts) -> Self {
        Param::Ts(v)
    }
}
impl From<Option<Ts>> for Param<'_> {
    fn from(v: Option<Ts>) -> Self {
        Param::OptTs(v)
    }
}
impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(v: &'a [u8]) -> Self {
        Param::Bytes(v)
    }
}
impl<'a> From<&'a Vec<u8>> for Param<'a> {
    fn from(v: &'a Vec<u8>) -> Self {
        Param::Bytes(v)
    }
}
impl From<Vec<u8>> for Param<'_> {
    fn from(v: Vec<u8>) -> Self {
        Param::OwnedBytes(v)
    }
}
impl From<Vec<i64>> for Param<'_> {
    fn from(v: Vec<i64>) -> Self {
        Param::List(List::I64s(v))
    }
}
impl From<Vec<String>> for Param<'_> {
    fn from(v: Vec<String>) -> Self {
        Param::List(List::Texts(v))
    }
}

/// A statement and its parameters, `$1` first.
#[derive(Debug, Clone)]
pub(crate) struct Q<'a> {
    pub sql: Cow<'static, str>,
    pub params: Vec<Param<'a>>,
}

/// A statement to bind parameters to.
pub(crate) fn q<'a>(sql: &'static str) -> Q<'a> {
    Q {
        sql: Cow::Borrowed(sql),
        params: Vec::new(),
    }
}

impl<'a> Q<'a> {
    /// A statement built at run time (its values still bound as parameters).
    pub fn dynamic(sql: String) -> Self {
        Q {
            sql: Cow::Owned(sql),
            params: Vec::new(),
        }
    }

    /// Binds the next parameter.
    pub fn bind(mut self, value: impl Into<Param<'a>>) -> Self {
        self.params.push(value.into());
        self
    }

    /// Runs it; the number of rows it changed.
    pub async fn execute<D: Driver>(self, conn: &mut D::Conn) -> Result<u64, sqlx::Error> {
        D::execute(conn, self).await
    }

    /// Runs it; every row it returned.
    pub async fn fetch_all<D: Driver>(
        self,
        conn: &mut D::Conn,
    ) -> Result<Vec<D::Row>, sqlx::Error> {
        D::fetch_all(conn, self).await
    }

    /// Runs it; its first row, if any.
    pub async fn fetch_optional<D: Driver>(
        self,
        conn: &mut D::Conn,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        D::fetch_optional(conn, self).await
    }

    /// Runs it; its one row.
    pub async fn fetch_one<D: Driver>(self, conn: &mut D::Conn) -> Result<D::Row, sqlx::Error> {
        D::fetch_optional(conn, self)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }
}

/// A row, read column by column (by name). Implemented for the rows of every dialect.
pub(crate) trait SqlRow: Send + Sync {
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error>;
    fn int64(&self, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn int32(&self, col: &str) -> Result<Option<i32>, sqlx::Error>;
    fn boolean(&self, col: &str) -> Result<Option<bool>, sqlx::Error>;
    fn bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error>;
    fn ts(&self, col: &str) -> Result<Option<Ts>, sqlx::Error>;
}

impl<R> SqlRow for R
where
    R: sqlx::Row + Send + Sync,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Ts: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(col)
    }
    fn int64(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(col)
    }
    fn int32(&self, col: &str) -> Result<Option<i32>, sqlx::Error> {
        self.try_get(col)
    }
    fn boolean(&self, col: &str) -> Result<Option<bool>, sqlx::Error> {
        self.try_get(col)
    }
    fn bytes(&self, col: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        self.try_get(col)
    }
    fn ts(&self, col: &str) -> Result<Option<Ts>, sqlx::Error> {
        self.try_get(col)
    }
}

/// A column type a [`SqlRow`] can be read as.
pub(crate) trait FromCol: Sized {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error>;
}

fn required<T>(value: Option<T>, col: &str) -> Result<T, sqlx::Error> {
    value.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_owned(),
        source: "unexpected NULL".into(),
    })
}

/// A column type [`SqlRow`] reads directly.
pub(crate) trait ColType: Sized {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error>;
}

impl<T: ColType> FromCol for Option<T> {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        T::read(row, col)
    }
}

impl ColType for String {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.text(col)
    }
}

impl FromCol for String {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.text(col)?, col)
    }
}

impl ColType for i64 {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.int64(col)
    }
}

impl FromCol for i64 {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.int64(col)?, col)
    }
}

impl ColType for i32 {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.int32(col)
    }
}

impl FromCol for i32 {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.int32(col)?, col)
    }
}

impl ColType for bool {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.boolean(col)
    }
}

impl FromCol for bool {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.boolean(col)?, col)
    }
}

impl ColType for Vec<u8> {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.bytes(col)
    }
}

impl FromCol for Vec<u8> {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.bytes(col)?, col)
    }
}

impl ColType for Ts {
    fn read<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Option<Self>, sqlx::Error> {
        row.ts(col)
    }
}

impl FromCol for Ts {
    fn from_col<R: SqlRow + ?Sized>(row: &R, col: &str) -> Result<Self, sqlx::Error> {
        required(row.ts(col)?, col)
    }
}

/// One message to insert into a queue.
pub(crate) struct MessageRow<'a> {
    pub message_id: &'a str,
    pub correlation_id: Option<&'a str>,
    pub properties: String,
    pub body: &'a [u8],
    /// When it was scheduled to become visible (truncated to microseconds); `None`: at
    /// once. It is visible from the later of this and the send's now.
    pub scheduled_at: Option<Ts>,
}

/// What [`Driver::insert_messages`] or [`Driver::send_and_complete_alone`] did.
pub(crate) struct SentAndCompleted {
    /// How many messages it inserted (the rest were duplicates).
    pub inserted: usize,
    /// The holds it completed: seq and lock token.
    pub completed: HashMap<i64, String>,
}

/// A message a write sends if it writes the order `order_id`
/// ([`Driver::write_steps_sending`], [`Driver::insert_orders_sending`]).
pub(crate) struct SendFor<'a> {
    pub order_id: &'a str,
    pub queue: &'a orderly_core::transport::QueueName,
    pub row: MessageRow<'a>,
}

/// A delivery a write ends if it writes the order `order_id`.
pub(crate) struct HoldFor<'a> {
    pub order_id: &'a str,
    pub held: &'a ReceivedMessage,
}

/// What a write that sends did: the orders it wrote and the holds it completed (seq
/// and lock token).
pub(crate) struct SentWith {
    pub applied: HashSet<String>,
    pub completed: HashMap<i64, String>,
}

impl SentWith {
    /// The queues of `sends` it sent to (those of the orders it wrote), each once: to
    /// wake once it has committed.
    pub fn woken(&self, sends: &[SendFor<'_>]) -> Vec<orderly_core::transport::QueueName> {
        let mut woken: Vec<orderly_core::transport::QueueName> = Vec::new();
        for s in sends.iter().filter(|s| self.applied.contains(s.order_id)) {
            if !woken.contains(s.queue) {
                woken.push(s.queue.clone());
            }
        }
        woken
    }
}

/// The fenced touch of one step write, decided by the shared code: the step it must be
/// at (-1: any), the step to move to (-1: none), whether a step failed and its error
/// (already cut to the stored length), and whether its order completes with it (its
/// last step's record). What a dialect does with it is one write, the same in both:
/// the order's step becomes the greater of its own and `new_step` (an unguarded late
/// duplicate never moves it back), and a wait (`waiting_on`) ends only when the step
/// moves. `store/conformance.rs` holds both dialects to it.
pub(crate) struct Touch<'a> {
    pub fence: &'a Fence,
    pub expect: i32,
    pub new_step: i32,
    pub failed: bool,
    pub error: Option<String>,
    pub complete: bool,
}

/// A new order to insert, with its Pending state row and Submitted history entry.
pub(crate) struct NewOrderRow<'a> {
    pub order_id: &'a str,
    pub details: String,
    pub reply_to: Option<&'a str>,
    pub workflow: Option<&'a str>,
}

/// One step record to write, with the history entry it makes (`kind`).
pub(crate) struct StepRow<'a> {
    pub fence: &'a Fence,
    pub index: i32,
    pub name: &'a str,
    pub status: &'static str,
    pub idempotency_key: &'a str,
    pub detail: Option<String>,
    pub kind: &'static str,
    pub irreversible: bool,
    /// What the record adds to the step's attempts (a start counts one).
    pub attempts: i32,
}

/// One timed-out order's recovery, decided by the shared code.
pub(crate) struct RecoveryRow {
    pub order_id: String,
    pub epoch: i64,
    pub failure_count: i32,
    pub state: &'static str,
    pub finish_as: Option<&'static str>,
    pub next_attempt_at: Option<Ts>,
    /// Why, already cut to the stored length: the order's last error and its history
    /// entry's reason alike.
    pub reason: String,
    pub kind: &'static str,
}

/// The statements the shared code runs whose text differs by dialect. Each dialect's
/// `statements.rs` defines one of these, so both name the same statements.
#[derive(Debug)]
pub(crate) struct Statements {
    /// A subquery of the texts of list `$1`, one row each (for `x IN (...)`).
    pub texts_of_1: &'static str,
    /// What ends a `SELECT` that locks the rows it reads against writers until the
    /// transaction ends (empty where the transaction holds the one write lock).
    pub for_update: &'static str,
    /// What ends a `SELECT` that keeps the rows it reads from changing until the
    /// transaction ends, letting other readers do the same.
    pub for_share: &'static str,
    /// The start of the minute of the timestamp column `{}` (a timestamp again).
    pub minute_of: &'static str,
    /// An order state row's submit-to-last-change time in milliseconds.
    pub latency_ms: &'static str,
    /// The customer id in the details of the order `order_state.order_id`.
    pub customer_of: &'static str,
    /// The stored details of order `$1` (as text, column `details`).
    pub select_details: &'static str,
    /// Overdue orders for reading, most overdue first: `$1` the dialect's now
    /// parameter, `$2` limit.
    pub find_expired: &'static str,
    /// The timed-out orders of a sweep (`$1` now, `$2` limit), locked where the
    /// dialect can, with what a recovery decision needs.
    pub lock_expired: &'static str,
    /// How a receive locks messages.
    pub q_receive: Receive,
    /// Whether a send and the completions that go with it run as one statement of
    /// their own ([`Driver::send_and_complete_alone`]) when nothing else shares their
    /// transaction.
    pub sends_alone: bool,
    /// Whether a batch of step writes or new orders sends what it causes and ends the
    /// deliveries that asked for it in its own statement
    /// ([`Driver::write_steps_sending`], [`Driver::insert_orders_sending`]).
    pub writes_send: bool,
    /// Leases unsent outbox rows: `$1` relay, `$2` lease end, `$3` now, `$4` limit.
    pub o_lease: &'static str,
    /// Outbox rows `$1` (list) of relay `$2` dead at `$3` for reason `$4`.
    pub o_dead: &'static str,
    /// Outbox rows `$1` (list) of relay `$2` sent at `$3`.
    pub o_sent: &'static str,
    /// Outbox rows `$1` (list) of relay `$2` failed with `$3`, retried after `$4`.
    pub o_failed: &'static str,
    /// How the hot tables are vacuumed, where the database keeps what updates and
    /// deletes left behind until a vacuum (`None`: it reclaims as it goes).
    pub tidy: Option<Tidy>,
}

/// The statements of [`crate::SqlStore`]'s `tidy`.
#[derive(Debug, Clone, Copy)]
pub struct Tidy {
    /// Per table of list `$1` in this schema: `table_name`, `dead` (row versions left
    /// behind, as the database counts them) and `live` (rows in use).
    pub dead_rows: &'static str,
    /// At most one row, `horizon`: the oldest transaction of another session that may
    /// still see rows others deleted or replaced (running, holding a snapshot,
    /// prepared, or held by a replication slot), as text; none when nothing holds
    /// them back. A vacuum removes only what is older; while the text stays the same,
    /// nothing more became removable.
    pub horizon: &'static str,
    /// Each hot table and the statement that vacuums it, skipping it if another
    /// vacuum holds it.
    pub vacuum: &'static [(&'static str, &'static str)],
    /// Run on the connection before the vacuums (lifts the session's statement
    /// timeout: a vacuum of a large table may rightly take longer) and after them.
    pub unbounded: &'static str,
    /// Run after the vacuums, whatever they did: the session's limits again.
    pub bounded: &'static str,
}

/// How a dialect's queue locks messages for a receive. A message is visible when its
/// `visible_at` has come and no lock holds it (`locked_until` NULL or past).
#[derive(Debug, Clone, Copy)]
pub enum Receive {
    /// The whole receive in one statement, alone or first in a transaction, with no
    /// look at the queue's head before it (PostgreSQL: a statement is a transaction of
    /// its own without a round trip more). Of the first `$3` visible messages of queue
    /// `$1` at `$2` (the dialect's now parameter), those delivered `$4` times already
    /// are dead-lettered, the rest locked under token `$5` for `$6` milliseconds. Every
    /// row carries the clock it read (`now`) and how many it dead-lettered
    /// (`dead_lettered`); a take of nothing returns one row of those alone (`seq`
    /// NULL).
    OneStatement {
        /// The receive alone, or first in a transaction that only takes: the lock
        /// moves the messages' `visible_at` to its end, out of the receivers' way.
        alone: &'static str,
        /// The take first in the transaction that acts on what it takes and deletes
        /// what it consumes: the lock leaves `visible_at` alone (the messages'
        /// `locked_until` hides those left held).
        in_tx: &'static str,
    },
    /// A cheap read of the head first, so an idle receiver takes no write lock, then a
    /// take in the writer's turn (SQLite).
    LookThenTake(LookThenTake),
}

/// The statements of [`Receive::LookThenTake`].
#[derive(Debug, Clone, Copy)]
pub struct LookThenTake {
    /// The first visible message of queue `$1` at `$2` (the dialect's now parameter):
    /// `seq`, `delivery_count`.
    pub any_ready: &'static str,
    /// Locks up to `$3` visible messages of queue `$1` at `$2` delivered fewer than `$4`
    /// times under token `$5` until `$6`, in queue order; returns the messages.
    pub take: &'static str,
    /// [`Self::take`] in the transaction that acts on what it takes: the lock leaves
    /// `visible_at` alone, as [`Receive::OneStatement`]'s `in_tx`.
    pub take_in_tx: &'static str,
    /// Up to `$3` visible messages of queue `$1` at `$2`: `seq`, `delivery_count`.
    pub candidates: &'static str,
    /// Locks the messages `$1` (list) under token `$2` until `$3`.
    pub lock: &'static str,
    /// Dead-letters the messages `$1` (list) at `$2`: delivered too often.
    pub dead_letter_exhausted: &'static str,
    /// Deletes the messages `$1` (list).
    pub delete_many: &'static str,
}

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
