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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{ClaimRequest, ClaimedOrder};
use orderly_core::transport::ReceivedMessage;
use orderly_core::{Fence, Result, TimeSource};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Sqlite, SqliteConnection};

use crate::driver::{
    Driver, MessageRow, NewOrderRow, Param, Q, RecoveryRow, SentAndCompleted, StepRow, Touch, q,
};
use crate::error::db;
use crate::migrate;
use crate::statements as st;
use crate::store::SqlStore;
use crate::time::Ts;
use crate::wakeups::Wakeups;

mod group;
mod jsonb;
mod statements;

pub(crate) use group::WriteTx;
use group::Writers;

use statements as sql;

mod batches;

use batches::*;

mod open;
mod watch;

pub use open::*;

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
    /// How the watcher of other processes' commits opens its connection (none in
    /// memory: no other process sees that database).
    watch: Option<sqlx::sqlite::SqliteConnectOptions>,
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

    fn clock_injected(&self) -> bool {
        matches!(self.time, orderly_core::clock::TimeSource::Clock(_))
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
        let inserted = if rows.is_empty() {
            0
        } else {
            insert_fresh(conn, now, queue, dedup_ms, rows).await?
        };
        Ok(SentAndCompleted {
            inserted,
            completed,
        })
    }

    /// Receivers in this process are woken after the commit; other processes' by their
    /// watcher of the file (`watch.rs`).
    async fn notify_sent(_conn: &mut SqliteConnection, _what: &str) -> Result<(), sqlx::Error> {
        Ok(())
    }

    /// Starts, once per file in this process, the task that watches the file for other
    /// processes' commits and wakes this process's receivers (`watch.rs`).
    fn start_listening(&self, wakeups: &Arc<Wakeups>) {
        use std::sync::atomic::Ordering;
        let Some(options) = &self.watch else { return };
        if wakeups.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(watch::watch(
            options.clone(),
            self.time.clone(),
            Arc::downgrade(wakeups),
            watch::Own {
                writers: self.writers.clone(),
                home: self.write_home.clone(),
            },
        ));
    }
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

    /// Built with the counters, every connection of a handle reports its commits and
    /// its rows written by table (SQLite's commit and update hooks), the reader
    /// connections' as the writer's.
    #[tokio::test]
    async fn a_handle_counts_its_commits_and_rows_by_table() {
        let file = std::env::temp_dir().join(format!(
            "orderly-hooks-{}.db",
            uuid::Uuid::new_v4().simple()
        ));
        let url = format!("sqlite://{}", file.display());
        let store = crate::SqliteStore::open(&url, orderly_core::TimeSource::Database)
            .await
            .unwrap();
        let pool = store.pool();
        sqlx::query("CREATE TABLE counted (n INTEGER)")
            .execute(pool)
            .await
            .unwrap();
        let before = store.stats().snapshot();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO counted VALUES (1), (2)")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("UPDATE counted SET n = 3 WHERE n = 2")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        sqlx::query("DELETE FROM counted WHERE n = 1")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("SELECT count(*) FROM counted")
            .execute(pool)
            .await
            .unwrap();
        let counted = store.stats().snapshot().since(&before);
        assert_eq!(counted.commits, 2, "the transaction and the lone delete");
        assert_eq!(
            counted.rows["counted"],
            crate::stats::RowWrites {
                inserted: 2,
                updated: 1,
                deleted: 1
            }
        );
        assert_eq!(counted.rows.len(), 1, "{:?}", counted.rows);
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }

    #[test]
    fn a_list_is_a_json_array() {
        assert_eq!(json_list(vec!["x".to_owned()]), r#"["x"]"#);
        assert_eq!(json_list(vec![1i64, -2]), "[1,-2]");
    }
}
