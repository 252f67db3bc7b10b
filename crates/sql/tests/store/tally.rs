//! The tallies of finished orders on both dialects, on the store's injected clock: the
//! counts by state stay exact before a first tally, across a first tally of a long
//! stretch (several transactions), with orders finished since the mark, with an order
//! whose finish is stamped before the mark (counted again by the next tally), and as
//! retention removes tallied and untallied orders, also while tallies run beside it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::activity::minute_of;
use orderly_core::store::{Retention, StateStore, TALLY_GRACE, TALLY_STRIDE};
use orderly_core::{Actor, Clock, ManualClock, OrderId, ProcessState, TimeSource};
use orderly_sql::{PgStore, SqliteStore};
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{complete, pg_factory, processed, sqlite_factory, submitted};

const MINUTE: Duration = Duration::from_secs(60);

/// An order submitted now and taken to Processed `latency` later (on `clock`).
async fn processed_in(store: &dyn StateStore, clock: &ManualClock, latency: Duration) -> OrderId {
    let id = submitted(store).await;
    clock.advance(latency);
    complete(store, &id).await;
    id
}

/// An order cancelled now.
async fn cancelled(store: &dyn StateStore) -> OrderId {
    let id = submitted(store).await;
    store
        .cancel(&id, &Actor::operator("dan"), "not wanted", &[])
        .await
        .unwrap();
    id
}

/// Asserts the Processed and Cancelled counts (and no live order).
async fn counts(store: &dyn StateStore, processed: i64, cancelled: i64, when: &str) {
    let counts: HashMap<_, _> = store.count_by_state().await.unwrap().into_iter().collect();
    assert_eq!(counts.len(), 5, "{when}: every state is listed");
    assert_eq!(
        (
            counts[&ProcessState::Processed],
            counts[&ProcessState::Cancelled]
        ),
        (processed, cancelled),
        "{when}: Processed and Cancelled"
    );
    for live in [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Error,
    ] {
        assert_eq!(counts[&live], 0, "{when}: {live}");
    }
}

fn keep(keep: Duration) -> Retention {
    Retention { keep, batch: 2 }
}

fn mark_for(now: DateTime<Utc>) -> DateTime<Utc> {
    minute_of(now - TALLY_GRACE)
}

async fn tallies(store: Arc<dyn StateStore>, clock: ManualClock) {
    let store = store.as_ref();
    let t0 = clock.now();
    counts(store, 0, 0, "empty").await;
    // Forty minutes of finishes, nothing tallied yet.
    processed(store).await;
    processed(store).await;
    clock.advance(20 * MINUTE);
    processed_in(store, &clock, Duration::from_millis(1_500)).await;
    cancelled(store).await;
    clock.advance(20 * MINUTE);
    processed(store).await;
    counts(store, 4, 1, "before any tally").await;
    let activity = store.activity(t0 - MINUTE).await.unwrap();
    assert_eq!(
        activity.len(),
        3,
        "three minutes with finishes: {activity:?}"
    );
    // Windows starting before, inside and between the finishes, mid-minute or not.
    let windows = [
        t0 - MINUTE,
        t0,
        t0 + Duration::from_secs(1),
        t0 + 20 * MINUTE,
        t0 + 20 * MINUTE + Duration::from_secs(30),
        t0 + 39 * MINUTE,
        t0 + 40 * MINUTE,
    ];
    let mut finished = Vec::new();
    for since in windows {
        finished.push(store.finished_since(since).await.unwrap());
    }

    // The first tally goes in strides; the last finish is within the grace.
    let t = store.tally_finished().await.unwrap();
    assert_eq!(t.upto, mark_for(clock.now()));
    assert_eq!(t.orders, 4, "{t:?}");
    let span = t.upto - minute_of(t0);
    let strides = (span.num_seconds() as u64).div_ceil(TALLY_STRIDE.as_secs());
    assert_eq!(u64::from(t.transactions), strides, "{t:?}");
    counts(store, 4, 1, "after the first tally").await;
    assert_eq!(
        store.activity(t0 - MINUTE).await.unwrap(),
        activity,
        "the charts' minutes, read from the tallies, are those read from the rows"
    );
    for (since, before) in windows.iter().zip(&finished) {
        assert_eq!(
            &store.finished_since(*since).await.unwrap(),
            before,
            "finished since {since}, from the tallies as from the rows"
        );
    }
    // Again at once: nothing new to tally.
    let again = store.tally_finished().await.unwrap();
    assert_eq!((again.upto, again.transactions), (t.upto, 0));
    counts(store, 4, 1, "after a tally with nothing to do").await;

    // A finish stamped before the mark (its transaction began long before it
    // committed): short until the next tally counts its minute again.
    let upto = t.upto;
    clock.set(upto - 2 * MINUTE);
    processed(store).await;
    counts(
        store,
        4,
        1,
        "a finish stamped before the mark, not yet tallied",
    )
    .await;
    clock.set(t0 + 42 * MINUTE);
    let t = store.tally_finished().await.unwrap();
    assert_eq!(t.upto, mark_for(clock.now()));
    assert_eq!(t.transactions, 1);
    counts(store, 5, 1, "the late finish counted again").await;

    // Retention of tallied orders only (finished before t0 + 30 min): the four
    // finished at t0 and t0 + 20 min.
    let p = store.prune(&keep(12 * MINUTE), false).await.unwrap();
    assert_eq!(p.orders, 4, "{p:?}");
    counts(store, 2, 0, "after retention of tallied orders").await;
    // Then of everything finished, tallied or not (one finished since the mark).
    processed(store).await;
    counts(store, 3, 0, "one more since the mark").await;
    clock.advance(Duration::from_secs(2));
    let p = store
        .prune(&keep(Duration::from_secs(1)), false)
        .await
        .unwrap();
    assert_eq!(p.orders, 3, "{p:?}");
    counts(store, 0, 0, "after retention of every finished order").await;
    clock.advance(10 * MINUTE);
    store.tally_finished().await.unwrap();
    counts(store, 0, 0, "tallied after retention").await;
}

#[tokio::test]
async fn sqlite_counts_by_state_stay_exact_across_tallies_late_finishes_and_retention() {
    let clock = ManualClock::starting_now();
    let f = sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())));
    let store = SqliteStore::open(&f.url(), f.time.clone()).await.unwrap();
    tallies(Arc::new(store), clock).await;
    f.cleanup().await;
}

#[tokio::test]
async fn postgres_counts_by_state_stay_exact_across_tallies_late_finishes_and_retention() {
    let clock = ManualClock::starting_now();
    let f = pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await;
    let store: PgStore = f.store().await;
    tallies(Arc::new(store), clock).await;
    f.cleanup().await;
}

/// Retention removes orders of the minutes a tally is counting again while tallies
/// run beside it, over separate connections: the counts end exact.
async fn tallies_beside_retention(store: Arc<dyn StateStore>, clock: ManualClock) {
    let t0 = clock.now();
    let mut finished = 0i64;
    // 120 orders finished over 20 minutes, with latencies of several buckets (which
    // retention's trigger computes again to find an order's tally).
    for i in 0..120u64 {
        let latency = Duration::from_millis([0, 7, 150, 10_000][(i % 4) as usize]);
        processed_in(store.as_ref(), &clock, latency).await;
        finished += 1;
        clock.advance(Duration::from_secs(10) - latency);
    }
    // Tallied up to the minute before; the next tallies count the last five again,
    // which retention (keeping 5 minutes: everything finished before t0 + 15.5 min)
    // is removing from.
    store.tally_finished().await.unwrap();
    clock.set(t0 + 20 * MINUTE + Duration::from_secs(30));
    let tally = {
        let store = store.clone();
        let clock = clock.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                store.tally_finished().await.unwrap();
                clock.advance(Duration::from_secs(1));
            }
        })
    };
    let prune = {
        let store = store.clone();
        tokio::spawn(async move {
            let p = store
                .prune(
                    &Retention {
                        keep: 5 * MINUTE,
                        batch: 3,
                    },
                    false,
                )
                .await
                .unwrap();
            p.orders as i64
        })
    };
    let removed = prune.await.unwrap();
    tally.await.unwrap();
    assert!(removed >= 90, "retention removed {removed}");
    counts(
        store.as_ref(),
        finished - removed,
        0,
        "after tallies beside retention",
    )
    .await;
    clock.advance(10 * MINUTE);
    store.tally_finished().await.unwrap();
    counts(store.as_ref(), finished - removed, 0, "after a last tally").await;
}

#[tokio::test]
async fn sqlite_tallies_beside_retention_end_exact() {
    let clock = ManualClock::starting_now();
    let f = sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())));
    let store = SqliteStore::open(&f.url(), f.time.clone()).await.unwrap();
    tallies_beside_retention(Arc::new(store), clock).await;
    f.cleanup().await;
}

#[tokio::test]
async fn postgres_tallies_beside_retention_end_exact() {
    let clock = ManualClock::starting_now();
    let f = pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await;
    let store: PgStore = f.store().await;
    tallies_beside_retention(Arc::new(store), clock).await;
    f.cleanup().await;
}
