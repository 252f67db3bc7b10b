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

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::TimeSource;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};

use crate::migrate;

mod sql {
    pub(super) const INSERT_ORDER: &str = "INSERT INTO orders (order_id, details, created_at) \
        VALUES ($1, $2, $3) ON CONFLICT (order_id) DO NOTHING";

    pub(super) const SELECT_DETAILS: &str = "SELECT details FROM orders WHERE order_id = $1";

    pub(super) const DETAILS_OF: &str =
        "SELECT order_id, details FROM orders WHERE order_id IN (SELECT value FROM json_each($1))";

    pub(super) const CLAIM: &str = "UPDATE order_state SET process_state = 'Processing', \
        locked_by = $1, complete_by = $2, lock_epoch = lock_epoch + 1, updated_at = $3 \
        WHERE order_id IN (SELECT order_id FROM order_state \
            WHERE process_state = 'Pending' AND locked_by IS NULL AND next_attempt_at <= $3 \
            ORDER BY next_attempt_at LIMIT $4) \
        RETURNING order_id, lock_epoch, complete_by, current_step, failure_count, reply_to";

    pub(super) const COMPLETE: &str = "UPDATE order_state SET process_state = 'Processed', \
        locked_by = NULL, complete_by = NULL, updated_at = $4 \
        WHERE order_id = $1 AND locked_by = $2 AND lock_epoch = $3 \
        AND process_state = 'Processing' AND complete_by > $4";

    pub(super) const FIND_EXPIRED: &str = "SELECT order_id, locked_by, lock_epoch, complete_by, \
        failure_count, current_step FROM order_state \
        WHERE process_state = 'Processing' AND complete_by < $1 ORDER BY complete_by LIMIT $2";

    pub(super) const RECOVER: &str = "UPDATE order_state SET failure_count = $2, \
        process_state = $3, locked_by = NULL, complete_by = NULL, \
        next_attempt_at = coalesce($4, next_attempt_at), last_error = $5, updated_at = $6 \
        WHERE order_id = $1 AND process_state = 'Processing' AND lock_epoch = $7 AND complete_by < $6";
}

/// How long a writer waits for the write lock before reporting the store busy.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQLite state store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    time: TimeSource,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://file.db`,
    /// `sqlite::memory:`) and applies pending migrations.
    pub async fn open(url: &str, time: TimeSource) -> orderly_core::Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| orderly_core::ValidationError::new("database_url", e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        // An in-memory database lives in one connection; a file can serve several readers.
        let max = if url.contains(":memory:") || url.contains("mode=memory") {
            1
        } else {
            4
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(max)
            .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(crate::error::db)?;
        let store = Self { pool, time };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies pending migrations; returns the versions applied.
    pub async fn migrate(&self) -> orderly_core::Result<Vec<i64>> {
        use crate::error::db;
        let mut tx = self.begin_write().await?;
        sqlx::query(migrate::CREATE_BOOKKEEPING)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let applied: Vec<(i64, String)> =
            sqlx::query_as("SELECT version, checksum FROM orderly_migrations")
                .fetch_all(&mut *tx)
                .await
                .map_err(db)?;
        let mut done = Vec::new();
        for m in migrate::pending(&applied, migrate::SQLITE)? {
            sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(db)?;
            sqlx::query("INSERT INTO orderly_migrations (version, name, checksum, applied_at) VALUES ($1, $2, $3, $4)")
                .bind(m.version)
                .bind(m.name)
                .bind(m.checksum())
                .bind(crate::time::Ts(self.time.now_or_host()).to_text())
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            tracing::info!(
                version = m.version,
                name = m.name,
                "applied SQLite migration"
            );
            done.push(m.version);
        }
        tx.commit().await.map_err(db)?;
        Ok(done)
    }

    /// The connection pool (for tests and tools).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn begin_write(&self) -> orderly_core::Result<Transaction<'static, Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(crate::error::db)
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

    async fn claim_batch(
        &self,
        request: &ClaimRequest,
        timeout_micros: i64,
    ) -> Result<Vec<ClaimedOrder>> {
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        let deadline = now + chrono::Duration::microseconds(timeout_micros);
        let rows = sqlx::query(sql::CLAIM)
            .bind(request.owner.as_str())
            .bind(Ts(deadline))
            .bind(Ts(now))
            .bind(i64::from(request.limit))
            .fetch_all(&mut *tx)
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
            let epoch: i64 = c.get("lock_epoch")?;
            Self::append(
                &mut tx,
                Event {
                    order_id: &order_id,
                    at: now,
                    actor: request.owner.as_str(),
                    kind: HistoryKind::Claimed,
                    from: Some(ProcessState::Pending),
                    to: ProcessState::Processing,
                    epoch,
                    step: None,
                    reason: None,
                },
            )
            .await?;
            ids.push(order_id.as_str().to_owned());
            claimed.push((
                order_id,
                epoch,
                c.ts("complete_by")?,
                c.get("current_step")?,
                c.get("failure_count")?,
                c.get("reply_to")?,
            ));
        }
        let ids = serde_json::to_string(&ids).map_err(|e| corrupt("claimed ids", e))?;
        let mut details = std::collections::HashMap::with_capacity(claimed.len());
        for r in sqlx::query(sql::DETAILS_OF)
            .bind(ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?
        {
            let c = Cols(&r);
            let d = OrderDetails::from_json(&c.get::<String>("details")?)
                .map_err(|e| corrupt("orders.details", e))?;
            details.insert(c.get::<String>("order_id")?, d);
        }
        tx.commit().await.map_err(db)?;
        claimed
            .into_iter()
            .map(
                |(order_id, epoch, complete_by, current_step, failure_count, reply_to)| {
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
                    })
                },
            )
            .collect()
    }

    async fn complete_batch(&self, fences: &[Fence]) -> Result<BatchOutcome> {
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        let mut outcome = BatchOutcome::default();
        for fence in fences {
            let n = sqlx::query(sql::COMPLETE)
                .bind(fence.order_id.as_str())
                .bind(fence.owner.as_str())
                .bind(fence.epoch.0)
                .bind(Ts(now))
                .execute(&mut *tx)
                .await
                .map_err(db)?
                .rows_affected();
            if n == 0 {
                let why = Self::explain(&mut tx, fence, now, ProcessState::Processed).await;
                outcome.refused.push((fence.order_id.clone(), why));
                continue;
            }
            Self::append(
                &mut tx,
                Event {
                    order_id: &fence.order_id,
                    at: now,
                    actor: fence.owner.as_str(),
                    kind: HistoryKind::Completed,
                    from: Some(ProcessState::Processing),
                    to: ProcessState::Processed,
                    epoch: fence.epoch.0,
                    step: None,
                    reason: None,
                },
            )
            .await?;
            outcome.completed.push(fence.order_id.clone());
        }
        tx.commit().await.map_err(db)?;
        Ok(outcome)
    }

    async fn recover_batch(
        &self,
        actor: &InstanceId,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<Recovered>> {
        let mut tx = self.begin_write().await?;
        let now = self.tx_now(&mut tx).await?;
        let rows = sqlx::query(sql::FIND_EXPIRED)
            .bind(Ts(now))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let mut recovered = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let order_id = c.order_id("order_id")?;
            let failures = c.get::<i32>("failure_count")?.saturating_add(1);
            let epoch: i64 = c.get("lock_epoch")?;
            let reason = format!(
                "deadline passed in step {} while held by {} (failure {failures} of {})",
                c.get::<i32>("current_step")?,
                c.get::<String>("locked_by")?,
                policy.max_failures
            );
            let (state, next, outcome) = if failures >= policy.max_failures {
                (
                    ProcessState::Error,
                    None,
                    Recovered::GaveUp {
                        order_id: order_id.clone(),
                        failure_count: failures,
                    },
                )
            } else {
                let next = now
                    + chrono::Duration::from_std(policy.backoff(failures))
                        .unwrap_or(chrono::Duration::MAX);
                (
                    ProcessState::Pending,
                    Some(next),
                    Recovered::Retried {
                        order_id: order_id.clone(),
                        failure_count: failures,
                        next_attempt_at: next,
                    },
                )
            };
            let n = sqlx::query(sql::RECOVER)
                .bind(order_id.as_str())
                .bind(failures)
                .bind(state.as_str())
                .bind(next.map(Ts))
                .bind(&reason)
                .bind(Ts(now))
                .bind(epoch)
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
                    order_id: &order_id,
                    at: now,
                    actor: actor.as_str(),
                    kind: if state == ProcessState::Error {
                        HistoryKind::GaveUp
                    } else {
                        HistoryKind::Recovered
                    },
                    from: Some(ProcessState::Processing),
                    to: state,
                    epoch,
                    step: None,
                    reason: Some(&reason),
                },
            )
            .await?;
            recovered.push(outcome);
        }
        tx.commit().await.map_err(db)?;
        Ok(recovered)
    }
}

crate::shared::store_ops!(SqliteStore, Sqlite);
