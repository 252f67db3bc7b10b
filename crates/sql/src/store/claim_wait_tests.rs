//! How long a claimer that found nothing waits: for a wake-up or the next order due,
//! not its poll, while other processes' writes are heard.

use std::sync::atomic::Ordering;
use std::time::Duration;

use orderly_core::TimeSource;
use orderly_core::store::IntakeStore;
use orderly_testkit::builders::{order, submitter};

use crate::driver::{Driver, q};
use crate::time::Ts;

/// A SQLite store on the host's clock whose claimers hear other processes' writes (as
/// while a file's watcher runs).
async fn hearing_store() -> crate::SqliteStore {
    let store = crate::SqliteStore::open("sqlite::memory:", TimeSource::Database)
        .await
        .expect("an in-memory SQLite store opens");
    store.wakeups.hearing.store(true, Ordering::Release);
    store
}

/// Moves every Pending order's next attempt to `at`.
async fn due_at<D: Driver>(store: &super::SqlStore<D>, at: chrono::DateTime<chrono::Utc>) {
    let (mut tx, _) = store.begin().await.expect("a write transaction");
    q("UPDATE order_state SET next_attempt_at = $1 WHERE process_state = 'Pending'")
        .bind(Ts(at))
        .execute::<D>(&mut tx)
        .await
        .expect("the update runs");
    D::commit(tx).await.expect("the update commits");
}

/// The claimer's own poll (50 ms) bounds the wait only while an order is due that it
/// did not take; with nothing pending it waits for a wake-up (or the 5 s safety
/// poll), and with an order due later, until then.
#[tokio::test]
async fn a_claimer_that_found_nothing_waits_for_a_wake_up_or_the_next_order_due() {
    let store = hearing_store().await;
    let poll = Duration::from_millis(50);

    // Nothing pending: still waiting long after its poll; a wake-up ends the wait.
    let mut seen = store.wakeups.claims.sent();
    let waiting = store.wait_claimable_for(&mut seen, poll);
    tokio::pin!(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(600), waiting.as_mut())
            .await
            .is_err(),
        "a claimer with nothing pending waited only its poll"
    );
    store.wakeups.wake_claimers();
    tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the wake-up ends the wait");

    // One order pending, due in 400 ms: the wait lasts until then.
    store
        .submit(&order(0), &submitter(), &[])
        .await
        .expect("submit");
    due_at(
        &store,
        chrono::Utc::now() + chrono::Duration::milliseconds(400),
    )
    .await;
    // The submit's wake-up, kept for a claimer that was busy, ends one wait at once.
    let mut seen = store.wakeups.claims.sent();
    store.wait_claimable_for(&mut seen, poll).await;
    let started = std::time::Instant::now();
    store.wait_claimable_for(&mut seen, poll).await;
    let waited = started.elapsed();
    assert!(
        (Duration::from_millis(350)..Duration::from_secs(3)).contains(&waited),
        "waited {waited:?} for an order due in 400 ms"
    );

    // Due now and not taken (another claimer's, or a version this one does not run):
    // the claimer's poll, as before.
    due_at(&store, chrono::Utc::now() - chrono::Duration::seconds(1)).await;
    let started = std::time::Instant::now();
    store.wait_claimable_for(&mut seen, poll).await;
    let waited = started.elapsed();
    assert!(
        (poll..Duration::from_millis(400)).contains(&waited),
        "waited {waited:?} with an order due now"
    );
}

/// While other processes' writes are not heard, or the clock is injected, the poll
/// bounds every wait.
#[tokio::test]
async fn a_claimer_that_hears_nothing_waits_its_poll() {
    let store = hearing_store().await;
    store.wakeups.hearing.store(false, Ordering::Release);
    let poll = Duration::from_millis(50);
    let mut seen = store.wakeups.claims.sent();
    let started = std::time::Instant::now();
    store.wait_claimable_for(&mut seen, poll).await;
    assert!(started.elapsed() < Duration::from_millis(400));

    let (injected, _clock) = crate::testing::sqlite_at(chrono::Utc::now()).await;
    injected.wakeups.hearing.store(true, Ordering::Release);
    let mut seen = injected.wakeups.claims.sent();
    let started = std::time::Instant::now();
    injected.wait_claimable_for(&mut seen, poll).await;
    assert!(started.elapsed() < Duration::from_millis(400));
}
