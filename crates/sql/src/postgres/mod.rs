//! The PostgreSQL state store: production and scale.
//!
//! Claims take rows with `FOR UPDATE SKIP LOCKED`, so concurrent schedulers never wait
//! for one another and never get the same row. The hot paths (claim, batched
//! completion, step writes, the supervisor's sweep) are one statement each, one round
//! trip for a whole batch, history included. Deadlines are compared on the server's
//! clock (`now()`, the transaction's start), unless a test injects its own.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use orderly_core::transport::ReceivedMessage;
use orderly_core::{Fence, Result, TimeSource};
use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx_core::transaction::TransactionManager;

use crate::driver::{
    Driver, HoldFor, List, MessageRow, NewOrderRow, Param, Q, Query, RecoveryRow, SendFor,
    SentAndCompleted, SentWith, StepRow, Touch, q,
};
use crate::error::db;
use crate::migrate;
use crate::rows::Cols;
use crate::statements as st;
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
pub use counters::{ServerCounters, TableWrites, server_counters};

use statements as sql;

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

/// An idle connection older than this is pinged before it is handed out.
const PING_IDLE: Duration = Duration::from_secs(1);

/// The fallback poll interval of idle receivers (notifications are the fast path).
const POLL: Duration = Duration::from_secs(1);

/// Takes a connection and runs `begin` (`BEGIN` unless given) on it, to its answer
/// even if the caller stops waiting. sqlx 0.9 arms the rollback of a transaction
/// dropped unfinished only once its `BEGIN` is answered: a begin abandoned before then
/// (a shutdown, a timeout, a `select!` that took another branch) would hand the pool a
/// connection inside a transaction nothing ends, and its next users' statements would
/// run in it, holding their locks and committing nothing. Run on a task of its own,
/// the begin finishes (or its answer times out and the connection is given up); a
/// transaction nobody takes is then dropped there, armed, and its rollback goes with
/// the connection's next statement.
async fn begin_to_the_end(
    pools: Arc<Pools>,
    answer_timeout: Duration,
    begin: Option<&'static str>,
) -> Result<Box<PgConn>> {
    let begun = tokio::spawn(async move {
        let mut conn = Box::new(pools.acquire(answer_timeout).await?);
        let (raw, watch) = conn.parts();
        Transactions::begin(raw, begin.map(sqlx::SqlSafeStr::into_sql_str))
            .within(watch)
            .await?;
        Ok::<_, sqlx::Error>(conn)
    });
    match begun.await {
        Ok(tx) => tx.map_err(db),
        // Its task panicked, or the runtime is shutting down.
        Err(e) => Err(orderly_core::Error::Unavailable(Box::new(e))),
    }
}

/// The connection options of `url`. TLS follows the URL's `sslmode` (`prefer` by
/// default; `require`, `verify-ca`, `verify-full` as libpq), verifying the server
/// against the platform's roots plus `sslrootcert`, or else the CA bundle
/// `ORDERLY_CA_FILE` names. Errors name the setting, never echo the URL.
pub fn options(url: &str) -> Result<PgConnectOptions> {
    let mut options = PgConnectOptions::from_str(url).map_err(|e| crate::url_refused(url, e))?;
    // Every session is bounded, so that a wedged one never hangs a role: unless the URL
    // (`?options=-c%20lock_timeout%3D...`) or PGOPTIONS sets them.
    let given = format!("{url} {}", std::env::var("PGOPTIONS").unwrap_or_default());
    let limits: Vec<(&str, &str)> = SESSION_LIMITS
        .iter()
        .filter(|(name, _)| !given.contains(name))
        .copied()
        .collect();
    if !limits.is_empty() {
        options = options.options(limits);
    }
    let names_root = url.contains("sslrootcert=") || std::env::var_os("PGSSLROOTCERT").is_some();
    if names_root {
        return Ok(options);
    }
    let trust = orderly_tls::Trust::from_env()
        .map_err(|e| orderly_core::ValidationError::new("ORDERLY_CA_FILE", e.to_string()))?;
    Ok(match trust.ca_file() {
        Some(file) => options.ssl_root_cert(file),
        None => options,
    })
}

/// The limits of every session orderly opens, unless the URL or PGOPTIONS sets them: a
/// lock is waited for at most 30 s (a row held by a wedged session fails the statement,
/// which is retried, instead of hanging it), a session idle inside a transaction is
/// ended after 60 s (its locks go with it), and a statement runs at most 5 min (the
/// leader's vacuums lift this for themselves).
pub const SESSION_LIMITS: [(&str, &str); 3] = [
    ("lock_timeout", "30s"),
    ("idle_in_transaction_session_timeout", "60s"),
    ("statement_timeout", "5min"),
];

impl SqlStore<PgDriver> {
    /// Connects to `url` (`postgres://user@host:port/db`) and applies pending migrations.
    pub async fn open(url: &str, time: TimeSource) -> Result<Self> {
        Self::connect(options(url)?, DEFAULT_MAX_CONNECTIONS, time).await
    }

    /// Connects with explicit options (e.g. a `search_path` for an isolated schema) and
    /// applies pending migrations.
    pub async fn connect(
        options: PgConnectOptions,
        max_connections: u32,
        time: TimeSource,
    ) -> Result<Self> {
        let answer_timeout = answer_timeout_from_env()?;
        Self::connect_answering_within(options, max_connections, time, answer_timeout).await
    }

    /// [`Self::connect`], waiting for any answer at most `answer_timeout` (instead of
    /// what [`ANSWER_TIMEOUT_SETTING`] says).
    pub async fn connect_answering_within(
        options: PgConnectOptions,
        max_connections: u32,
        time: TimeSource,
        answer_timeout: Duration,
    ) -> Result<Self> {
        // A connection is checked with a ping only after it sat idle for a while: a
        // ping on every acquire is a round trip per transaction under load. One that
        // broke while busy fails its statement, which the caller retries.
        let builder = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(15))
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    // Bounded like any answer: a connection gone silent while idle
                    // is closed here, not waited on.
                    if meta.idle_for >= PING_IDLE {
                        tokio::time::timeout(answer_timeout, sqlx::Connection::ping(conn))
                            .await
                            .map_err(|_| sqlx::Error::Io(std::io::ErrorKind::TimedOut.into()))??;
                    }
                    Ok(true)
                })
            })
            // The pool checks every connection handed back with a ping of its own,
            // unbounded: one that went silent just then would hold its place for ever.
            // This bounded ping goes first; a connection that does not answer it is
            // closed instead.
            .after_release(move |conn, _| {
                Box::pin(async move {
                    tokio::time::timeout(answer_timeout, sqlx::Connection::ping(conn))
                        .await
                        .map_err(|_| sqlx::Error::Io(std::io::ErrorKind::TimedOut.into()))??;
                    Ok(true)
                })
            });
        let options = options.application_name("orderly");
        let pool = builder
            .clone()
            .connect_with(options.clone())
            .await
            .map_err(db)?;
        let store = SqlStore::new(
            PgDriver {
                pools: Arc::new(Pools::new(pool, builder, options)),
                time,
                stats: Arc::default(),
                answer_timeout,
            },
            Arc::new(Wakeups::new(POLL)),
        );
        store.migrate().await?;
        Ok(store)
    }

    /// The connection pool (for tests and tools).
    pub fn pool(&self) -> &PgPool {
        &self.driver.pools.current().pool
    }
}

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

/// The columns of a claim, as [`ClaimedOrder`]s of `request`'s owner.
fn claimed_orders(rows: &[PgRow], request: &ClaimRequest) -> Result<Vec<ClaimedOrder>> {
    rows.iter()
        .map(|r| {
            let c = Cols(r);
            c.claimed_by(&request.owner, &c.get::<String>("details")?)
        })
        .collect()
}

/// A batch's per-order values as the JSON object its statement looks each row up in
/// (see `statements.rs`): order id to `entry(order)`. Order ids are unique in a batch.
/// Bound as `jsonb`, so a kept (generic) plan reads it once, not once per row.
fn batch_of<T>(
    items: &[T],
    id: impl Fn(&T) -> &str,
    mut entry: impl FnMut(&T) -> serde_json::Value,
) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = items
        .iter()
        .map(|item| (id(item).to_owned(), entry(item)))
        .collect();
    serde_json::Value::Object(map)
}

/// A batch of fences as the COMPLETE statement takes them.
fn complete_query(
    now: Option<Ts>,
    fences: &[&Fence],
) -> sqlx::query::Query<'static, Postgres, <Postgres as sqlx::Database>::Arguments> {
    let ids: Vec<String> = fences
        .iter()
        .map(|f| f.order_id.as_str().to_owned())
        .collect();
    let batch = batch_of(
        fences,
        |f| f.order_id.as_str(),
        |f| serde_json::json!({ "owner": f.owner.as_str(), "epoch": f.epoch.0 }),
    );
    sqlx::query(sql::COMPLETE)
        .bind(now)
        .bind(ids)
        .bind(batch)
        .bind(HistoryKind::Completed.as_str())
}

/// A batch of step writes as [`sql::WRITE_STEPS`] takes it: the order ids and the
/// batch object (per order its touch and, in order, its step records).
fn steps_batch(touches: &[Touch<'_>], rows: &[StepRow<'_>]) -> (Vec<String>, serde_json::Value) {
    let mut steps: HashMap<&str, Vec<serde_json::Value>> = HashMap::new();
    for r in rows {
        steps
            .entry(r.fence.order_id.as_str())
            .or_default()
            .push(serde_json::json!({
                "index": r.index,
                "name": r.name,
                "status": r.status,
                "key": r.idempotency_key,
                "detail": r.detail,
                "kind": r.kind,
                "irreversible": r.irreversible,
                "attempts": r.attempts,
            }));
    }
    let batch = batch_of(
        touches,
        |t| t.fence.order_id.as_str(),
        |t| {
            serde_json::json!({
                "owner": t.fence.owner.as_str(),
                "epoch": t.fence.epoch.0,
                "expect": t.expect,
                "step": t.new_step,
                "failed": t.failed,
                "error": t.error,
                "complete": t.complete,
                "steps": steps.remove(t.fence.order_id.as_str()).unwrap_or_default(),
            })
        },
    );
    let ids = touches
        .iter()
        .map(|t| t.fence.order_id.as_str().to_owned())
        .collect();
    (ids, batch)
}

/// Binds the parameters of [`sql::INSERT_ORDERS`] (and the first of
/// [`sql::INSERT_ORDERS_SENDING`]'s): `now`, the orders as parallel arrays, `actor` and
/// the history kind.
fn bind_orders<'q, O>(
    query: sqlx::query::QueryAs<'q, Postgres, O, <Postgres as sqlx::Database>::Arguments>,
    now: DateTime<Utc>,
    actor: &'q str,
    orders: &'q [NewOrderRow<'q>],
) -> sqlx::query::QueryAs<'q, Postgres, O, <Postgres as sqlx::Database>::Arguments> {
    query
        .bind(Ts(now))
        .bind(orders.iter().map(|o| o.order_id).collect::<Vec<_>>())
        .bind(
            orders
                .iter()
                .map(|o| o.details.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(orders.iter().map(|o| o.reply_to).collect::<Vec<_>>())
        .bind(orders.iter().map(|o| o.workflow).collect::<Vec<_>>())
        .bind(actor)
        .bind(HistoryKind::Submitted.as_str())
}

/// What a write that sends returns ([`sql::WRITE_STEPS_SENDING`],
/// [`sql::INSERT_ORDERS_SENDING`]): an order it wrote, or a hold it completed.
type SentWithRow = (Option<String>, Option<i64>, Option<String>);

type SendingQuery<'q> =
    sqlx::query::QueryAs<'q, Postgres, SentWithRow, <Postgres as sqlx::Database>::Arguments>;

/// Binds, after a write's own parameters, those of its sends and holds ([`SENDS`]
/// in `statements.rs`): the messages' order ids, queues, ids, correlations,
/// properties, bodies and scheduled times, the channel and `origin`, the holds' order
/// ids, seqs and lock tokens.
fn bind_sending<'q>(
    query: SendingQuery<'q>,
    sends: &'q [SendFor<'q>],
    holds: &'q [HoldFor<'q>],
    origin: &'q str,
) -> SendingQuery<'q> {
    query
        .bind(sends.iter().map(|m| m.order_id).collect::<Vec<_>>())
        .bind(sends.iter().map(|m| m.queue.as_str()).collect::<Vec<_>>())
        .bind(sends.iter().map(|m| m.row.message_id).collect::<Vec<_>>())
        .bind(
            sends
                .iter()
                .map(|m| m.row.correlation_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            sends
                .iter()
                .map(|m| m.row.properties.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(sends.iter().map(|m| m.row.body).collect::<Vec<_>>())
        .bind(
            sends
                .iter()
                .map(|m| m.row.scheduled_at.map(|at| at.0))
                .collect::<Vec<_>>(),
        )
        .bind(crate::wakeups::CHANNEL)
        .bind(origin)
        .bind(holds.iter().map(|h| h.order_id).collect::<Vec<_>>())
        .bind(
            holds
                .iter()
                .map(|h| h.held.sequence_number)
                .collect::<Vec<_>>(),
        )
        .bind(
            holds
                .iter()
                .map(|h| h.held.lock_token.0.as_str())
                .collect::<Vec<_>>(),
        )
}

fn sent_with(rows: Vec<SentWithRow>) -> SentWith {
    let mut sent = SentWith {
        applied: HashSet::with_capacity(rows.len()),
        completed: HashMap::new(),
    };
    for (order_id, seq, token) in rows {
        match (order_id, seq.zip(token)) {
            (Some(order_id), _) => {
                sent.applied.insert(order_id);
            }
            (None, Some((seq, token))) => {
                sent.completed.insert(seq, token);
            }
            (None, None) => {}
        }
    }
    sent
}

/// What [`sql::Q_SEND`] returns: how many it inserted, and per completed hold its seq
/// and lock token.
type SentRow = (i64, Option<i64>, Option<String>);

/// [`sql::Q_SEND`] (or, to a queue that detects duplicates within `dedup_ms`,
/// [`sql::Q_SEND_DEDUP`]; with holds to complete, [`sql::Q_SEND_COMPLETING`] or
/// [`sql::Q_SEND_DEDUP_COMPLETING`]): `rows` sent to `queue` at `now` (NULL: the
/// server's), the holds `held` completed.
fn send_query<'q>(
    queue: &'q str,
    now: Option<Ts>,
    dedup_ms: Option<i64>,
    rows: &'q [MessageRow<'q>],
    held: &'q [&'q ReceivedMessage],
    notice: &'q str,
) -> sqlx::query::QueryAs<'q, Postgres, SentRow, <Postgres as sqlx::Database>::Arguments> {
    let statement = match (dedup_ms.is_some(), held.is_empty()) {
        (false, true) => sql::Q_SEND,
        (false, false) => sql::Q_SEND_COMPLETING,
        (true, true) => sql::Q_SEND_DEDUP,
        (true, false) => sql::Q_SEND_DEDUP_COMPLETING,
    };
    let query = sqlx::query_as(statement)
        .bind(queue)
        .bind(rows.iter().map(|r| r.message_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.correlation_id).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.properties.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.body).collect::<Vec<_>>())
        .bind(now)
        .bind(
            rows.iter()
                .map(|r| r.scheduled_at.map(|at| at.0))
                .collect::<Vec<_>>(),
        )
        .bind(dedup_ms)
        .bind(crate::wakeups::CHANNEL)
        .bind(notice);
    if held.is_empty() {
        return query;
    }
    query
        .bind(held.iter().map(|m| m.sequence_number).collect::<Vec<_>>())
        .bind(
            held.iter()
                .map(|m| m.lock_token.0.as_str())
                .collect::<Vec<_>>(),
        )
}

fn sent_and_completed(rows: Vec<SentRow>) -> SentAndCompleted {
    let inserted = rows.first().map_or(0, |(n, _, _)| *n);
    SentAndCompleted {
        inserted: usize::try_from(inserted).unwrap_or_default(),
        completed: rows
            .into_iter()
            .filter_map(|(_, seq, token)| seq.zip(token))
            .collect(),
    }
}

fn order_ids(rows: Vec<PgRow>) -> Result<HashSet<String>> {
    rows.iter()
        .map(|r| Cols(r).get::<String>("order_id"))
        .collect()
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
                w.hearing.store(false, Ordering::Release);
                w.wake_all();
                drop(w);
                tokio::time::sleep(POLL).await;
            }
        });
    }
}

/// The claim statement for `request` at `now` (`None`: the server's clock).
fn claim_query(
    now: Option<Ts>,
    request: &ClaimRequest,
    timeout_micros: i64,
) -> Result<sqlx::query::Query<'static, Postgres, <Postgres as sqlx::Database>::Arguments>> {
    Ok(sqlx::query(sql::CLAIM)
        .bind(now)
        .bind(i64::from(request.limit))
        .bind(request.owner.as_str().to_owned())
        .bind(timeout_micros)
        .bind(request.workflows.default_name.clone())
        .bind(st::start_json(&request.workflows)?)
        .bind(st::carry_on(&request.workflows))
        .bind(HistoryKind::Claimed.as_str()))
}
