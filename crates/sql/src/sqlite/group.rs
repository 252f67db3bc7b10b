//! Group commit for SQLite's one writer.
//!
//! Every write transaction of this process takes its turn at the file in order (a fair
//! mutex). A transaction that finishes while other writers wait for the turn does not
//! commit: it releases its savepoint and hands the still-open SQLite transaction to the
//! next writer, which works behind a savepoint of its own, and so on; the last writer
//! of the group (or, if writers stop coming, a flusher queued behind them) commits once
//! for all of them. Each writer's `commit` returns only when that one commit is on disk,
//! with its outcome: nobody hears "committed" before the group is, and a group that fails
//! fails every writer in it (their work was never visible to anyone else).
//!
//! A writer that rolls back undoes only its savepoint; the group's earlier work goes on.
//! If SQLite lost the whole transaction (an I/O error, a full disk), releasing or
//! rolling back to the savepoint fails, or the commit finds no transaction, and the
//! group fails as a whole. A lone writer commits at once.
//!
//! Every statement is a round trip to the connection's thread, and each costs a
//! wake-up on both sides (tens of microseconds on a loaded machine, inside the turn).
//! So the savepoints ride with the statements around them: a group begins with
//! `BEGIN IMMEDIATE; SAVEPOINT` in one round trip, a writer that hands the group on
//! releases its savepoint and opens the next writer's in one, and the last writer's
//! `COMMIT` releases its savepoint with the transaction. A group of n writers takes
//! n + 1 round trips of its own, where a savepoint per writer through sqlx's
//! transaction manager took 2n + 2.
//!
//! The point is the fixed cost of a transaction on the one writer: beginning, and
//! committing with its fsync, take about half of a small transaction's time there.
//! Under load the writers queue anyway; grouped, they pay that cost once per group.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqliteTransactionManager as Tm;
use sqlx::{SqlSafeStr, Sqlite, SqlitePool};
use sqlx_core::transaction::TransactionManager;
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

use crate::stats::Stats;

/// Writers in one group at most; the next one starts a new transaction.
const MAX_GROUP: usize = 64;

// The writer at work is behind the one savepoint of its group's transaction,
// `orderly_write` (not one of sqlx's own names, `_sqlx_savepoint_N`).

/// Begins a group's transaction with the first writer's savepoint, in one round trip.
const BEGIN_GROUP: &str = "BEGIN IMMEDIATE; SAVEPOINT orderly_write";
/// Keeps the writer's work and opens the next writer's savepoint, in one round trip.
/// Releasing fails if SQLite lost the transaction (no such savepoint).
const RELEASE_AND_NEXT: &str = "RELEASE orderly_write; SAVEPOINT orderly_write";
/// Undoes the writer's work; the savepoint stays open for the next writer.
const ROLL_BACK_WRITER: &str = "ROLLBACK TO orderly_write";

/// A group takes in writers for this long after it began. Grouping saves a begin and a
/// commit (about half a millisecond with its fsync) per writer and costs the earlier
/// writers of a group the wait for the later ones. Under a moderate load writes are
/// small and a group of several fits; under a burst each write carries a large batch
/// and a group of one or two. Measured with `orderly bench` at 600 orders/s: paced p99
/// 195 -> 130 ms with this window, 131 ms with no limit; the burst lost 4% with it and
/// 10% with no limit (stages idle waiting for long groups).
const GROUP_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

/// This process's writers to one database file: their turn, the transaction a group
/// shares while it passes from one writer to the next, and how many wait.
#[derive(Debug)]
pub(crate) struct Writers {
    turn: Arc<Mutex<Option<Group>>>,
    waiting: AtomicUsize,
    window: std::time::Duration,
    /// What these writers tell the file's watcher (`watch.rs`) about other connections'
    /// commits.
    pub(crate) others: Arc<Others>,
}

/// This process's commits to the file, counted for its watcher (`watch.rs`): the
/// watcher's `PRAGMA data_version` moves with every commit, this process's included,
/// and only a change while this process committed nothing is surely another's.
#[derive(Debug, Default)]
pub(crate) struct Others {
    /// Commits this process began (counted before each is asked for).
    begun: AtomicU64,
    /// Commits this process finished, made or failed (counted after each).
    done: AtomicU64,
    /// Reads of the file the watcher finished with, what they found acted on.
    pub(crate) reads: AtomicU64,
}

impl Others {
    /// Commits begun so far: read after a look at the file, every commit it saw is
    /// counted.
    pub(crate) fn begun(&self) -> u64 {
        self.begun.load(Ordering::Acquire)
    }

    /// Commits finished so far: read before a look at the file, none counted is
    /// missing from it. A later [`Self::begun`] equal to this means no commit of this
    /// process came in between.
    pub(crate) fn done(&self) -> u64 {
        self.done.load(Ordering::Acquire)
    }
}

impl Default for Writers {
    fn default() -> Self {
        Writers::with_window(GROUP_WINDOW)
    }
}

/// How a group's commit ended, for the writers waiting on it.
type Outcome = Option<Result<(), Arc<str>>>;

/// Where a handle keeps its write connection between groups: the next group begins on
/// it at once, with its page cache still valid, instead of waiting for the pool to take
/// the connection back (a task of its own) and acquiring it again.
pub(crate) type Home = Arc<std::sync::Mutex<Option<Kept>>>;

/// A write connection kept at home, with its `PRAGMA data_version` as last read (it
/// moves only when another connection commits).
#[derive(Debug)]
pub(crate) struct Kept {
    conn: PoolConnection<Sqlite>,
    version: Option<i64>,
}

/// One SQLite transaction shared by a group of writers.
struct Group {
    /// Always present; taken only on the way out (home, or closed).
    conn: Option<PoolConnection<Sqlite>>,
    /// The connection's `PRAGMA data_version` as last read, if it was.
    version: Option<i64>,
    /// Where the connection goes once the group ended with no transaction left open,
    /// if anywhere.
    home: Option<Home>,
    /// When the transaction began.
    began: Instant,
    outcome: watch::Sender<Outcome>,
    /// Writers that joined (committed, rolled back or still at work).
    joined: usize,
    /// Writers whose work is in it (their savepoint released).
    kept: usize,
    /// A flusher is queued for the turn.
    flushing: bool,
    /// Where the group's commit is counted.
    stats: Arc<Stats>,
    /// Where its commit is counted for the file's watcher.
    others: Arc<Others>,
    /// Set once the group committed or failed; a group dropped before that closes its
    /// connection, which rolls the transaction back.
    ended: bool,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("joined", &self.joined)
            .field("kept", &self.kept)
            .finish_non_exhaustive()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if !self.ended {
            // Dropped mid-way (a cancelled commit, a panic): never return a connection
            // with an open transaction to the pool. The waiting writers see the sender
            // go and report the write as failed.
            conn.close_on_drop();
            return;
        }
        // Ended with no transaction open (committed, or rolled back whole): kept at
        // home if the group has one, otherwise back to the pool.
        if let Some(home) = &self.home
            && Tm::get_transaction_depth(&conn) == 0
        {
            *home.lock().unwrap_or_else(|p| p.into_inner()) = Some(Kept {
                conn,
                version: self.version,
            });
        }
    }
}

impl Group {
    /// Begins a transaction on the connection kept at `home`, or on one of `pool`.
    async fn open(
        pool: &SqlitePool,
        home: Option<&Home>,
        stats: &Arc<Stats>,
        others: &Arc<Others>,
    ) -> Result<Self, sqlx::Error> {
        let kept = home.and_then(|h| h.lock().unwrap_or_else(|p| p.into_inner()).take());
        let (mut conn, version) = match kept {
            Some(Kept { conn, version }) => (conn, version),
            None => (pool.acquire().await?, None),
        };
        stats.transaction();
        // sqlx counts this as a transaction of depth one; the savepoint is ours.
        stats.control();
        if let Err(e) = Tm::begin(&mut conn, Some(BEGIN_GROUP.into_sql_str())).await {
            // The savepoint may have failed after the transaction began: never keep a
            // connection whose state is not known.
            conn.close_on_drop();
            return Err(e);
        }
        let (outcome, _) = watch::channel(None);
        Ok(Group {
            conn: Some(conn),
            version,
            home: home.cloned(),
            began: Instant::now(),
            outcome,
            joined: 0,
            kept: 0,
            flushing: false,
            stats: stats.clone(),
            others: others.clone(),
            ended: false,
        })
    }

    /// Whether the next writer waiting should join rather than the group commit now.
    fn takes_more(&self, writers: &Writers) -> bool {
        writers.waiting() > 0 && self.joined < MAX_GROUP && self.began.elapsed() < writers.window
    }

    /// Leaves the transaction in the turn for the next writer, with a flusher queued
    /// behind the writers waiting now (one per group) in case none of them commits it.
    fn hand_on(mut self, mut turn: OwnedMutexGuard<Option<Group>>, writers: &Writers) {
        let flusher = !std::mem::replace(&mut self.flushing, true);
        *turn = Some(self);
        drop(turn);
        if flusher {
            tokio::spawn(flush(writers.turn.clone()));
        }
    }

    /// A writer joins: it works behind the savepoint the group left open for it (every
    /// way a group is opened or handed on leaves one open), at no round trip.
    fn join(&mut self) {
        self.joined += 1;
    }

    /// Runs one of this module's statements on the group's connection.
    async fn run(&mut self, statement: &'static str) -> Result<(), sqlx::Error> {
        use sqlx::Executor;
        self.stats.control();
        self.conn().execute(statement).await.map(|_| ())
    }

    /// The group's connection.
    fn conn(&mut self) -> &mut PoolConnection<Sqlite> {
        self.conn
            .as_mut()
            .expect("a group holds its connection until it ends")
    }

    /// Commits the group's transaction (which releases a savepoint left open) and
    /// tells every writer in it.
    async fn commit(mut self) -> Result<(), sqlx::Error> {
        let started = Instant::now();
        self.stats.control();
        let result = if self.kept == 0 {
            Tm::rollback(self.conn()).await
        } else {
            self.others.begun.fetch_add(1, Ordering::AcqRel);
            let result = Tm::commit(self.conn()).await;
            self.others.done.fetch_add(1, Ordering::AcqRel);
            result
        };
        self.stats.committed(started.elapsed());
        match result {
            Ok(()) => {
                self.ended = true;
                self.outcome.send_replace(Some(Ok(())));
                Ok(())
            }
            Err(e) => {
                self.fail(&e).await;
                Err(e)
            }
        }
    }

    /// Rolls the whole transaction back and fails every writer in it.
    async fn fail(mut self, cause: &sqlx::Error) {
        self.ended = true;
        self.stats.control();
        // Rolled back or not, the connection is not kept: the error may have come from
        // the connection itself (SQLite rolls back on its own after an I/O error or a
        // full disk, and a rollback of no transaction may then pass or fail depending
        // on the driver's version), and a new one costs one open.
        let _ = Tm::rollback(self.conn()).await;
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
        let message: Arc<str> = cause.to_string().into();
        self.outcome.send_replace(Some(Err(message)));
    }
}

/// A write transaction: this writer's savepoint in its group's transaction, holding the
/// turn. Dropped without [`WriteTx::commit`], it rolls back its own work only.
pub(crate) struct WriteTx {
    open: Option<Open>,
}

struct Open {
    group: Group,
    turn: OwnedMutexGuard<Option<Group>>,
    writers: Arc<Writers>,
    held: Held,
}

/// Counts how long a writer held the turn (dropped with the turn).
struct Held {
    since: Instant,
    stats: Arc<Stats>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stats.held(self.since.elapsed());
    }
}

/// Counts a writer waiting for the turn, also when its wait is cancelled.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Writers {
    /// Waits for the turn and begins a write: joins the group in progress, if any.
    #[cfg(test)]
    pub(crate) async fn begin(
        self: &Arc<Self>,
        pool: &SqlitePool,
        stats: &Arc<Stats>,
    ) -> Result<WriteTx, sqlx::Error> {
        self.begin_at(pool, None, stats).await
    }

    /// [`Writers::begin`]; a group this write opens begins on the connection kept at
    /// `home` if there is one, and leaves its connection there when it ends with no
    /// transaction left open.
    pub(crate) async fn begin_at(
        self: &Arc<Self>,
        pool: &SqlitePool,
        home: Option<&Home>,
        stats: &Arc<Stats>,
    ) -> Result<WriteTx, sqlx::Error> {
        let mut turn = {
            self.waiting.fetch_add(1, Ordering::AcqRel);
            let _waiting = Waiting(&self.waiting);
            self.turn.clone().lock_owned().await
        };
        let since = Instant::now();
        stats.write();
        let mut group = match turn.take() {
            Some(group) => group,
            None => Group::open(pool, home, stats, &self.others).await?,
        };
        group.join();
        stats.begun(since.elapsed());
        Ok(WriteTx {
            open: Some(Open {
                group,
                turn,
                writers: self.clone(),
                held: Held {
                    since,
                    stats: stats.clone(),
                },
            }),
        })
    }

    /// Writers whose groups take in writers for `window` after they begin.
    pub(crate) fn with_window(window: std::time::Duration) -> Self {
        Writers {
            turn: Arc::default(),
            waiting: AtomicUsize::new(0),
            window,
            others: Arc::default(),
        }
    }

    /// Whether a connection other than this process's writer committed to the file
    /// since the writer's connection was last asked: its `PRAGMA data_version` moves
    /// only with other connections' commits. Read in the turn, on the connection of the
    /// group left open in it or on the one kept at `home`; `None` when neither is there
    /// (it went back to the pool) or the read failed.
    pub(crate) async fn others_committed(&self, home: Option<&Home>) -> Option<bool> {
        let mut turn = self.turn.lock().await;
        if let Some(group) = turn.as_mut() {
            let now = data_version(group.conn()).await;
            let moved = now.is_none() || now != group.version;
            group.version = now;
            return now.map(|_| moved);
        }
        // No writer at work and no group open: the connection is at home, if kept.
        let home = home?;
        let mut kept = home.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        let now = data_version(&mut kept.conn).await;
        let moved = now.is_none() || now != kept.version;
        kept.version = now;
        *home.lock().unwrap_or_else(|p| p.into_inner()) = Some(kept);
        drop(turn);
        now.map(|_| moved)
    }

    /// Writers waiting for the turn now.
    fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

impl WriteTx {
    /// Keeps this writer's work and returns once it is committed, with the group.
    pub(crate) async fn commit(mut self) -> Result<(), sqlx::Error> {
        let Some(Open {
            mut group,
            turn,
            writers,
            held,
        }) = self.open.take()
        else {
            return Ok(());
        };
        group.kept += 1;
        group.stats = held.stats.clone();
        if group.takes_more(&writers) {
            let started = Instant::now();
            // Releasing the savepoint also proves the transaction is still open.
            if let Err(e) = group.run(RELEASE_AND_NEXT).await {
                group.fail(&e).await;
                return Err(e);
            }
            held.stats.committed(started.elapsed());
            // Hand the transaction on and wait for the group's commit.
            let mut outcome = group.outcome.subscribe();
            drop(held);
            group.hand_on(turn, &writers);
            return match outcome.wait_for(Option::is_some).await {
                Ok(done) => match done.as_ref() {
                    Some(Err(cause)) => Err(group_failed(cause)),
                    _ => Ok(()),
                },
                Err(_) => Err(group_failed("the transaction was abandoned")),
            };
        }
        let result = group.commit().await;
        drop(turn);
        drop(held);
        result
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            // The turn goes with the task: the next writer starts after the rollback.
            Ok(runtime) => drop(runtime.spawn(open.roll_back())),
            // No runtime to roll back on: the group ends with its connection closed
            // (SQLite rolls back) and its writers told it failed.
            Err(_) => drop(open),
        }
    }
}

impl Open {
    /// Undoes this writer's work; the group goes on without it.
    async fn roll_back(self) {
        let Open {
            mut group,
            turn,
            writers,
            held,
        } = self;
        // Rolling back to the savepoint fails if SQLite already rolled the whole
        // transaction back: then the group fails.
        if let Err(e) = group.run(ROLL_BACK_WRITER).await {
            group.fail(&e).await;
            return;
        }
        if group.kept > 0 && group.takes_more(&writers) {
            drop(held);
            group.hand_on(turn, &writers);
            return;
        }
        // Rolled back with nothing kept, or committed for the writers before it.
        let _ = group.commit().await;
        drop(turn);
        drop(held);
    }
}

impl std::ops::Deref for WriteTx {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &Self::Target {
        self.open
            .as_ref()
            .expect("a write transaction in use")
            .group
            .conn
            .as_ref()
            .expect("a group holds its connection until it ends")
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.open
            .as_mut()
            .expect("a write transaction in use")
            .group
            .conn()
    }
}

/// Commits the group left open in the turn, if any, once the writers queued before
/// this flusher have had theirs.
async fn flush(turn: Arc<Mutex<Option<Group>>>) {
    let mut slot = turn.lock_owned().await;
    if let Some(group) = slot.take() {
        let since = Instant::now();
        let stats = group.stats.clone();
        // The outcome reaches the writers through the group; nobody else to tell.
        let _ = group.commit().await;
        stats.held(since.elapsed());
    }
}

/// The connection's `PRAGMA data_version`, if it answers.
async fn data_version(conn: &mut sqlx::SqliteConnection) -> Option<i64> {
    sqlx::query_scalar::<_, i64>("PRAGMA data_version")
        .fetch_one(conn)
        .await
        .ok()
}

fn group_failed(cause: &str) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(format!(
        "the write's group commit failed: {cause}"
    )))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::Executor;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    use super::*;

    /// Removes a test's database file and its log.
    struct Removed(std::path::PathBuf);

    impl Drop for Removed {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = self.0.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// A new database file with table `t`, and a second pool on it that sees only what
    /// was committed.
    async fn file() -> (SqlitePool, SqlitePool, Removed) {
        let path = std::env::temp_dir().join(format!("orderly-group-{}.db", uuid::Uuid::new_v4()));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.clone())
            .await
            .unwrap();
        pool.execute("CREATE TABLE t (v TEXT PRIMARY KEY)")
            .await
            .unwrap();
        let reader = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        (pool, reader, Removed(path))
    }

    fn writers(window: Duration) -> (Arc<Writers>, Arc<Stats>) {
        (Arc::new(Writers::with_window(window)), Arc::default())
    }

    async fn rows(reader: &SqlitePool) -> Vec<String> {
        sqlx::query_scalar("SELECT v FROM t ORDER BY v")
            .fetch_all(reader)
            .await
            .unwrap()
    }

    async fn insert(tx: &mut WriteTx, v: &str) {
        sqlx::query("INSERT INTO t (v) VALUES ($1)")
            .bind(v)
            .execute(&mut **tx)
            .await
            .unwrap();
    }

    /// Starts a writer that waits for the turn, and returns once it waits.
    async fn queue_writer(
        writers: &Arc<Writers>,
        pool: &SqlitePool,
        stats: &Arc<Stats>,
        behind: usize,
    ) -> tokio::task::JoinHandle<WriteTx> {
        let (w, p, s) = (writers.clone(), pool.clone(), stats.clone());
        let handle = tokio::spawn(async move { w.begin(&p, &s).await.unwrap() });
        while writers.waiting() < behind {
            tokio::task::yield_now().await;
        }
        handle
    }

    /// Writer a inserted "a" and committed (its commit still waiting, spawned), writer
    /// b holds the turn after inserting "b", writer c waits behind it.
    async fn a_committed_b_at_work_c_waiting(
        writers: &Arc<Writers>,
        pool: &SqlitePool,
        stats: &Arc<Stats>,
    ) -> (
        tokio::task::JoinHandle<Result<(), sqlx::Error>>,
        WriteTx,
        tokio::task::JoinHandle<WriteTx>,
    ) {
        let mut a = writers.begin(pool, stats).await.unwrap();
        let b = queue_writer(writers, pool, stats, 1).await;
        let c = queue_writer(writers, pool, stats, 2).await;
        insert(&mut a, "a").await;
        let a = tokio::spawn(a.commit());
        let mut b = b.await.unwrap();
        insert(&mut b, "b").await;
        (a, b, c)
    }

    #[tokio::test]
    async fn writers_that_queue_share_one_commit_and_hear_of_it_only_once_it_is_made() {
        let (pool, reader, _file) = file().await;
        let (writers, stats) = writers(Duration::from_secs(600));
        let (a, b, c) = a_committed_b_at_work_c_waiting(&writers, &pool, &stats).await;
        // a's commit task runs until it waits (this runtime has one thread).
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            !a.is_finished(),
            "a's commit returned before its group committed"
        );
        assert!(
            rows(&reader).await.is_empty(),
            "a group's work is seen before its commit"
        );
        let b = tokio::spawn(b.commit());

        let mut c = c.await.unwrap();
        insert(&mut c, "c").await;
        c.commit().await.unwrap();
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        assert_eq!(rows(&reader).await, ["a", "b", "c"]);
        let counted = stats.snapshot();
        assert_eq!((counted.writes, counted.transactions), (3, 1));
        // `BEGIN IMMEDIATE; SAVEPOINT`, a's and b's `RELEASE; SAVEPOINT`, c's `COMMIT`:
        // n + 1 round trips for n writers, not a savepoint and a release each.
        assert_eq!(counted.control_round_trips, 4);
    }

    #[tokio::test]
    async fn a_writer_that_rolls_back_undoes_only_its_own_work() {
        let (pool, reader, _file) = file().await;
        let (writers, stats) = writers(Duration::from_secs(600));
        let (a, b, c) = a_committed_b_at_work_c_waiting(&writers, &pool, &stats).await;
        drop(b);
        let mut c = c.await.unwrap();
        insert(&mut c, "c").await;
        c.commit().await.unwrap();
        a.await.unwrap().unwrap();
        assert_eq!(rows(&reader).await, ["a", "c"]);
        assert_eq!(stats.snapshot().transactions, 1);
        // The turn and the connections are free again.
        let mut d = writers.begin(&pool, &stats).await.unwrap();
        insert(&mut d, "d").await;
        d.commit().await.unwrap();
        assert_eq!(rows(&reader).await, ["a", "c", "d"]);
    }

    #[tokio::test]
    async fn a_transaction_sqlite_lost_fails_every_writer_in_it_and_the_next_group_starts_afresh() {
        let (pool, reader, _file) = file().await;
        let (writers, stats) = writers(Duration::from_secs(600));
        let (a, mut b, c) = a_committed_b_at_work_c_waiting(&writers, &pool, &stats).await;
        // As SQLite does on an I/O error or a full disk: the whole transaction is gone.
        (&mut *b).execute("ROLLBACK").await.unwrap();
        let failed = b.commit().await.expect_err("b's work was lost");
        assert!(failed.to_string().contains("savepoint"), "{failed}");
        let failed = a
            .await
            .unwrap()
            .expect_err("a's work was lost with the group");
        assert!(
            failed.to_string().contains("group commit failed"),
            "{failed}"
        );
        let mut c = c.await.unwrap();
        insert(&mut c, "c").await;
        c.commit().await.unwrap();
        assert_eq!(rows(&reader).await, ["c"]);
    }

    #[tokio::test]
    async fn a_lone_writer_commits_at_once_and_a_rolled_back_one_leaves_nothing_open() {
        let (pool, reader, _file) = file().await;
        let (writers, stats) = writers(Duration::from_secs(600));
        let mut a = writers.begin(&pool, &stats).await.unwrap();
        insert(&mut a, "a").await;
        drop(a);
        let mut b = writers.begin(&pool, &stats).await.unwrap();
        insert(&mut b, "b").await;
        b.commit().await.unwrap();
        assert_eq!(rows(&reader).await, ["b"]);
        // Another connection can write: no transaction was left open on the pool's.
        let mut other = reader.acquire().await.unwrap();
        other.execute("BEGIN IMMEDIATE").await.unwrap();
        other
            .execute("INSERT INTO t (v) VALUES ('z')")
            .await
            .unwrap();
        other.execute("COMMIT").await.unwrap();
        let counted = stats.snapshot();
        assert_eq!(counted.transactions, 2);
        // a: the begin, `ROLLBACK TO`, `ROLLBACK`; b: the begin and `COMMIT`.
        assert_eq!(counted.control_round_trips, 5);
    }

    #[tokio::test]
    async fn a_group_past_its_window_commits_instead_of_taking_more() {
        let (pool, reader, _file) = file().await;
        // A window already over when a group begins: no writer is ever handed on to.
        let (writers, stats) = writers(Duration::ZERO);
        let mut a = writers.begin(&pool, &stats).await.unwrap();
        let b = queue_writer(&writers, &pool, &stats, 1).await;
        insert(&mut a, "a").await;
        // b waits, but a commits alone and hears of it at once.
        a.commit().await.unwrap();
        assert_eq!(rows(&reader).await, ["a"]);
        let mut b = b.await.unwrap();
        let c = queue_writer(&writers, &pool, &stats, 1).await;
        insert(&mut b, "b").await;
        b.commit().await.unwrap();
        assert_eq!(rows(&reader).await, ["a", "b"]);
        let mut c = c.await.unwrap();
        insert(&mut c, "c").await;
        c.commit().await.unwrap();
        assert_eq!(rows(&reader).await, ["a", "b", "c"]);
        let counted = stats.snapshot();
        assert_eq!((counted.writes, counted.transactions), (3, 3));
    }

    #[tokio::test]
    async fn a_group_that_ends_well_leaves_its_connection_home_and_one_sqlite_lost_does_not() {
        let (_pool, reader, file) = file().await;
        // A write pool of one connection that gives up waiting soon: while the
        // connection is kept at home, a group can only begin on it there.
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(SqliteConnectOptions::new().filename(&file.0))
            .await
            .unwrap();
        let home = Home::default();
        let (writers, stats) = writers(Duration::from_secs(600));
        let kept = |home: &Home| home.lock().unwrap().is_some();

        let mut a = writers.begin_at(&write, Some(&home), &stats).await.unwrap();
        insert(&mut a, "a").await;
        // A temporary table lives on its connection only: it tells which one b gets.
        (&mut *a)
            .execute("CREATE TEMP TABLE mark (x)")
            .await
            .unwrap();
        a.commit().await.unwrap();
        assert!(kept(&home), "the connection is kept at home");
        assert_eq!(write.num_idle(), 0, "not given back to the pool");

        let mut b = writers.begin_at(&write, Some(&home), &stats).await.unwrap();
        assert!(!kept(&home), "taken from home while in use");
        (&mut *b).execute("SELECT x FROM temp.mark").await.unwrap();
        insert(&mut b, "b").await;
        b.commit().await.unwrap();
        assert!(kept(&home));

        let mut c = writers.begin_at(&write, Some(&home), &stats).await.unwrap();
        insert(&mut c, "c").await;
        // As SQLite does on an I/O error or a full disk: the whole transaction is gone.
        (&mut *c).execute("ROLLBACK").await.unwrap();
        c.commit().await.expect_err("c's work was lost");
        assert!(!kept(&home), "a connection whose group failed is not kept");

        let mut d = writers.begin_at(&write, Some(&home), &stats).await.unwrap();
        (&mut *d)
            .execute("SELECT x FROM temp.mark")
            .await
            .expect_err("a new connection: the mark was on the closed one");
        insert(&mut d, "d").await;
        d.commit().await.unwrap();
        assert!(kept(&home));
        assert_eq!(rows(&reader).await, ["a", "b", "d"]);
    }
}
