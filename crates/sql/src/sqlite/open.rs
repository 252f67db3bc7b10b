//! Opening a SQLite store: the URL and its durability, WAL mode set once per file,
//! and the per-file writers and wake-ups that handles in one process share.

use super::SqliteDriver;
use super::group::{self, Writers};
use crate::error::db;
use crate::stats::Stats;
use crate::store::SqlStore;
use crate::wakeups::Wakeups;
use orderly_core::{Result, TimeSource};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

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

/// What no commit announces (a lock that ran out, a scheduled time reached) is found
/// by polling this often; so are other processes' sends while the file's watcher is
/// not running.
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
        Self::open_options(&url, connect_options(&url, synchronous)?, time, queue).await
    }

    /// [`SqliteStore::open`] with none of its statements logged (`sqlx::query` events),
    /// so that a count of statements from the log leaves this handle's out.
    pub async fn open_unlogged(url: &str, time: TimeSource) -> Result<Self> {
        use sqlx::ConnectOptions as _;
        let (url, synchronous) = durability(url)?;
        let options = connect_options(&url, synchronous)?.disable_statement_logging();
        Self::open_options(&url, options, time, WriterQueue::Process).await
    }

    async fn open_options(
        url: &str,
        options: SqliteConnectOptions,
        time: TimeSource,
        queue: WriterQueue,
    ) -> Result<Self> {
        // An in-memory database lives in one connection; a file can serve several readers.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        if !in_memory {
            ensure_wal(&options).await?;
        }
        let stats = Arc::<Stats>::default();
        let pool = pool_of(&options, if in_memory { 1 } else { 4 }, &stats).await?;
        // Writes take a connection of their own, kept between transactions. In WAL mode
        // a connection that begins a transaction after another connection committed
        // drops its whole page cache: writes that took turns on the readers'
        // connections began cold and read again every page they touched. The writer's
        // cache stays valid across its own commits. (In memory there is one connection
        // for everything.)
        let write_pool = if in_memory {
            pool.clone()
        } else {
            pool_of(&options, 1, &stats).await?
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
                stats,
                watch: (!in_memory).then(|| options.clone()),
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

/// How every connection to the file at `url` is opened.
fn connect_options(url: &str, synchronous: SqliteSynchronous) -> Result<SqliteConnectOptions> {
    Ok(SqliteConnectOptions::from_str(url)
        .map_err(|e| crate::url_refused(url, e))?
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
        .row_buffer_size(ROW_BUFFER))
}

/// A pool of up to `connections` to the file. No ping before handing out a
/// connection: the database is a local file, and a ping is a round trip to the
/// connection's thread per transaction. Built with the counters, each connection
/// reports its commits and rows written to `stats`.
async fn pool_of(
    options: &SqliteConnectOptions,
    connections: u32,
    stats: &Arc<Stats>,
) -> Result<SqlitePool> {
    let pool = SqlitePoolOptions::new()
        .max_connections(connections)
        .test_before_acquire(false)
        .acquire_timeout(BUSY_TIMEOUT + Duration::from_secs(5));
    #[cfg(any(test, feature = "counters"))]
    let pool = {
        let stats = stats.clone();
        pool.after_connect(move |conn, _| {
            let stats = stats.clone();
            Box::pin(async move {
                count_writes(conn, stats).await;
                Ok(())
            })
        })
    };
    #[cfg(not(any(test, feature = "counters")))]
    let _ = stats;
    pool.connect_with(options.clone()).await.map_err(db)
}

/// Has SQLite tell `stats` of every commit and every row written on `conn`.
#[cfg(any(test, feature = "counters"))]
async fn count_writes(conn: &mut sqlx::SqliteConnection, stats: Arc<Stats>) {
    use crate::stats::RowWrite;
    use sqlx::sqlite::SqliteOperation;
    let Ok(mut handle) = conn.lock_handle().await else {
        return; // the connection's thread is gone: its first statement will say so
    };
    let commits = stats.clone();
    handle.set_commit_hook(move || {
        commits.commit();
        true // commit, as asked
    });
    handle.set_update_hook(move |row| {
        let write = match row.operation {
            SqliteOperation::Insert => RowWrite::Insert,
            SqliteOperation::Update => RowWrite::Update,
            SqliteOperation::Delete => RowWrite::Delete,
            SqliteOperation::Unknown(_) => return,
        };
        stats.row(row.table, write);
    });
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
