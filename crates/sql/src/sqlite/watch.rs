//! Other processes' commits, heard. SQLite has no `NOTIFY`, but a connection's
//! `PRAGMA data_version` changes whenever another connection, of this process or of
//! another, commits to the file. One watcher per file and process reads it on a
//! connection of its own: [`BUSY`] apart while the file changes, backing off to
//! [`IDLE`] apart while it does not (a read of the WAL index in shared memory, no I/O).
//! After another connection's commit it asks, in one read, which of the queues this
//! process receives from hold a visible message and whether an order is claimable, and
//! wakes one receiver of each and one scheduler, as a PostgreSQL notification does.
//!
//! `data_version` moves with this process's commits too, which woke their receivers
//! already: asking then woke a second receiver for messages the first was taking, and
//! it found nothing after waiting for the write lock (a write transaction for nothing,
//! hundreds a second under load). So a change while this process committed nothing is
//! another's for certain; a change while it did is checked on the writer's own
//! connection, whose `data_version` moves only with other connections' commits
//! ([`Writers::others_committed`], one read in the writers' turn). Messages that come
//! back without a commit (a lock that ran out, a scheduled time reached) are still
//! found by the receivers' poll.

use std::ops::ControlFlow;
use std::sync::{Arc, Weak};
use std::time::Duration;

use orderly_core::TimeSource;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, Row, SqliteConnection};

use super::group::{Home, Writers};
use super::statements as sql;
use crate::time::Ts;
use crate::wakeups::{CLAIMABLE, Wakeups};

/// How soon the file is read again after it changed.
pub(super) const BUSY: Duration = Duration::from_millis(2);

/// How far apart the reads get while the file does not change.
pub(super) const IDLE: Duration = Duration::from_millis(50);

/// How long the watcher waits before it opens its connection again after an error
/// (receivers poll meanwhile).
const AGAIN: Duration = Duration::from_millis(500);

/// Where the watcher tells this process's commits from other connections': its
/// writers, and where their connection is kept between groups.
pub(super) struct Own {
    pub(super) writers: Arc<Writers>,
    pub(super) home: Option<Home>,
}

/// Watches the file of `options` for other connections' commits (told from this
/// process's by `own`) and wakes `wakeups`' receivers, until the wake-ups are dropped.
pub(super) async fn watch(
    options: SqliteConnectOptions,
    time: TimeSource,
    wakeups: Weak<Wakeups>,
    own: Own,
) {
    loop {
        let error = match watch_on(&options, &time, &wakeups, &own).await {
            ControlFlow::Break(()) => return,
            ControlFlow::Continue(error) => error,
        };
        let Some(w) = wakeups.upgrade() else { return };
        // Not heard meanwhile: every receive looks first, and whatever was sent is
        // looked for once.
        w.hearing_lost();
        drop(w);
        tracing::warn!(error = %error, "cannot watch the SQLite file for other processes' commits; receivers poll until it can");
        tokio::time::sleep(AGAIN).await;
    }
}

/// One connection's watch: `Break` when the wake-ups are gone, `Continue` with the
/// error that ended it.
async fn watch_on(
    options: &SqliteConnectOptions,
    time: &TimeSource,
    wakeups: &Weak<Wakeups>,
    own: &Own,
) -> ControlFlow<(), sqlx::Error> {
    let others = &own.writers.others;
    let mut conn = match SqliteConnection::connect_with(options).await {
        Ok(conn) => conn,
        Err(e) => return ControlFlow::Continue(e),
    };
    // This process's commits finished before the look at the file.
    let mut done = others.done();
    let mut seen = match data_version(&mut conn).await {
        Ok(v) => v,
        Err(e) => return ControlFlow::Continue(e),
    };
    // Heard from now on; what was sent before, every receiver looks for once.
    {
        let Some(w) = wakeups.upgrade() else {
            return ControlFlow::Break(());
        };
        w.hearing_began();
    }
    let mut nap = BUSY;
    loop {
        tokio::time::sleep(nap).await;
        let Some(w) = wakeups.upgrade() else {
            return ControlFlow::Break(());
        };
        let done_before = std::mem::replace(&mut done, others.done());
        let version = match data_version(&mut conn).await {
            Ok(v) => v,
            Err(e) => return ControlFlow::Continue(e),
        };
        if version == seen {
            nap = (nap * 2).min(IDLE);
            others
                .reads
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            continue;
        }
        seen = version;
        nap = BUSY;
        // Every commit this process began had finished before the last read: the
        // change is another connection's. Otherwise the writer's connection tells
        // (read after this one's, it holds every commit this one saw); when it
        // cannot, look.
        let theirs = others.begun() == done_before
            || own.writers.others_committed(own.home.as_ref()).await != Some(false);
        if theirs {
            match filled(&mut conn, &w.queue_names(), time).await {
                Ok(filled) => filled.iter().for_each(|what| w.heard(what)),
                Err(e) => return ControlFlow::Continue(e),
            }
            // Which tables another process wrote is not known: the views of the
            // services read them again (each at most once per its poll interval).
            w.services.anything();
        }
        others
            .reads
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

async fn data_version(conn: &mut SqliteConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("PRAGMA data_version")
        .fetch_one(conn)
        .await
}

/// Which of `queues` hold a message visible now, and [`CLAIMABLE`] when an order is.
async fn filled(
    conn: &mut SqliteConnection,
    queues: &[String],
    time: &TimeSource,
) -> Result<Vec<String>, sqlx::Error> {
    let names = serde_json::to_string(queues).unwrap_or_else(|_| "[]".into());
    let rows = sqlx::query(sql::FILLED)
        .bind(names)
        .bind(Ts(time.now_or_host()))
        .bind(CLAIMABLE)
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|r| r.try_get::<String, _>("what"))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use orderly_core::TimeSource;
    use orderly_core::store::IntakeStore;
    use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings, Transport};
    use orderly_testkit::builders::{order_with_id, submitter};

    use crate::SqliteStore;
    use crate::driver::Driver;

    /// The file the child process writes to (set only in the child).
    const CHILD: &str = "ORDERLY_TEST_WATCHED_FILE";

    fn queue() -> QueueName {
        QueueName::parse("watched").expect("a valid queue name")
    }

    /// Another process's send and submitted order wake this process's receiver and
    /// scheduler (none of this process's commits raised them). The other process is
    /// this test binary again, running [`child_sends_and_submits`] on the same file.
    #[tokio::test]
    async fn another_process_s_commits_wake_this_process_s_receivers() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let (store, file) = watched().await;
        let signal = store.wakeups.of(queue().as_str());
        let (sent, claimable) = (signal.sent(), store.wakeups.claims.sent());
        run_child(&file).await;
        heard(&store, sent, claimable).await;
        assert!(
            !store
                .receive(&queue(), 1, Duration::ZERO)
                .await
                .expect("a receive")
                .is_empty(),
            "the message the child sent is there"
        );
        drop(store);
        remove(&file);
    }

    /// Waits (bounded) until the watched queue's receivers and the schedulers were
    /// woken since their counts were `sent` and `claimable`.
    async fn heard(store: &SqliteStore, sent: u64, claimable: u64) {
        let signal = store.wakeups.of(queue().as_str());
        let until = Instant::now() + Duration::from_secs(20);
        while signal.sent() == sent || store.wakeups.claims.sent() == claimable {
            assert!(
                Instant::now() < until,
                "not heard within 20 s: the queue's signal {} -> {}, the claimers' {} -> {}",
                sent,
                signal.sent(),
                claimable,
                store.wakeups.claims.sent()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A store on a new file, its watcher started and hearing.
    async fn watched() -> (SqliteStore, std::path::PathBuf) {
        let file = std::env::temp_dir().join(format!("orderly-watch-{}.db", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(
            &format!("sqlite://{}", file.display()),
            TimeSource::Database,
        )
        .await
        .expect("the file opens");
        for q in [queue(), busy()] {
            store
                .declare_queue(&q, &QueueSettings::default())
                .await
                .expect("the queue is declared");
        }
        store.driver.start_listening(&store.wakeups);
        let until = Instant::now() + Duration::from_secs(20);
        while !store.wakeups.hearing.load(Ordering::Acquire) {
            assert!(Instant::now() < until, "the watcher never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (store, file)
    }

    fn remove(file: &std::path::Path) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }

    fn busy() -> QueueName {
        QueueName::parse("busy").expect("a valid queue name")
    }

    /// Waits until the watcher finished with a read of the file begun after this
    /// call (so with whatever was committed before it).
    async fn watcher_caught_up(store: &SqliteStore) {
        let reads = || store.driver.writers.others.reads.load(Ordering::Acquire);
        // The first read finished may have begun before; the second began after.
        let target = reads() + 2;
        let until = Instant::now() + Duration::from_secs(20);
        while reads() < target {
            assert!(
                Instant::now() < until,
                "the watcher read the file no more within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// This process's sends wake one receiver at commit, and the watcher, which sees
    /// the file change with them, wakes nobody again: a second wake-up sent a receiver
    /// to wait for the write lock and find the message taken.
    #[tokio::test]
    async fn this_process_s_own_commits_wake_its_receivers_once() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let (store, file) = watched().await;
        let signal = store.wakeups.of(queue().as_str());
        // The first change sets what the writer's connection has seen.
        store
            .send(&queue(), &[OutgoingMessage::new("m-0", b"x".to_vec())])
            .await
            .expect("a send");
        watcher_caught_up(&store).await;
        for i in 1..=5 {
            let (sent, claims) = (signal.sent(), store.wakeups.claims.sent());
            store
                .send(
                    &queue(),
                    &[OutgoingMessage::new(format!("m-{i}"), b"x".to_vec())],
                )
                .await
                .expect("a send");
            store
                .submit(&order_with_id(&format!("o-{i}"), 1), &submitter(), &[])
                .await
                .expect("an order is accepted");
            watcher_caught_up(&store).await;
            assert_eq!(
                signal.sent(),
                sent + 1,
                "send {i}: the queue's receivers were woken once, at commit"
            );
            assert_eq!(
                store.wakeups.claims.sent(),
                claims + 1,
                "order {i}: the schedulers were woken once, at commit"
            );
        }
        drop(store);
        remove(&file);
    }

    /// Another process's commits are heard while this process commits all the time
    /// too: the file changes at every read of the watcher with this process's commits
    /// among them, and the writer's own connection tells the other's apart.
    #[tokio::test]
    async fn another_process_s_commits_are_heard_among_this_process_s_own() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let (store, file) = watched().await;
        let signal = store.wakeups.of(queue().as_str());
        let (sent, claimable) = (signal.sent(), store.wakeups.claims.sent());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    n += 1;
                    store
                        .send(
                            &busy(),
                            &[OutgoingMessage::new(format!("b-{n}"), b"x".to_vec())],
                        )
                        .await
                        .expect("a send");
                }
                n
            })
        };
        run_child(&file).await;
        heard(&store, sent, claimable).await;
        stop.store(true, Ordering::Release);
        let sends = writer.await.expect("the writer");
        assert!(sends > 1, "this process kept committing ({sends} sends)");
        drop(store);
        remove(&file);
    }

    /// Runs [`child_sends_and_submits`] as another process on `file`.
    async fn run_child(file: &std::path::Path) {
        let (exe, url) = (
            std::env::current_exe().expect("this binary"),
            format!("sqlite://{}", file.display()),
        );
        let status = tokio::task::spawn_blocking(move || {
            std::process::Command::new(exe)
                .args([
                    "--exact",
                    "sqlite::watch::tests::child_sends_and_submits",
                    "--ignored",
                ])
                .env(CHILD, url)
                .status()
        })
        .await
        .expect("the child's wait")
        .expect("the child runs");
        assert!(status.success(), "the child process failed: {status}");
    }

    /// Run by [`another_process_s_commits_wake_this_process_s_receivers`] as another
    /// process: sends one message and submits one order to the file it names.
    #[tokio::test]
    #[ignore = "another test runs it as a process of its own"]
    async fn child_sends_and_submits() {
        let Some(url) = std::env::var_os(CHILD) else {
            return;
        };
        let store = SqliteStore::open(&url.to_string_lossy(), TimeSource::Database)
            .await
            .expect("the file opens");
        store
            .send(&queue(), &[OutgoingMessage::new("m-1", b"hello".to_vec())])
            .await
            .expect("the message is sent");
        store
            .submit(&order_with_id("o-watched", 1), &submitter(), &[])
            .await
            .expect("the order is accepted");
    }
}
