//! The SQLite state store: the embedded default, one file and nothing else.
//!
//! SQLite has one writer at a time: every write transaction starts with
//! `BEGIN IMMEDIATE`, which takes the write lock up front (waiting up to the busy
//! timeout), so concurrent claimers and recoverers, in this process or another, are
//! serialized and can never claim or count the same row twice. WAL mode lets readers
//! run beside the writer; `synchronous = FULL` makes every commit durable before it is
//! acknowledged, so an accepted order survives a power cut, not only a crash.
//!
//! A SQLite file is shared by processes of one host only, so "now" is that host's
//! clock (or the injected one).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use orderly_core::transport::ReceivedMessage;
use orderly_core::{Fence, Result, TimeSource};
use sqlx::sqlite::{
    SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection};

use crate::driver::{
    Driver, FromCol, List, MessageRow, NewOrderRow, Param, Q, Query, RecoveryRow, SentAndCompleted,
    StepRow, Touch, q,
};
use crate::error::{corrupt, db};
use crate::migrate;
use crate::rows::Cols;
use crate::statements as st;
use crate::store::SqlStore;
use crate::time::Ts;
use crate::wakeups::Wakeups;

mod group;
mod jsonb;
mod statements;

pub(crate) use group::WriteTx;
use group::Writers;
use jsonb::Hex;

use statements as sql;

/// Rows a statement may return before the connection's thread waits for them to be
/// read (above the default batch limits, 256).
const ROW_BUFFER: usize = 1024;

/// How long a writer waits for the write lock before reporting the store busy.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Puts the database file in WAL mode, once. WAL is a property of the file, so pool
/// connections do not set it: switching modes takes a lock that SQLite's busy timeout
/// cannot wait for, and a connection opened mid-run would fail with "database is
/// locked" while another one writes. Here the switch is retried instead.
async fn ensure_wal(options: &SqliteConnectOptions) -> Result<()> {
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect_with(options)
        .await
        .map_err(crate::error::db)?;
    let mut last = String::new();
    for _ in 0..50 {
        match sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
            .fetch_one(&mut conn)
            .await
        {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => {
                conn.close().await.map_err(crate::error::db)?;
                return Ok(());
            }
            Ok(mode) => last = format!("journal mode stayed {mode}"),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(orderly_core::Error::Unavailable(
        format!("cannot put the SQLite file in WAL mode: {last}").into(),
    ))
}

/// The SQLite state store (the SQL queue and the outbox in the same file).
pub type SqliteStore = SqlStore<SqliteDriver>;

/// The SQLite dialect of [`SqlStore`]: its pool, its clock and this process's turn
/// to write to the file.
#[derive(Debug, Clone)]
pub struct SqliteDriver {
    pool: SqlitePool,
    /// The one connection this handle's write transactions take...
    write_pool: SqlitePool,
    /// ...kept here between them (none in memory: that connection is everybody's).
    write_home: Option<group::Home>,
    time: TimeSource,
    writers: Arc<Writers>,
    stats: Arc<crate::stats::Stats>,
}

/// The in-process writers to one database file. Writers in this process wait for
/// their turn in order instead of in SQLite's busy handler, which polls with sleeps of
/// up to 100 ms, and those that queue share a transaction (see `group.rs`); writers in
/// other processes still meet at SQLite's lock (busy timeout).
fn file_writers(file: &str) -> Arc<Writers> {
    static WRITERS: Registry<Writers> = LazyLock::new(Default::default);
    per_file(&WRITERS, file, Writers::default)
}

/// The queue wake-ups of one database file, shared by every handle in this process:
/// a send through one handle wakes receivers waiting on another.
fn file_wakeups(file: &str) -> Arc<Wakeups> {
    static WAKEUPS: Registry<Wakeups> = LazyLock::new(Default::default);
    per_file(&WAKEUPS, file, || Wakeups::new(POLL))
}

/// Other processes' sends are seen by polling this often.
const POLL: Duration = Duration::from_millis(200);

type Registry<T> = LazyLock<std::sync::Mutex<HashMap<String, Weak<T>>>>;

fn per_file<T>(registry: &Registry<T>, file: &str, make: impl FnOnce() -> T) -> Arc<T> {
    let mut entries = registry
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    entries.retain(|_, entry| entry.strong_count() > 0);
    if let Some(entry) = entries.get(file).and_then(Weak::upgrade) {
        return entry;
    }
    let entry = Arc::new(make());
    entries.insert(file.to_owned(), Arc::downgrade(&entry));
    entry
}

/// How writers of this process share a database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriterQueue {
    /// Writers in this process take turns in order before asking SQLite for the write
    /// lock (the default: no busy-handler sleeps between them).
    #[default]
    Process,
    /// Every handle asks SQLite for the lock directly, as separate processes do
    /// (used by tests to exercise SQLite's own locking).
    None,
}

impl SqlStore<SqliteDriver> {
    /// Opens (creating if missing) the database at `url` (`sqlite://file.db`,
    /// `sqlite::memory:`) and applies pending migrations.
    pub async fn open(url: &str, time: TimeSource) -> Result<Self> {
        Self::open_with(url, time, WriterQueue::Process).await
    }

    /// [`SqliteStore::open`] with an explicit [`WriterQueue`].
    pub async fn open_with(url: &str, time: TimeSource, queue: WriterQueue) -> Result<Self> {
        let (url, synchronous) = durability(url)?;
        let options = SqliteConnectOptions::from_str(&url)
            .map_err(|e| crate::url_refused(&url, e))?
            .create_if_missing(true)
            .synchronous(synchronous)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            // Savepoints (group commit) and multi-row statements journal the pages they
            // change so they can be undone; in memory rather than in a temporary file.
            // Only the transaction's own undo data: the log on disk is unchanged.
            .pragma("temp_store", "memory")
            // A batch's rows come back through a channel from the connection's thread;
            // room for a whole batch lets that thread finish the statement without
            // waiting for this task to read them.
            .row_buffer_size(ROW_BUFFER);
        // An in-memory database lives in one connection; a file can serve several readers.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        if !in_memory {
            ensure_wal(&options).await?;
        }
        // No ping before handing out a connection: the database is a local file, and a
        // ping is a round trip to the connection's thread per transaction.
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 4 })
            .test_before_acquire(false)
            .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .map_err(db)?;
        // Writes take a connection of their own, kept between transactions. In WAL mode
        // a connection that begins a transaction after another connection committed
        // drops its whole page cache: writes that took turns on the readers'
        // connections began cold and read again every page they touched. The writer's
        // cache stays valid across its own commits. (In memory there is one connection
        // for everything.)
        let write_pool = if in_memory {
            pool.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
                .connect_with(options.clone())
                .await
                .map_err(db)?
        };
        let file = options.get_filename();
        let key = std::fs::canonicalize(file)
            .unwrap_or_else(|_| file.to_owned())
            .to_string_lossy()
            .into_owned();
        let writers = if in_memory || queue == WriterQueue::None {
            Arc::default()
        } else {
            file_writers(&key)
        };
        let wakeups = if in_memory {
            Arc::new(Wakeups::new(POLL))
        } else {
            file_wakeups(&key)
        };
        let store = SqlStore::new(
            SqliteDriver {
                pool,
                write_pool,
                write_home: (!in_memory).then(group::Home::default),
                time,
                writers,
                stats: Arc::default(),
            },
            wakeups,
        );
        store.migrate().await?;
        Ok(store)
    }

    /// The connection pool (for tests and tools).
    pub fn pool(&self) -> &SqlitePool {
        &self.driver.pool
    }
}

/// Reads and removes the `synchronous` parameter of a SQLite URL: `full` (the
/// default: a commit is on disk before it is acknowledged, so an accepted order
/// survives a power cut) or `normal` (an opt-in: in WAL mode a commit survives a crash
/// of the process but the last commits before a power cut or an OS crash may be lost;
/// the file is never corrupted). Any other value is refused, naming the setting.
fn durability(url: &str) -> Result<(String, SqliteSynchronous)> {
    let invalid = |detail: String| orderly_core::ValidationError::new("database_url", detail);
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), SqliteSynchronous::Full));
    };
    let mut synchronous = SqliteSynchronous::Full;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("synchronous", value)) => {
                synchronous = match value.to_ascii_lowercase().as_str() {
                    "full" => SqliteSynchronous::Full,
                    "normal" => SqliteSynchronous::Normal,
                    other => {
                        return Err(invalid(format!(
                            "synchronous={other}: SQLite durability is `full` (the default) or `normal`"
                        ))
                        .into());
                    }
                }
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, synchronous))
}

/// Parses a SQLite URL as [`SqliteStore::open`] would, without opening anything.
pub(crate) fn check_url(url: &str) -> Result<()> {
    let (url, _) = durability(url)?;
    SqliteConnectOptions::from_str(&url).map_err(|e| crate::url_refused(&url, e))?;
    Ok(())
}

/// Runs a batch statement taking `$1` now and `$2` the batch; the rows it returns.
async fn run_batch(
    conn: &mut SqliteConnection,
    statement: &'static str,
    now: DateTime<Utc>,
    batch: Vec<u8>,
) -> Result<Vec<SqliteRow>> {
    q(statement)
        .bind(Ts(now))
        .bind(batch)
        .fetch_all::<SqliteDriver>(conn)
        .await
        .map_err(db)
}

/// Runs a statement text taking `$1` now, `$2` a batch of rows and `$3` their
/// history entries (two statements in one round trip).
async fn run_with_history(
    conn: &mut SqliteConnection,
    statements: &'static str,
    now: DateTime<Utc>,
    batch: Vec<u8>,
    history: Vec<u8>,
) -> Result<()> {
    q(statements)
        .bind(Ts(now))
        .bind(batch)
        .bind(history)
        .execute::<SqliteDriver>(conn)
        .await
        .map(|_| ())
        .map_err(db)
}

/// The `order_id` of each row.
fn order_ids(rows: &[SqliteRow]) -> Result<HashSet<String>> {
    rows.iter()
        .map(|r| Cols(r).get::<String>("order_id"))
        .collect()
}

impl SqliteDriver {
    /// Claims up to the request's limit in the caller's transaction at `now`, with
    /// the claims' history.
    async fn claim_in(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let deadline = now + chrono::Duration::microseconds(timeout_micros);
        let rows = q(sql::CLAIM)
            .bind(request.owner.as_str())
            .bind(Ts(deadline))
            .bind(Ts(now))
            .bind(i64::from(request.limit))
            .bind(&request.workflows.default_name)
            .bind(st::start_json(&request.workflows)?)
            .bind(st::carry_on(&request.workflows))
            .fetch_all::<Self>(conn)
            .await
            .map_err(db)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let ids = rows
            .iter()
            .map(|r| Cols(r).get::<String>("order_id"))
            .collect::<Result<Vec<_>>>()?;
        let mut details = HashMap::with_capacity(rows.len());
        for r in q(sql::CLAIMED_HISTORY_AND_DETAILS)
            .bind(ids)
            .bind(Ts(now))
            .bind(request.owner.as_str())
            .bind(orderly_core::history::HistoryKind::Claimed.as_str())
            .fetch_all::<Self>(conn)
            .await
            .map_err(db)?
        {
            let c = Cols(&r);
            details.insert(c.get::<String>("order_id")?, c.get::<String>("details")?);
        }
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                let order_id = c.get::<String>("order_id")?;
                let details = details.remove(&order_id).ok_or_else(|| {
                    corrupt(
                        "orders",
                        format!("order {order_id} has a state row but no details"),
                    )
                })?;
                c.claimed_by(&request.owner, &details)
            })
            .collect()
    }

    /// The fenced touches of a batch of step writes; returns the ids touched.
    async fn touch_steps(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        touches: &[Touch<'_>],
    ) -> Result<HashSet<String>> {
        let batch = jsonb::rows(touches, |t, row| {
            row.field(t.fence.order_id.as_str())
                .field(t.fence.owner.as_str())
                .field(t.fence.epoch.0)
                .field(t.expect)
                .field(t.new_step)
                .field(t.failed)
                .field(t.error.as_deref());
        });
        order_ids(&run_batch(conn, sql::TOUCH_STEPS, now, batch).await?)
    }

    /// Step records and their history entries, in order, in one round trip.
    async fn write_step_rows(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        rows: &[StepRow<'_>],
    ) -> Result<()> {
        let steps = jsonb::rows(rows, |r, row| {
            row.field(r.fence.order_id.as_str())
                .field(r.index)
                .field(r.name)
                .field(r.status)
                .field(r.idempotency_key)
                .field(r.detail.as_deref())
                .field(r.fence.epoch.0)
                .field(r.irreversible)
                .field(r.attempts);
        });
        let history = jsonb::rows(rows, |r, row| {
            row.field(r.fence.order_id.as_str())
                .field(r.fence.owner.as_str())
                .field(r.kind)
                .field("Processing")
                .field("Processing")
                .field(r.fence.epoch.0)
                .field(r.index)
                .field(r.detail.as_deref());
        });
        run_with_history(conn, sql::STEP_ROWS, now, steps, history).await
    }
}

/// The rows of a message insert sent at `now`, as its statements take them.
fn message_batch<'r, 'm: 'r>(
    now: Ts,
    rows: impl IntoIterator<Item = &'r MessageRow<'m>>,
) -> Vec<u8> {
    // Most messages are visible at once: their time is the batch's, written once.
    let now_text = now.to_text();
    jsonb::rows(rows, |r, row| {
        let visible_at = match r.scheduled_at {
            Some(at) if at > now => Cow::Owned(at.to_text()),
            _ => Cow::Borrowed(now_text.as_str()),
        };
        row.field(r.message_id)
            .field(r.correlation_id)
            .field(r.properties.as_str())
            .field(Hex(r.body))
            .field(visible_at);
    })
}

/// The ids of `rows` not seen on `queue` within its duplicate window of `ms`
/// milliseconds, recorded as seen until the window ends.
async fn fresh_ids(
    conn: &mut SqliteConnection,
    now: Ts,
    queue: &str,
    ms: i64,
    rows: &[MessageRow<'_>],
) -> Result<HashSet<String>, sqlx::Error> {
    let until = Ts(now.0 + chrono::Duration::milliseconds(ms));
    let ids: Vec<&str> = rows.iter().map(|r| r.message_id).collect();
    q(sql::Q_DEDUP_MANY)
        .bind(queue)
        .bind(until)
        .bind(now)
        .bind(serde_json::to_string(&ids).map_err(|e| sqlx::Error::Encode(e.into()))?)
        .fetch_all::<SqliteDriver>(conn)
        .await?
        .iter()
        .map(|r| sqlx::Row::try_get::<String, _>(r, "message_id"))
        .collect()
}

/// The rows to insert: all of them, or with duplicate detection (`fresh`, the ids not
/// seen before) each fresh id once, as its first row.
fn accepted<'r, 'm>(
    rows: &'r [MessageRow<'m>],
    fresh: Option<&HashSet<String>>,
) -> Vec<&'r MessageRow<'m>> {
    let mut taken = HashSet::new();
    rows.iter()
        .filter(|r| fresh.is_none_or(|f| f.contains(r.message_id) && taken.insert(r.message_id)))
        .collect()
}

/// The holds a completion ended, from the rows it returned: seq and lock token.
fn completions(rows: &[SqliteRow]) -> Result<HashMap<i64, String>, sqlx::Error> {
    rows.iter()
        .map(|r| Ok((i64::from_col(r, "seq")?, String::from_col(r, "lock_token")?)))
        .collect()
}

/// Binds a list as a JSON array.
fn bind_list(query: Query<Sqlite>, list: List) -> Query<Sqlite> {
    match list {
        List::I64s(v) => query.bind(json_list(v)),
        List::Texts(v) => query.bind(json_list(v)),
    }
}

fn json_list<T: serde::Serialize>(values: Vec<T>) -> String {
    serde_json::to_string(&values).expect("a list of numbers or strings writes as JSON")
}

fn prepare(q: Q<'_>) -> Query<Sqlite> {
    crate::driver::prepare(q, bind_list)
}

#[async_trait]
impl Driver for SqliteDriver {
    const NAME: &'static str = "sqlite";
    const SQL: crate::driver::Statements = sql::SQL;
    const MIGRATIONS: &'static [migrate::Migration] = migrate::SQLITE;

    type Conn = SqliteConnection;
    type Tx = WriteTx;
    type Pooled = sqlx::pool::PoolConnection<Sqlite>;
    type Row = SqliteRow;

    async fn begin_write(&self) -> Result<WriteTx> {
        self.writers
            .begin_at(&self.write_pool, self.write_home.as_ref(), &self.stats)
            .await
            .map_err(db)
    }

    async fn commit(tx: WriteTx) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn acquire(&self) -> Result<Self::Pooled> {
        self.pool.acquire().await.map_err(db)
    }

    fn stats(&self) -> &Arc<crate::stats::Stats> {
        &self.stats
    }

    async fn now(&self, _conn: &mut SqliteConnection) -> Result<DateTime<Utc>> {
        Ok(self.time.now_or_host())
    }

    fn now_param(&self) -> Param<'static> {
        Param::Ts(Ts(self.time.now_or_host()))
    }

    /// `BEGIN IMMEDIATE` already excludes every other writer.
    async fn lock_migrations(_conn: &mut SqliteConnection) -> Result<()> {
        Ok(())
    }

    async fn run_script(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sql).execute(conn).await.map(|_| ())
    }

    async fn execute(conn: &mut SqliteConnection, q: Q<'_>) -> Result<u64, sqlx::Error> {
        Ok(prepare(q).execute(conn).await?.rows_affected())
    }

    async fn fetch_all(
        conn: &mut SqliteConnection,
        q: Q<'_>,
    ) -> Result<Vec<SqliteRow>, sqlx::Error> {
        prepare(q).fetch_all(conn).await
    }

    async fn fetch_optional(
        conn: &mut SqliteConnection,
        q: Q<'_>,
    ) -> Result<Option<SqliteRow>, sqlx::Error> {
        prepare(q).fetch_optional(conn).await
    }

    /// The host's clock (or the injected one), then the claim.
    async fn claim_first(
        &self,
        conn: &mut SqliteConnection,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Option<(Vec<ClaimedOrder>, DateTime<Utc>)>> {
        let now = self.now(conn).await?;
        let claimed = Self::claim_in(conn, now, request, timeout_micros).await?;
        Ok((!claimed.is_empty()).then_some((claimed, now)))
    }

    async fn claim(
        &self,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let mut tx = self.begin_write().await?;
        let now = self.now(&mut tx).await?;
        let claimed = Self::claim_in(&mut tx, now, request, timeout_micros).await?;
        if !claimed.is_empty() {
            Self::commit(tx).await.map_err(db)?;
        }
        Ok(claimed)
    }

    async fn complete_in(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        fences: &[&Fence],
    ) -> Result<HashSet<String>> {
        let json = |fences: &mut dyn Iterator<Item = &&Fence>| {
            jsonb::rows(fences, |f, row| {
                row.field(f.order_id.as_str())
                    .field(f.owner.as_str())
                    .field(f.epoch.0);
            })
        };
        let done = order_ids(
            &q(sql::COMPLETE)
                .bind(json(&mut fences.iter()))
                .bind(Ts(now))
                .fetch_all::<Self>(conn)
                .await
                .map_err(db)?,
        )?;
        if !done.is_empty() {
            q(sql::COMPLETED_HISTORY)
                .bind(json(
                    &mut fences.iter().filter(|f| done.contains(f.order_id.as_str())),
                ))
                .bind(Ts(now))
                .bind(orderly_core::history::HistoryKind::Completed.as_str())
                .execute::<Self>(conn)
                .await
                .map_err(db)?;
        }
        Ok(done)
    }

    async fn complete(&self, fences: &[&Fence]) -> Result<HashSet<String>> {
        let mut tx = self.begin_write().await?;
        let now = self.now(&mut tx).await?;
        let done = Self::complete_in(&mut tx, now, fences).await?;
        Self::commit(tx).await.map_err(db)?;
        Ok(done)
    }

    /// The touch, then the rows of the orders it touched: three statements, each a
    /// call into the library.
    async fn write_steps(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        touches: &[Touch<'_>],
        rows: Vec<StepRow<'_>>,
    ) -> Result<HashSet<String>> {
        let touched = Self::touch_steps(conn, now, touches).await?;
        let rows: Vec<StepRow<'_>> = rows
            .into_iter()
            .filter(|r| touched.contains(r.fence.order_id.as_str()))
            .collect();
        if !rows.is_empty() {
            Self::write_step_rows(conn, now, &rows).await?;
        }
        let completing: Vec<&Fence> = touches
            .iter()
            .filter(|t| t.complete && touched.contains(t.fence.order_id.as_str()))
            .map(|t| t.fence)
            .collect();
        if !completing.is_empty() {
            let done = Self::complete_in(conn, now, &completing).await?;
            if let Some(f) = completing
                .iter()
                .find(|f| !done.contains(f.order_id.as_str()))
            {
                // Under the fence and deadline the touch just passed, in this
                // transaction: refuse the whole call rather than leave it half done.
                return Err(orderly_core::Error::Unavailable(
                    format!(
                        "order {} could not be completed with its last step; retry",
                        f.order_id
                    )
                    .into(),
                ));
            }
        }
        Ok(touched)
    }

    async fn insert_orders(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        actor: &str,
        orders: &[NewOrderRow<'_>],
    ) -> Result<HashSet<String>> {
        let batch = jsonb::rows(orders, |o, row| {
            row.field(o.order_id).field(o.details.as_str());
        });
        let inserted = order_ids(&run_batch(conn, sql::INSERT_ORDERS, now, batch).await?)?;
        if inserted.is_empty() {
            return Ok(inserted);
        }
        // The shared code gives each id once.
        let new: Vec<&NewOrderRow<'_>> = orders
            .iter()
            .filter(|o| inserted.contains(o.order_id))
            .collect();
        let states = jsonb::rows(&new, |o, row| {
            row.field(o.order_id).field(o.reply_to).field(o.workflow);
        });
        let history = jsonb::rows(&new, |o, row| {
            row.field(o.order_id)
                .field(actor)
                .field(HistoryKind::Submitted.as_str())
                .field(None::<&str>)
                .field("Pending")
                .field(0)
                .field(None::<i32>)
                .field(None::<&str>);
        });
        run_with_history(conn, sql::INSERT_STATES_AND_HISTORIES, now, states, history).await?;
        Ok(inserted)
    }

    async fn recover(
        conn: &mut SqliteConnection,
        now: DateTime<Utc>,
        actor: &str,
        recoveries: &[RecoveryRow],
    ) -> Result<HashSet<String>> {
        let mut applied = HashSet::with_capacity(recoveries.len());
        for r in recoveries {
            let n = q(sql::RECOVER)
                .bind(r.order_id.as_str())
                .bind(r.failure_count)
                .bind(r.state)
                .bind(r.next_attempt_at)
                .bind(r.reason.as_str())
                .bind(Ts(now))
                .bind(r.epoch)
                .bind(r.finish_as)
                .execute::<Self>(conn)
                .await
                .map_err(db)?;
            if n == 0 {
                // Cannot happen under the write lock; refuse to count what we did not see.
                continue;
            }
            q(st::INSERT_HISTORY)
                .bind(r.order_id.as_str())
                .bind(Ts(now))
                .bind(actor)
                .bind(r.kind)
                .bind(Some("Processing"))
                .bind(r.state)
                .bind(r.epoch)
                .bind(None::<i32>)
                .bind(Some(r.reason.as_str()))
                .execute::<Self>(conn)
                .await
                .map_err(db)?;
            applied.insert(r.order_id.clone());
        }
        Ok(applied)
    }

    /// One statement for the completions, one for the duplicate check and one for the
    /// inserts, whatever the batch's size: each statement is a round trip to the
    /// connection's thread. With no duplicate check between them, the completions and
    /// the inserts go in one round trip.
    async fn insert_messages(
        conn: &mut SqliteConnection,
        now: Ts,
        queue: &str,
        dedup_ms: Option<i64>,
        rows: &[MessageRow<'_>],
        held: &[&ReceivedMessage],
        _notice: &str,
    ) -> Result<SentAndCompleted, sqlx::Error> {
        let holds = |statement| {
            q(statement)
                .bind(held.iter().map(|m| m.sequence_number).collect::<Vec<_>>())
                .bind(
                    held.iter()
                        .map(|m| m.lock_token.0.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(now)
        };
        if dedup_ms.is_none() && !held.is_empty() && !rows.is_empty() {
            let ended = holds(sql::Q_COMPLETE_AND_INSERT)
                .bind(queue)
                .bind(message_batch(now, rows))
                .fetch_all::<Self>(conn)
                .await?;
            return Ok(SentAndCompleted {
                inserted: rows.len(),
                completed: completions(&ended)?,
            });
        }
        let completed = if held.is_empty() {
            HashMap::new()
        } else {
            completions(
                &holds(sql::Q_COMPLETE_MANY)
                    .fetch_all::<Self>(&mut *conn)
                    .await?,
            )?
        };
        if rows.is_empty() {
            return Ok(SentAndCompleted {
                inserted: 0,
                completed,
            });
        }
        let fresh = match dedup_ms {
            Some(ms) => Some(fresh_ids(conn, now, queue, ms, rows).await?),
            None => None,
        };
        let accepted = accepted(rows, fresh.as_ref());
        if accepted.is_empty() {
            return Ok(SentAndCompleted {
                inserted: 0,
                completed,
            });
        }
        q(sql::Q_INSERT_MANY)
            .bind(queue)
            .bind(now)
            .bind(message_batch(now, accepted.iter().copied()))
            .execute::<Self>(conn)
            .await?;
        Ok(SentAndCompleted {
            inserted: accepted.len(),
            completed,
        })
    }

    /// Receivers in this process are woken after the commit; other processes poll.
    async fn notify_sent(_conn: &mut SqliteConnection, _what: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }

    fn start_listening(&self, _wakeups: &Arc<Wakeups>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bundled SQLite is built with the workspace's flags (`.cargo/config.toml`):
    /// memory statistics off, so SQLite's allocations take no process-wide mutex.
    #[tokio::test]
    async fn sqlite_is_built_without_memory_statistics() {
        use sqlx::{Connection, Row};
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        let used: i64 =
            sqlx::query("SELECT sqlite_compileoption_used('SQLITE_DEFAULT_MEMSTATUS=0') AS used")
                .fetch_one(&mut conn)
                .await
                .unwrap()
                .get("used");
        assert_eq!(
            used, 1,
            "built without LIBSQLITE3_FLAGS from .cargo/config.toml"
        );
    }

    #[test]
    fn a_list_is_a_json_array() {
        assert_eq!(json_list(vec!["x".to_owned()]), r#"["x"]"#);
        assert_eq!(json_list(vec![1i64, -2]), "[1,-2]");
    }
}
