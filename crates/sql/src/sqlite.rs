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

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::TimeSource;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, Transaction};

use crate::migrate;

mod sql {
    use crate::rows::{dead_letter_columns, message_columns};

    pub(super) const Q_ANY_READY: &str = "SELECT seq FROM queue_messages \
        WHERE queue = $1 AND visible_at <= $2 ORDER BY visible_at, seq LIMIT 1";

    pub(super) const Q_CANDIDATES: &str = "SELECT seq, delivery_count FROM queue_messages \
        WHERE queue = $1 AND visible_at <= $2 ORDER BY visible_at, seq LIMIT $3";

    /// `$1` JSON array of seqs, `$2` lock token, `$3` locked until.
    pub(super) const Q_LOCK: &str = concat!(
        "UPDATE queue_messages SET delivery_count = delivery_count + 1, lock_token = $2, \
         locked_until = $3, visible_at = $3 WHERE seq IN (SELECT value FROM json_each($1)) RETURNING ",
        message_columns!()
    );

    pub(super) const Q_DEAD_LETTER_EXHAUSTED: &str = concat!(
        "INSERT INTO queue_dead_letters (",
        dead_letter_columns!(),
        ") SELECT seq, queue, message_id, correlation_id, properties, body, enqueued_at, delivery_count, \
         'MaxDeliveryCountExceeded', 'delivered ' || delivery_count || ' times without being completed', $2 \
         FROM queue_messages WHERE seq IN (SELECT value FROM json_each($1))"
    );

    /// `$1` JSON array of `[seq, lock token]` holds, `$3` now (`$2` unused).
    pub(super) const Q_COMPLETE_MANY: &str = "DELETE FROM queue_messages \
        WHERE (seq, lock_token) IN (SELECT value ->> 0, value ->> 1 FROM json_each($1)) \
        AND locked_until > $3 RETURNING seq, lock_token";

    /// `$1` relay, `$2` lease end, `$3` now, `$4` limit.
    pub(super) const O_LEASE: &str = "UPDATE outbox SET relay = $1, leased_until = $2, attempts = attempts + 1 \
        WHERE seq IN (SELECT seq FROM outbox INDEXED BY outbox_unsent WHERE sent_at IS NULL \
            AND dead_at IS NULL AND (leased_until IS NULL OR leased_until <= $3) ORDER BY seq LIMIT $4) \
        RETURNING seq, queue, message_id, correlation_id, properties, body, scheduled_at, attempts";

    /// `$1` seqs, `$2` relay, `$3` now, `$4` the reason.
    pub(super) const O_DEAD: &str = "UPDATE outbox SET dead_at = $3, dead_reason = $4, last_error = $4, \
        leased_until = NULL WHERE seq IN (SELECT value FROM json_each($1)) AND relay = $2";

    /// `$1` seqs, `$2` relay, `$3` now.
    pub(super) const O_SENT: &str = "UPDATE outbox SET sent_at = $3, last_error = NULL \
        WHERE seq IN (SELECT value FROM json_each($1)) AND relay = $2";

    /// `$1` seqs, `$2` relay, `$3` the error, `$4` not before.
    pub(super) const O_FAILED: &str = "UPDATE outbox SET last_error = $3, leased_until = $4 \
        WHERE seq IN (SELECT value FROM json_each($1)) AND relay = $2";

    pub(super) const Q_DELETE_MANY: &str =
        "DELETE FROM queue_messages WHERE seq IN (SELECT value FROM json_each($1))";

    pub(super) const INSERT_ORDER: &str = "INSERT INTO orders (order_id, details, created_at) \
        VALUES ($1, $2, $3) ON CONFLICT (order_id) DO NOTHING";

    pub(super) const SELECT_DETAILS: &str = "SELECT details FROM orders WHERE order_id = $1";

    pub(super) const DETAILS_OF: &str =
        "SELECT order_id, details FROM orders WHERE order_id IN (SELECT value FROM json_each($1))";

    /// `$1` owner, `$2` deadline, `$3` now, `$4` limit, `$5` the default workflow's
    /// name, `$6` JSON object of the workflows it starts (name to version), `$7` JSON
    /// array of the `name@version`s it carries on. A new order is pinned here.
    pub(super) const CLAIM: &str = "UPDATE order_state SET process_state = 'Processing', \
        locked_by = $1, complete_by = $2, lock_epoch = lock_epoch + 1, updated_at = $3, \
        workflow = coalesce(workflow, $5), \
        workflow_version = coalesce(workflow_version, \
            json_extract($6, '$.\"' || coalesce(workflow, $5) || '\"')) \
        WHERE order_id IN (SELECT order_id FROM order_state INDEXED BY order_state_claimable \
            WHERE process_state = 'Pending' AND locked_by IS NULL AND next_attempt_at <= $3 \
            AND CASE WHEN workflow_version IS NULL \
                THEN json_extract($6, '$.\"' || coalesce(workflow, $5) || '\"') IS NOT NULL \
                ELSE workflow || '@' || workflow_version IN (SELECT value FROM json_each($7)) END \
            ORDER BY next_attempt_at LIMIT $4) \
        RETURNING order_id, lock_epoch, complete_by, current_step, failure_count, reply_to, \
        finish_as, generation, last_error, workflow, workflow_version";

    /// History for a claimed batch: `$1` JSON array of order ids, `$2` now, `$3` owner.
    pub(super) const CLAIMED_HISTORY: &str = "INSERT INTO order_history \
        (order_id, at, actor, kind, from_state, to_state, epoch) \
        SELECT order_id, $2, $3, 'Claimed', 'Pending', 'Processing', lock_epoch FROM order_state \
        WHERE order_id IN (SELECT value FROM json_each($1))";

    /// `$1` JSON array of `[order_id, owner, epoch]` fences, `$2` now. The `+` keeps
    /// the planner off the process_state index: the batch drives, each fence one
    /// primary-key probe, however many orders are Processing.
    pub(super) const COMPLETE: &str = "UPDATE order_state SET process_state = 'Processed', \
        locked_by = NULL, complete_by = NULL, updated_at = $2 \
        FROM (SELECT value ->> 0 AS order_id, value ->> 1 AS owner, value ->> 2 AS epoch \
              FROM json_each($1)) AS f \
        WHERE order_state.order_id = f.order_id AND order_state.locked_by = f.owner \
        AND order_state.lock_epoch = f.epoch \
        AND +order_state.process_state = 'Processing' AND order_state.complete_by > $2 \
        RETURNING order_state.order_id";

    /// History for a completed batch: `$1` JSON array of fences, `$2` now.
    pub(super) const COMPLETED_HISTORY: &str = "INSERT INTO order_history \
        (order_id, at, actor, kind, from_state, to_state, epoch) \
        SELECT value ->> 0, $2, value ->> 1, 'Completed', 'Processing', 'Processed', value ->> 2 \
        FROM json_each($1)";

    pub(super) const FIND_EXPIRED: &str = "SELECT order_id, locked_by, lock_epoch, complete_by, \
        failure_count, current_step, finish_as, \
        EXISTS (SELECT 1 FROM order_steps t WHERE t.order_id = s.order_id \
            AND t.status IN ('Started', 'Succeeded')) AS has_effects \
        FROM order_state s INDEXED BY order_state_deadlines \
        WHERE process_state = 'Processing' AND complete_by < $1 ORDER BY complete_by LIMIT $2";

    pub(super) const RECOVER: &str = "UPDATE order_state SET failure_count = $2, \
        process_state = $3, locked_by = NULL, complete_by = NULL, \
        next_attempt_at = coalesce($4, next_attempt_at), last_error = $5, updated_at = $6, \
        finish_as = $8 \
        WHERE order_id = $1 AND process_state = 'Processing' AND lock_epoch = $7 AND complete_by < $6";
}

/// How long a writer waits for the write lock before reporting the store busy.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Puts the database file in WAL mode, once. WAL is a property of the file, so pool
/// connections do not set it: switching modes takes a lock that SQLite's busy timeout
/// cannot wait for, and a connection opened mid-run would fail with "database is
/// locked" while another one writes. Here the switch is retried instead.
async fn ensure_wal(options: &SqliteConnectOptions) -> orderly_core::Result<()> {
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

/// The SQLite state store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    time: TimeSource,
    writer: Arc<tokio::sync::Mutex<()>>,
    wakeups: Arc<crate::queue::Wakeups>,
    delivery: crate::Delivery,
}

/// The turn of in-process writers to one database file. Writers in this process wait
/// here in order instead of in SQLite's busy handler, which polls with sleeps of up to
/// 100 ms; writers in other processes still meet at SQLite's lock (busy timeout).
fn writer_turn(file: &str) -> Arc<tokio::sync::Mutex<()>> {
    static TURNS: Registry<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);
    per_file(&TURNS, file, || tokio::sync::Mutex::new(()))
}

/// The queue wake-ups of one database file, shared by every handle in this process:
/// a send through one handle wakes receivers waiting on another.
fn file_wakeups(file: &str) -> Arc<crate::queue::Wakeups> {
    static WAKEUPS: Registry<crate::queue::Wakeups> = LazyLock::new(Default::default);
    per_file(&WAKEUPS, file, || crate::queue::Wakeups::new(POLL))
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

/// A write transaction holding this process's turn to write.
pub(crate) struct WriteTx {
    tx: Transaction<'static, Sqlite>,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl WriteTx {
    async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl Deref for WriteTx {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
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

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://file.db`,
    /// `sqlite::memory:`) and applies pending migrations.
    pub async fn open(url: &str, time: TimeSource) -> orderly_core::Result<Self> {
        Self::open_with(url, time, WriterQueue::Process).await
    }

    /// [`SqliteStore::open`] with an explicit [`WriterQueue`].
    pub async fn open_with(
        url: &str,
        time: TimeSource,
        queue: WriterQueue,
    ) -> orderly_core::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| orderly_core::ValidationError::new("database_url", e.to_string()))?
            .create_if_missing(true)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        // An in-memory database lives in one connection; a file can serve several readers.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        if !in_memory {
            ensure_wal(&options).await?;
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 4 })
            .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .map_err(crate::error::db)?;
        let file = options.get_filename();
        let key = std::fs::canonicalize(file)
            .unwrap_or_else(|_| file.to_owned())
            .to_string_lossy()
            .into_owned();
        let writer = if in_memory || queue == WriterQueue::None {
            Arc::new(tokio::sync::Mutex::new(()))
        } else {
            writer_turn(&key)
        };
        let wakeups = if in_memory {
            Arc::new(crate::queue::Wakeups::new(POLL))
        } else {
            file_wakeups(&key)
        };
        let store = Self {
            pool,
            time,
            writer,
            wakeups,
            delivery: crate::Delivery::Queue,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Sends the messages state changes cause to `delivery` from now on.
    pub fn with_delivery(mut self, delivery: crate::Delivery) -> Self {
        self.delivery = delivery;
        self
    }

    /// The connection pool (for tests and tools).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn begin_write(&self) -> orderly_core::Result<WriteTx> {
        let turn = self.writer.clone().lock_owned().await;
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(crate::error::db)?;
        Ok(WriteTx { tx, _turn: turn })
    }

    const MIGRATIONS: &'static [migrate::Migration] = migrate::SQLITE;

    /// `BEGIN IMMEDIATE` already excludes every other writer.
    async fn lock_migrations(
        &self,
        _conn: &mut sqlx::SqliteConnection,
    ) -> orderly_core::Result<()> {
        Ok(())
    }

    async fn tx_now(
        &self,
        _conn: &mut sqlx::SqliteConnection,
    ) -> orderly_core::Result<DateTime<Utc>> {
        Ok(self.time.now_or_host())
    }

    fn now_param(&self) -> crate::time::Ts {
        crate::time::Ts(self.time.now_or_host())
    }

    fn seqs_param(seqs: &[i64]) -> String {
        serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into())
    }

    /// Receivers in this process are woken after the commit; other processes poll.
    async fn notify_sent(
        &self,
        _conn: &mut sqlx::SqliteConnection,
        _queue: &orderly_core::transport::QueueName,
    ) -> Result<(), orderly_core::transport::TransportError> {
        Ok(())
    }

    fn start_listening(&self) {}

    /// The holds of `messages` as one JSON array of `[seq, token]` pairs.
    fn holds_params(messages: &[orderly_core::transport::ReceivedMessage]) -> (String, String) {
        let pairs: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::json!([m.sequence_number, m.lock_token.0]))
            .collect();
        (serde_json::Value::Array(pairs).to_string(), String::new())
    }

    /// Inserts `rows` into `queue` unless (with `dedup_until`) their id was seen within
    /// the window; returns how many were inserted. Row by row: SQLite statements are
    /// in-process calls, the commit is what costs.
    async fn insert_batch(
        &self,
        conn: &mut sqlx::SqliteConnection,
        now: Ts,
        queue: &orderly_core::transport::QueueName,
        dedup_until: Option<Ts>,
        rows: &[crate::queue::Row<'_>],
    ) -> Result<usize, sqlx::Error> {
        let mut accepted = 0;
        for row in rows {
            if let Some(until) = dedup_until {
                let fresh: Option<String> = sqlx::query_scalar(crate::queue::Q_DEDUP)
                    .bind(queue.as_str())
                    .bind(row.message_id)
                    .bind(until)
                    .bind(now)
                    .fetch_optional(&mut *conn)
                    .await?;
                if fresh.is_none() {
                    continue;
                }
            }
            sqlx::query(crate::queue::Q_INSERT)
                .bind(queue.as_str())
                .bind(row.message_id)
                .bind(row.correlation_id)
                .bind(&row.properties)
                .bind(row.body)
                .bind(now)
                .bind(row.visible_at)
                .execute(&mut *conn)
                .await?;
            accepted += 1;
        }
        Ok(accepted)
    }

    async fn claim_batch(
        &self,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        let claimed = Self::claim_in(&mut tx, request, timeout_micros, now).await?;
        if !claimed.is_empty() {
            tx.commit().await.map_err(db)?;
        }
        Ok(claimed)
    }

    /// Claims inside `tx` (with the claims' history); the caller commits.
    async fn claim_in(
        tx: &mut WriteTx,
        request: &ClaimRequest,
        timeout_micros: i64,
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimedOrder>> {
        let deadline = now + chrono::Duration::microseconds(timeout_micros);
        let rows = sqlx::query(sql::CLAIM)
            .bind(request.owner.as_str())
            .bind(Ts(deadline))
            .bind(Ts(now))
            .bind(i64::from(request.limit))
            .bind(&request.workflows.default_name)
            .bind(crate::statements::start_json(&request.workflows)?)
            .bind(crate::statements::carry_on_json(&request.workflows)?)
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut claimed = Vec::with_capacity(rows.len());
        let mut ids = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let order_id = c.order_id("order_id")?;
            ids.push(order_id.as_str().to_owned());
            claimed.push((
                order_id,
                c.get::<i64>("lock_epoch")?,
                c.ts("complete_by")?,
                c.get("current_step")?,
                c.get("failure_count")?,
                c.get("reply_to")?,
                c.opt_state("finish_as")?,
                (
                    c.get("generation")?,
                    c.get("last_error")?,
                    c.workflow_ref()?,
                ),
            ));
        }
        let ids = serde_json::to_string(&ids).map_err(|e| corrupt("claimed ids", e))?;
        sqlx::query(sql::CLAIMED_HISTORY)
            .bind(&ids)
            .bind(Ts(now))
            .bind(request.owner.as_str())
            .execute(&mut **tx)
            .await
            .map_err(db)?;
        let mut details = std::collections::HashMap::with_capacity(claimed.len());
        for r in sqlx::query(sql::DETAILS_OF)
            .bind(ids)
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?
        {
            let c = Cols(&r);
            let d = OrderDetails::from_json(&c.get::<String>("details")?)
                .map_err(|e| corrupt("orders.details", e))?;
            details.insert(c.get::<String>("order_id")?, d);
        }
        claimed
            .into_iter()
            .map(
                |(
                    order_id,
                    epoch,
                    complete_by,
                    current_step,
                    failure_count,
                    reply_to,
                    finish_as,
                    (generation, last_error, workflow),
                )| {
                    let details = details.remove(order_id.as_str()).ok_or_else(|| {
                        corrupt(
                            "orders",
                            format!("order {order_id} has a state row but no details"),
                        )
                    })?;
                    Ok(ClaimedOrder {
                        fence: Fence {
                            order_id,
                            owner: request.owner.clone(),
                            epoch: orderly_core::Epoch(epoch),
                        },
                        complete_by,
                        current_step,
                        failure_count,
                        details,
                        reply_to,
                        finish_as,
                        generation,
                        last_error,
                        workflow,
                    })
                },
            )
            .collect()
    }

    async fn complete_batch(&self, completions: &[Completion]) -> Result<BatchOutcome> {
        let fences: Vec<&Fence> = completions.iter().map(|c| &c.fence).collect();
        let json = |fences: &[&Fence]| {
            let triples: Vec<_> = fences
                .iter()
                .map(|f| serde_json::json!([f.order_id.as_str(), f.owner.as_str(), f.epoch.0]))
                .collect();
            serde_json::Value::Array(triples).to_string()
        };
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        let done: Vec<String> = sqlx::query_scalar(sql::COMPLETE)
            .bind(json(&fences))
            .bind(Ts(now))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let done: std::collections::HashSet<String> = done.into_iter().collect();
        let (completed, refused): (Vec<&Fence>, Vec<&Fence>) = fences
            .iter()
            .partition(|f| done.contains(f.order_id.as_str()));
        if !completed.is_empty() {
            sqlx::query(sql::COMPLETED_HISTORY)
                .bind(json(&completed))
                .bind(Ts(now))
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        let mut outcome = BatchOutcome {
            completed: completed.iter().map(|f| f.order_id.clone()).collect(),
            refused: Vec::with_capacity(refused.len()),
        };
        for fence in refused {
            let why = Self::explain(&mut tx, fence, now, ProcessState::Processed).await;
            outcome.refused.push((fence.order_id.clone(), why));
        }
        // Only completed orders' messages are sent.
        let sends: Vec<Envelope> = completions
            .iter()
            .filter(|c| done.contains(c.fence.order_id.as_str()))
            .flat_map(|c| c.sends.iter().cloned())
            .collect();
        self.commit_with(tx, now, &sends).await?;
        Ok(outcome)
    }

    async fn recover_batch(
        &self,
        leader: &orderly_core::leader::LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<Recovered>> {
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        Self::check_leader(&mut tx, leader, now).await?;
        let actor = &leader.holder;
        let rows = sqlx::query(sql::FIND_EXPIRED)
            .bind(Ts(now))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let mut recovered = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let expired = c.expired()?;
            let epoch: i64 = c.get("lock_epoch")?;
            let d = policy.decide(&expired, now);
            let n = sqlx::query(sql::RECOVER)
                .bind(expired.order_id.as_str())
                .bind(d.failure_count)
                .bind(d.to.as_str())
                .bind(d.next_attempt_at.map(Ts))
                .bind(&d.reason)
                .bind(Ts(now))
                .bind(epoch)
                .bind(d.finish_as.map(|s| s.as_str()))
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
            if n == 0 {
                // Cannot happen under the write lock; refuse to count what we did not see.
                continue;
            }
            Self::append(
                &mut tx,
                Event {
                    order_id: &expired.order_id,
                    at: now,
                    actor: actor.as_str(),
                    kind: d.kind,
                    from: Some(ProcessState::Processing),
                    to: d.to,
                    epoch,
                    step: None,
                    reason: Some(&d.reason),
                },
            )
            .await?;
            recovered.push(d.outcome);
        }
        tx.commit().await.map_err(db)?;
        Ok(recovered)
    }
}

/// The write transaction of this dialect, for the shared operations.
type WriteTxn = WriteTx;

impl SqliteStore {
    /// Completes the orders of `fences` inside `tx` (with their history); returns the
    /// ids it completed.
    async fn complete_in(
        tx: &mut WriteTx,
        fences: &[&Fence],
        now: DateTime<Utc>,
    ) -> Result<std::collections::HashSet<String>> {
        let triples: Vec<_> = fences
            .iter()
            .map(|f| serde_json::json!([f.order_id.as_str(), f.owner.as_str(), f.epoch.0]))
            .collect();
        let json = serde_json::Value::Array(triples).to_string();
        let done: Vec<String> = sqlx::query_scalar(sql::COMPLETE)
            .bind(&json)
            .bind(Ts(now))
            .fetch_all(&mut **tx)
            .await
            .map_err(db)?;
        let done: std::collections::HashSet<String> = done.into_iter().collect();
        let completed: Vec<_> = fences
            .iter()
            .filter(|f| done.contains(f.order_id.as_str()))
            .map(|f| serde_json::json!([f.order_id.as_str(), f.owner.as_str(), f.epoch.0]))
            .collect();
        if !completed.is_empty() {
            sqlx::query(sql::COMPLETED_HISTORY)
                .bind(serde_json::Value::Array(completed).to_string())
                .bind(Ts(now))
                .execute(&mut **tx)
                .await
                .map_err(db)?;
        }
        Ok(done)
    }

    /// The writes of a `record_steps` batch, one after the other (statements cost no
    /// round trip here): `Some(refusal)` for each refused write.
    async fn apply_step_writes(
        &self,
        tx: &mut WriteTx,
        writes: &[orderly_core::store::StepWrite],
        now: DateTime<Utc>,
    ) -> Result<Vec<Option<orderly_core::Error>>> {
        let mut refusals = Vec::with_capacity(writes.len());
        for w in writes {
            refusals.push(Self::apply_step_write(tx, w, now).await?);
        }
        Ok(refusals)
    }
}

crate::shared::store_ops!(SqliteStore, Sqlite);
crate::queue::queue_ops!(SqliteStore, Sqlite);
crate::outbox::outbox_ops!(SqliteStore, Sqlite);
