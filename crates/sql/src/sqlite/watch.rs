//! Other processes' commits, heard. SQLite has no `NOTIFY`, but a connection's
//! `PRAGMA data_version` changes whenever another connection, of this process or of
//! another, commits to the file. One watcher per file and process reads it on a
//! connection of its own: [`BUSY`] apart while the file changes, backing off to
//! [`IDLE`] apart while it does not (a read of the WAL index in shared memory, no I/O).
//! After a change it asks, in one read, which of the queues this process receives from
//! hold a visible message and whether an order is claimable, and wakes one receiver of
//! each and one scheduler, as a PostgreSQL notification does. This process's own sends
//! woke their receivers at commit already; a wake-up for one of them costs one read
//! that finds it taken. Messages that come back without a commit (a lock that ran
//! out, a scheduled time reached) are still found by the receivers' poll.

use std::ops::ControlFlow;
use std::sync::Weak;
use std::time::Duration;

use orderly_core::TimeSource;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, Row, SqliteConnection};

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

/// Watches the file of `options` for commits and wakes `wakeups`' receivers, until the
/// wake-ups are dropped.
pub(super) async fn watch(options: SqliteConnectOptions, time: TimeSource, wakeups: Weak<Wakeups>) {
    loop {
        let error = match watch_on(&options, &time, &wakeups).await {
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
) -> ControlFlow<(), sqlx::Error> {
    let mut conn = match SqliteConnection::connect_with(options).await {
        Ok(conn) => conn,
        Err(e) => return ControlFlow::Continue(e),
    };
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
        let version = match data_version(&mut conn).await {
            Ok(v) => v,
            Err(e) => return ControlFlow::Continue(e),
        };
        if version == seen {
            nap = (nap * 2).min(IDLE);
            continue;
        }
        seen = version;
        nap = BUSY;
        match filled(&mut conn, &w.queue_names(), time).await {
            Ok(filled) => filled.iter().for_each(|what| w.heard(what)),
            Err(e) => return ControlFlow::Continue(e),
        }
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
        let file = std::env::temp_dir().join(format!("orderly-watch-{}.db", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}", file.display());
        let store = SqliteStore::open(&url, TimeSource::Database)
            .await
            .expect("the file opens");
        store
            .declare_queue(&queue(), &QueueSettings::default())
            .await
            .expect("the queue is declared");
        let signal = store.wakeups.of(queue().as_str());
        store.driver.start_listening(&store.wakeups);
        let hearing = || {
            store
                .wakeups
                .hearing
                .load(std::sync::atomic::Ordering::Acquire)
        };
        // The watcher runs on this runtime: let it start.
        let until = Instant::now() + Duration::from_secs(20);
        while !hearing() {
            assert!(Instant::now() < until, "the watcher never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (sent, claimable) = (signal.sent(), store.wakeups.claims.sent());
        let (exe, child_url) = (std::env::current_exe().expect("this binary"), url.clone());
        let child = tokio::task::spawn_blocking(move || {
            std::process::Command::new(exe)
                .args([
                    "--exact",
                    "sqlite::watch::tests::child_sends_and_submits",
                    "--ignored",
                ])
                .env(CHILD, child_url)
                .status()
        })
        .await
        .expect("the child's wait")
        .expect("the child runs");
        assert!(child.success(), "the child process failed: {child}");
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
        assert!(
            !store
                .receive(&queue(), 1, Duration::ZERO)
                .await
                .expect("a receive")
                .is_empty(),
            "the message the child sent is there"
        );
        drop(store);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
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
