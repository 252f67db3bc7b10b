//! What the PostgreSQL server wrote, for benchmarks (the `counters` feature): read on a
//! connection of its own, before and after a run.

use orderly_core::Result;
use sqlx::PgConnection;

use crate::error::db;

use super::options;

/// What the server has done in the current database so far, as its cumulative
/// statistics count it: transactions committed (every client's, reads included), the
/// write-ahead log written and rows written by table. The server publishes each
/// backend's counts when it goes idle, at most once a second and at the latest after
/// ten; read them after that long to see all of a run. The log's position
/// ([`ServerCounters::wal_position`]) is exact at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// `pg_stat_database.xact_commit` of the current database.
    pub commits: i64,
    /// Bytes of write-ahead log written so far (`pg_current_wal_lsn()`), the whole
    /// server's: every database on it.
    pub wal_position: i64,
    /// Write-ahead log records and full-page images (`pg_stat_wal`), the whole
    /// server's; `None` where the view cannot be read.
    pub wal_records: Option<(i64, i64)>,
    /// Rows written, table by table (`pg_stat_user_tables` of the current database).
    pub tables: Vec<TableWrites>,
}

/// Rows one table had written: inserted, updated (of which in place, without new index
/// entries: PostgreSQL's heap-only updates) and deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableWrites {
    /// The table, schema-qualified.
    pub table: String,
    /// Rows inserted.
    pub inserted: i64,
    /// Rows updated.
    pub updated: i64,
    /// Updates made in place (heap-only: no index changed).
    pub in_place: i64,
    /// Rows deleted.
    pub deleted: i64,
}

impl TableWrites {
    /// Rows written in all.
    pub fn total(&self) -> i64 {
        self.inserted + self.updated + self.deleted
    }
}

impl ServerCounters {
    /// What was done between `before` and these counters: the tables with any row
    /// written, most written first.
    #[must_use]
    pub fn since(&self, before: &Self) -> Self {
        let mut tables: Vec<TableWrites> = self
            .tables
            .iter()
            .map(|t| {
                let then = before.tables.iter().find(|b| b.table == t.table);
                let was = |f: fn(&TableWrites) -> i64| then.map_or(0, f);
                TableWrites {
                    table: t.table.clone(),
                    inserted: t.inserted - was(|b| b.inserted),
                    updated: t.updated - was(|b| b.updated),
                    in_place: t.in_place - was(|b| b.in_place),
                    deleted: t.deleted - was(|b| b.deleted),
                }
            })
            .filter(|t| t.total() > 0)
            .collect();
        tables.sort_by(|a, b| {
            b.total()
                .cmp(&a.total())
                .then_with(|| a.table.cmp(&b.table))
        });
        Self {
            commits: self.commits - before.commits,
            wal_position: self.wal_position - before.wal_position,
            wal_records: self
                .wal_records
                .zip(before.wal_records)
                .map(|((r, f), (r0, f0))| (r - r0, f - f0)),
            tables,
        }
    }
}

/// Reads [`ServerCounters`] of the database at `url`, on a connection of its own
/// (whose statements are not logged: a count of the roles' statements from the log
/// leaves them out).
pub async fn server_counters(url: &str) -> Result<ServerCounters> {
    use sqlx::{ConnectOptions as _, Connection, Row};
    let options = options(url)?.disable_statement_logging();
    let mut conn = PgConnection::connect_with(&options).await.map_err(db)?;
    let row = sqlx::query(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) \
            AS commits, \
            pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal_position",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(db)?;
    let commits: i64 = row.try_get("commits").map_err(db)?;
    let wal_position: i64 = row.try_get("wal_position").map_err(db)?;
    // A view a server may not have or let this role read: the rest stands without it.
    let wal_records =
        sqlx::query_as::<_, (i64, i64)>("SELECT wal_records, wal_fpi FROM pg_stat_wal")
            .fetch_one(&mut conn)
            .await
            .ok();
    let tables = sqlx::query_as::<_, (String, i64, i64, i64, i64)>(
        "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
         FROM pg_stat_user_tables",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(db)?
    .into_iter()
    .map(
        |(table, inserted, updated, in_place, deleted)| TableWrites {
            table,
            inserted,
            updated,
            in_place,
            deleted,
        },
    )
    .collect();
    let _ = conn.close().await;
    Ok(ServerCounters {
        commits,
        wal_position,
        wal_records,
        tables,
    })
}

/// Waits, up to `limit`, until no other client is connected to the database at `url`:
/// a backend publishes its counts when it ends, so once the roles' connections are
/// closed and their backends gone, [`server_counters`] reads everything they did at
/// once. Whether it came to that.
pub async fn wait_quiet(url: &str, limit: std::time::Duration) -> Result<bool> {
    use sqlx::{ConnectOptions as _, Connection};
    let options = options(url)?.disable_statement_logging();
    let mut conn = PgConnection::connect_with(&options).await.map_err(db)?;
    let started = std::time::Instant::now();
    let quiet = loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(db)?;
        if others == 0 {
            break true;
        }
        if started.elapsed() >= limit {
            break false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let _ = conn.close().await;
    Ok(quiet)
}

/// The write-ahead log that work in one database wrote between two positions of the
/// log: the records that touch its relations and those of the transactions that wrote
/// them (their commits), read from the log itself (`pg_walinspect`). Unlike
/// [`ServerCounters::wal_position`] and `pg_stat_wal`, it leaves out what the rest of the
/// server wrote meanwhile: other databases, and the server's own periodic records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatabaseLog {
    /// Records written.
    pub records: i64,
    /// Their bytes, full-page images included.
    pub bytes: i64,
    /// Full-page images among them (pages written whole, the first change to a page
    /// after a checkpoint).
    pub full_page_images: i64,
}

/// Readies the database at `url` for counting what its work writes: the log's reader
/// (the `pg_walinspect` extension, created here if the role may; [`database_log`] needs
/// it) and automatic vacuuming turned off on every table of its own, so that no
/// vacuum the server starts by the clock falls into a measured phase (the caller
/// vacuums between phases: [`vacuum`]). Whether the log can be read.
/// [`end_counting`] undoes both.
pub async fn begin_counting(url: &str) -> Result<bool> {
    use sqlx::{Connection, Executor};
    let mut conn = counting_connection(url).await?;
    let readable = conn
        .execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .await
        .is_ok();
    alter_every_table(
        &mut conn,
        "SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)",
    )
    .await?;
    let _ = conn.close().await;
    Ok(readable)
}

/// Undoes [`begin_counting`]: automatic vacuuming back on every table of the database.
/// (The log's reader stays: another count may be reading it.)
pub async fn end_counting(url: &str) -> Result<()> {
    use sqlx::Connection;
    let mut conn = counting_connection(url).await?;
    alter_every_table(
        &mut conn,
        "RESET (autovacuum_enabled, toast.autovacuum_enabled)",
    )
    .await?;
    let _ = conn.close().await;
    Ok(())
}

/// Vacuums every table of the database at `url` (what automatic vacuuming would do
/// sooner or later), and returns the log's position before and after.
pub async fn vacuum(url: &str) -> Result<(i64, i64)> {
    use sqlx::{Connection, Executor};
    let mut conn = counting_connection(url).await?;
    let before = log_position(&mut conn).await?;
    conn.execute("VACUUM").await.map_err(db)?;
    let after = log_position(&mut conn).await?;
    let _ = conn.close().await;
    Ok((before, after))
}

/// What the database at `url` wrote to the log between the positions `from` and `to`
/// (as [`ServerCounters::wal_position`] gives them); `None` where the log cannot be
/// read (no `pg_walinspect`, or a role without the right to read it).
pub async fn database_log(url: &str, from: i64, to: i64) -> Result<Option<DatabaseLog>> {
    use sqlx::{Connection, Row};
    let mut conn = counting_connection(url).await?;
    // The log can be read up to where it is flushed; the writer flushes the rest within
    // a fraction of a second.
    for _ in 0..50 {
        let flushed: bool =
            sqlx::query_scalar("SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn")
                .bind(lsn(to))
                .fetch_one(&mut conn)
                .await
                .map_err(db)?;
        if flushed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A record names the relations it changes as tablespace/database/relation; the
    // commit of a transaction names none, so it is known by its transaction.
    let row = sqlx::query(
        "WITH log AS ( \
             SELECT xid::text AS xid, record_length, fpi_length, \
                    strpos(coalesce(block_ref, ''), \
                           '/' || (SELECT oid FROM pg_database WHERE datname = current_database()) \
                           || '/') > 0 AS here \
             FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)), \
         writers AS (SELECT DISTINCT xid FROM log WHERE here AND xid <> '0') \
         SELECT count(*) AS records, \
                coalesce(sum(record_length), 0)::bigint AS bytes, \
                count(*) FILTER (WHERE fpi_length > 0) AS images \
         FROM log WHERE here OR xid IN (SELECT xid FROM writers)",
    )
    .bind(lsn(from))
    .bind(lsn(to))
    .fetch_one(&mut conn)
    .await;
    let _ = conn.close().await;
    match row {
        Ok(row) => Ok(Some(DatabaseLog {
            records: row.try_get("records").map_err(db)?,
            bytes: row.try_get("bytes").map_err(db)?,
            full_page_images: row.try_get("images").map_err(db)?,
        })),
        Err(sqlx::Error::Database(e))
            if matches!(e.code().as_deref(), Some("42883" | "42501" | "3F000")) =>
        {
            // No such function (the extension is not there) or no right to read the log.
            Ok(None)
        }
        Err(e) => Err(db(e)),
    }
}

/// A log position as PostgreSQL writes one (`pg_lsn`).
fn lsn(position: i64) -> String {
    let position = position as u64;
    format!("{:X}/{:X}", position >> 32, position & 0xFFFF_FFFF)
}

async fn counting_connection(url: &str) -> Result<PgConnection> {
    use sqlx::{ConnectOptions as _, Connection};
    let options = options(url)?.disable_statement_logging();
    PgConnection::connect_with(&options).await.map_err(db)
}

async fn log_position(conn: &mut PgConnection) -> Result<i64> {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        .fetch_one(conn)
        .await
        .map_err(db)
}

/// `ALTER TABLE t {change}` for every table of the database's own.
async fn alter_every_table(conn: &mut PgConnection, change: &str) -> Result<()> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db)?;
    for table in tables {
        sqlx::query(sqlx::AssertSqlSafe(format!("ALTER TABLE {table} {change}")))
            .execute(&mut *conn)
            .await
            .map_err(db)?;
    }
    Ok(())
}
