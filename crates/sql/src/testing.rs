//! Stores for the crate's own tests: an in-memory SQLite store, and a PostgreSQL store
//! in a schema of its own that goes when the test ends, both on a manual clock.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use orderly_core::{ManualClock, TimeSource};

/// Where the PostgreSQL tests run (`ORDERLY_TEST_POSTGRES_URL`, or the local server).
fn postgres_url() -> String {
    std::env::var("ORDERLY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Now, in whole seconds (as [`ManualClock::starting_now`]).
pub(crate) fn this_second() -> DateTime<Utc> {
    use chrono::DurationRound;
    let now = Utc::now();
    now.duration_trunc(chrono::Duration::seconds(1))
        .unwrap_or(now)
}

/// A new in-memory SQLite store on a manual clock standing at `start`.
pub(crate) async fn sqlite_at(start: DateTime<Utc>) -> (crate::SqliteStore, ManualClock) {
    let clock = ManualClock::new(start);
    let store = crate::SqliteStore::open(
        "sqlite::memory:",
        TimeSource::Clock(Arc::new(clock.clone())),
    )
    .await
    .expect("an in-memory SQLite store opens");
    (store, clock)
}

/// Runs `test` on a new PostgreSQL store (a schema of its own, migrated) on a manual
/// clock standing at `start`; the schema is dropped whether the test passes or not.
/// A missing server fails the test, naming what to start.
pub(crate) async fn on_postgres_at<F, Fut, T>(start: DateTime<Utc>, test: F) -> T
where
    F: FnOnce(crate::PgStore, ManualClock) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send,
    T: Send + 'static,
{
    in_schema(move |options| async move {
        let clock = ManualClock::new(start);
        let time = TimeSource::Clock(Arc::new(clock.clone()));
        let store = crate::PgStore::connect(options, 2, time)
            .await
            .expect("the test schema migrates");
        test(store, clock).await
    })
    .await
}

/// Runs `test` on two PostgreSQL stores of one new schema on the database's clock,
/// each with wake-ups of its own: two processes, as far as either can tell.
pub(crate) async fn on_postgres_as_two<F, Fut, T>(test: F) -> T
where
    F: FnOnce(crate::PgStore, crate::PgStore) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send,
    T: Send + 'static,
{
    in_schema(move |options| async move {
        let one = crate::PgStore::connect(options.clone(), 2, TimeSource::Database)
            .await
            .expect("the test schema migrates");
        let two = crate::PgStore::connect(options, 2, TimeSource::Database)
            .await
            .expect("a second store opens");
        test(one, two).await
    })
    .await
}

/// Runs `test` with the options of a new schema, dropped whether it passes or not.
async fn in_schema<F, Fut, T>(test: F) -> T
where
    F: FnOnce(sqlx::postgres::PgConnectOptions) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let url = postgres_url();
    let admin = sqlx::PgPool::connect(&url).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL at {url} is needed for this test: {e}. \
             Start it (see README.md, or run .ci/run) or point ORDERLY_TEST_POSTGRES_URL at one."
        )
    });
    let schema = format!("orderly_t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .expect("a test schema is created");
    let options = sqlx::postgres::PgConnectOptions::from_str(&url)
        .expect("the test URL parses")
        .options([("search_path", schema.as_str())]);
    let run = tokio::spawn(test(options)).await;
    let drop = format!("DROP SCHEMA {schema} CASCADE");
    let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&admin).await;
    match run {
        Ok(out) => out,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}
