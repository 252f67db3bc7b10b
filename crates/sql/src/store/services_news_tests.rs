//! How long a view of the services waits before reading them again: until they are
//! written (by this process, or by another while its writes are heard), not its poll.

use std::sync::atomic::Ordering;
use std::time::Duration;

use orderly_core::InstanceId;
use orderly_core::service::{OutagePolicy, ServiceStore};

const POLL: Duration = Duration::from_millis(50);
const LONGEST: Duration = Duration::from_secs(20);

/// Whether `wait` is still running after `long` (so it waits for more than its poll).
async fn still_waiting(wait: std::pin::Pin<&mut impl std::future::Future>, long: Duration) -> bool {
    tokio::time::timeout(long, wait).await.is_err()
}

/// A write that changes a service's state wakes a view of another process at once
/// (PostgreSQL `NOTIFY`), a failure reported again while it is down does not, and
/// nothing else ends the wait before `longest`.
#[tokio::test]
async fn a_view_waits_for_a_write_of_another_process_not_its_poll() {
    crate::testing::on_postgres_as_two(|view, agent| async move {
        let by = InstanceId::generate("agent");
        let policy = OutagePolicy::default();
        // Its listener stands (started by a wait).
        let mut seen = 0;
        for _ in 0..100 {
            if view.wakeups.hearing.load(Ordering::Acquire) {
                break;
            }
            view.services_written(&mut seen, POLL, POLL).await;
        }
        assert!(
            view.wakeups.hearing.load(Ordering::Acquire),
            "the listener stands"
        );
        let mut seen = view.wakeups.services.sent();

        // Down: heard.
        {
            let wait = view.services_written(&mut seen, POLL, LONGEST);
            tokio::pin!(wait);
            assert!(
                still_waiting(wait.as_mut(), Duration::from_millis(600)).await,
                "ended with nothing written"
            );
            agent
                .report_failure("agent.payment", "503", &by, &policy)
                .await
                .unwrap();
            tokio::time::timeout(Duration::from_secs(3), wait)
                .await
                .expect("the outage's start ends the wait");
        }
        // The same failure again, still down: the row changes only its last error.
        {
            let wait = view.services_written(&mut seen, POLL, LONGEST);
            tokio::pin!(wait);
            agent
                .report_failure("agent.payment", "timeout", &by, &policy)
                .await
                .unwrap();
            assert!(
                still_waiting(wait.as_mut(), Duration::from_millis(600)).await,
                "woken by a failure reported again"
            );
            // Up again: heard.
            agent
                .report_success("agent.payment", by.as_str())
                .await
                .unwrap()
                .expect("it was down");
            tokio::time::timeout(Duration::from_secs(3), wait)
                .await
                .expect("the outage's end ends the wait");
        }
    })
    .await;
}

/// This process's own writes wake its views right after their commit (on SQLite, whose
/// watcher does not hear them, and on PostgreSQL, whose listener ignores them); a
/// store that hears nothing of other processes, or runs on an injected clock, waits
/// its poll.
#[tokio::test]
async fn a_view_hears_its_own_process_and_polls_where_it_hears_nothing_else() {
    let store = crate::SqliteStore::open("sqlite::memory:", orderly_core::TimeSource::Database)
        .await
        .unwrap();
    let by = InstanceId::generate("agent");
    // Nothing heard of other processes (an in-memory database has no watcher): the
    // poll.
    let mut seen = store.wakeups.services.sent();
    let started = std::time::Instant::now();
    store.services_written(&mut seen, POLL, LONGEST).await;
    assert!(started.elapsed() < Duration::from_millis(500));

    store.wakeups.hearing.store(true, Ordering::Release);
    let wait = store.services_written(&mut seen, POLL, LONGEST);
    tokio::pin!(wait);
    assert!(still_waiting(wait.as_mut(), Duration::from_millis(600)).await);
    store
        .report_failure("agent.payment", "503", &by, &OutagePolicy::default())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), wait)
        .await
        .expect("this process's own write ends the wait");

    let (injected, _clock) = crate::testing::sqlite_at(chrono::Utc::now()).await;
    injected.wakeups.hearing.store(true, Ordering::Release);
    let mut seen = injected.wakeups.services.sent();
    let started = std::time::Instant::now();
    injected.services_written(&mut seen, POLL, LONGEST).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "an injected clock polls"
    );
}
