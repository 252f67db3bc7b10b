//! Behaviour that needs SQL access, checked in both dialects.

use orderly_core::store::{ClaimRequest, IntakeStore, OperatorStore, SchedulerStore};
use orderly_core::{InstanceId, TimeSource};
use orderly_sql::{PgStore, SqliteStore};
use orderly_testkit::builders;
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{pg_factory, sqlite_factory};

#[tokio::test]
async fn sqlite_history_is_append_only() {
    let f = sqlite_factory(TimeSource::Database);
    let store = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    let order = builders::order(1);
    store
        .submit(&order, &builders::submitter(), &[])
        .await
        .unwrap();
    for attempt in [
        "UPDATE order_history SET reason = 'rewritten'",
        "DELETE FROM order_history",
    ] {
        let err = sqlx::query(attempt)
            .execute(store.pool())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("append-only"), "{attempt}: {err}");
    }
    assert_eq!(store.get(&order.order_id).await.unwrap().history.len(), 1);
    f.cleanup().await;
}

#[tokio::test]
async fn postgres_history_is_append_only() {
    let f = pg_factory(TimeSource::Database).await;
    let store = f.store().await;
    let order = builders::order(1);
    store
        .submit(&order, &builders::submitter(), &[])
        .await
        .unwrap();
    for attempt in [
        "UPDATE order_history SET reason = 'rewritten'",
        "DELETE FROM order_history",
    ] {
        let err = sqlx::query(attempt)
            .execute(store.pool())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("append-only"), "{attempt}: {err}");
    }
    f.cleanup().await;
}

#[tokio::test]
async fn sqlite_migrations_run_once_and_reopening_keeps_the_data() {
    let f = sqlite_factory(TimeSource::Database);
    let store = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    assert!(
        store.migrate().await.unwrap().is_empty(),
        "already applied on open"
    );
    let order = builders::order(3);
    store
        .submit(&order, &builders::submitter(), &[])
        .await
        .unwrap();
    drop(store);
    let reopened = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    assert_eq!(
        reopened.get(&order.order_id).await.unwrap().details,
        order.details
    );
    f.cleanup().await;
}

#[tokio::test]
async fn postgres_concurrent_start_ups_apply_each_migration_once() {
    let f = pg_factory(TimeSource::Database).await;
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let options = f.options();
            tokio::spawn(async move {
                PgStore::connect(options, 2, TimeSource::Database)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut stores = Vec::new();
    for s in starts {
        stores.push(s.await.unwrap());
    }
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM orderly_migrations")
        .fetch_one(stores[0].pool())
        .await
        .unwrap();
    assert_eq!(applied as usize, orderly_sql::migrate::POSTGRES.len());
    f.cleanup().await;
}

#[tokio::test]
async fn sqlite_refuses_an_unknown_url_scheme_naming_the_setting() {
    let err = orderly_sql::open("mysql://root@localhost/db", TimeSource::Database)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("database_url"), "{err}");
}

#[tokio::test]
async fn sqlite_claims_with_the_host_clock_by_default() {
    let f = sqlite_factory(TimeSource::Database);
    let store = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    store
        .submit(&builders::order(1), &builders::submitter(), &[])
        .await
        .unwrap();
    let before = chrono::Utc::now();
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: InstanceId::parse("s").unwrap(),
            limit: 1,
            timeout: std::time::Duration::from_secs(30),
        })
        .await
        .unwrap();
    let after = chrono::Utc::now();
    let deadline = claimed[0].complete_by;
    assert!(deadline >= before + chrono::Duration::seconds(30) - chrono::Duration::milliseconds(1));
    assert!(deadline <= after + chrono::Duration::seconds(30));
    f.cleanup().await;
}

/// The conformance suite's handles share one in-process writer queue; these runs take
/// it away so every handle meets the others only at SQLite's own lock, as the worker
/// processes of one host do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_claimers_meeting_only_at_the_file_lock_claim_each_order_once() {
    let ctx = crate::fixtures::sqlite_unqueued().await;
    orderly_testkit::store::eight_concurrent_claimers_claim_each_of_1000_orders_exactly_once(&ctx)
        .await;
    ctx.factory.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_recoverers_meeting_only_at_the_file_lock_count_each_expiry_once() {
    let ctx = crate::fixtures::sqlite_unqueued().await;
    orderly_testkit::store::three_concurrent_recoverers_count_each_expiry_once_and_stop_at_the_threshold(&ctx).await;
    ctx.factory.cleanup().await;
}

#[tokio::test]
async fn sqlite_commits_are_synced_unless_the_url_opts_out() {
    let f = sqlite_factory(TimeSource::Database);
    let synchronous = |store: SqliteStore| async move {
        let mut conn = store.pool().acquire().await.unwrap();
        sqlx::query_scalar::<_, i64>("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    };
    // 2 is FULL, 1 is NORMAL.
    let store = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    assert_eq!(synchronous(store).await, 2);
    let store = SqliteStore::open(
        &format!("{}?synchronous=normal", f.url()),
        TimeSource::Database,
    )
    .await
    .unwrap();
    assert_eq!(synchronous(store).await, 1);
    let store = SqliteStore::open(
        &format!("{}?mode=rwc&synchronous=FULL", f.url()),
        TimeSource::Database,
    )
    .await
    .unwrap();
    assert_eq!(synchronous(store).await, 2);
    let err = SqliteStore::open(
        &format!("{}?synchronous=off", f.url()),
        TimeSource::Database,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("database_url") && err.contains("synchronous=off"),
        "{err}"
    );
    f.cleanup().await;
}
