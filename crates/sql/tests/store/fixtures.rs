//! Fresh databases for tests: a new SQLite file, or a new PostgreSQL schema, per test.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use orderly_core::store::StateStore;
use orderly_core::transport::Transport;
use orderly_core::{ManualClock, TimeSource};
use orderly_sql::sqlite::WriterQueue;
use orderly_sql::{PgStore, SqliteStore};
use orderly_testkit::store::{Ctx, StoreFactory};
use orderly_testkit::transport::{TransportCtx, TransportFactory};
use sqlx::postgres::PgConnectOptions;

/// Where the PostgreSQL tests connect (`ORDERLY_TEST_POSTGRES_URL`).
pub fn postgres_url() -> String {
    std::env::var("ORDERLY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub struct SqliteFactory {
    pub path: PathBuf,
    pub time: TimeSource,
    pub queue: WriterQueue,
}

impl SqliteFactory {
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    async fn open(&self) -> Arc<dyn StateStore> {
        Arc::new(
            SqliteStore::open_with(&self.url(), self.time.clone(), self.queue)
                .await
                .expect("open SQLite store"),
        )
    }

    async fn cleanup(&self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

pub fn sqlite_factory(time: TimeSource) -> SqliteFactory {
    let path =
        std::env::temp_dir().join(format!("orderly-test-{}.db", uuid::Uuid::new_v4().simple()));
    SqliteFactory {
        path,
        time,
        queue: WriterQueue::Process,
    }
}

pub async fn sqlite() -> Ctx {
    let clock = ManualClock::starting_now();
    Ctx {
        factory: Box::new(sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())))),
        clock,
    }
}

/// Handles that meet only at SQLite's own write lock, as separate processes do.
pub async fn sqlite_unqueued() -> Ctx {
    let clock = ManualClock::starting_now();
    let mut factory = sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())));
    factory.queue = WriterQueue::None;
    Ctx {
        factory: Box::new(factory),
        clock,
    }
}

pub struct PgFactory {
    pub schema: String,
    pub time: TimeSource,
}

impl PgFactory {
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::from_str(&postgres_url())
            .expect("ORDERLY_TEST_POSTGRES_URL is a valid URL")
            .options([("search_path", self.schema.as_str())])
    }

    pub async fn store(&self) -> PgStore {
        PgStore::connect(self.options(), 4, self.time.clone())
            .await
            .expect("connect to PostgreSQL")
    }
}

#[async_trait]
impl StoreFactory for PgFactory {
    async fn open(&self) -> Arc<dyn StateStore> {
        Arc::new(self.store().await)
    }

    async fn cleanup(&self) {
        if let Ok(pool) = sqlx::PgPool::connect(&postgres_url()).await {
            let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
            let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&pool).await;
        }
    }
}

/// A login role made for one test, dropped when the test ends, whether it passed or
/// failed (a role belongs to the whole server, not to the test's schema).
pub struct TestRole(pub String);

impl TestRole {
    /// Creates a role without superuser rights, named for this test run.
    pub async fn create(conn: &mut sqlx::PgConnection) -> Self {
        let role = TestRole(format!("orderly_t_{}", uuid::Uuid::new_v4().simple()));
        execute_all(conn, &[format!("CREATE ROLE {} LOGIN NOSUPERUSER", role.0)]).await;
        role
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let role = self.0.clone();
        // Its own thread and runtime: a test's runtime may be gone or unwinding.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test role");
            runtime.block_on(async {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&postgres_url()).await?;
                for sql in [
                    format!("DROP OWNED BY {role}"),
                    format!("DROP ROLE IF EXISTS {role}"),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await?;
                }
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test role {}: {e}", self.0),
            Err(_) => eprintln!("could not drop test role {}: its clean-up panicked", self.0),
        }
    }
}

/// Runs `statements` in order on `conn`, each on its own (a test's set-up).
pub async fn execute_all(conn: &mut sqlx::PgConnection, statements: &[String]) {
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// A fresh schema in the test database. PostgreSQL is required: a test that cannot
/// reach it fails, so a green run always includes the PostgreSQL suite.
pub async fn pg_factory(time: TimeSource) -> PgFactory {
    let url = postgres_url();
    let pool = match sqlx::PgPool::connect(&url).await {
        Ok(pool) => pool,
        Err(e) => panic!(
            "PostgreSQL is required by the state-store tests and is not reachable at {}: {e}. \
             Start it (see README.md, or run .ci/run) or point ORDERLY_TEST_POSTGRES_URL at one.",
            url.split('@').next_back().unwrap_or("?")
        ),
    };
    let schema = format!("orderly_t_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&pool)
        .await
        .expect("create test schema");
    pool.close().await;
    PgFactory { schema, time }
}

pub async fn postgres() -> Ctx {
    let clock = ManualClock::starting_now();
    Ctx {
        factory: Box::new(pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await),
        clock,
    }
}

#[async_trait]
impl TransportFactory for SqliteFactory {
    async fn open(&self) -> Arc<dyn Transport> {
        Arc::new(
            SqliteStore::open_with(&self.url(), self.time.clone(), self.queue)
                .await
                .expect("open SQLite store"),
        )
    }

    async fn cleanup(&self) {
        StoreFactory::cleanup(self).await
    }
}

#[async_trait]
impl TransportFactory for PgFactory {
    async fn open(&self) -> Arc<dyn Transport> {
        Arc::new(self.store().await)
    }

    async fn cleanup(&self) {
        StoreFactory::cleanup(self).await
    }
}

pub async fn sqlite_transport() -> TransportCtx {
    let clock = ManualClock::starting_now();
    TransportCtx {
        factory: Box::new(sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())))),
        clock,
    }
}

pub async fn postgres_transport() -> TransportCtx {
    let clock = ManualClock::starting_now();
    TransportCtx {
        factory: Box::new(pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await),
        clock,
    }
}

/// The SQL elector's lease row, in the store under test.
pub struct SqlLeases;

#[async_trait]
impl orderly_testkit::elector::LeaseMaker for SqlLeases {
    async fn lease(
        &self,
        store: Arc<dyn StateStore>,
        instance: &orderly_core::InstanceId,
        timing: &orderly_core::leader::ElectorTiming,
    ) -> Arc<dyn orderly_core::leader::Lease> {
        Arc::new(orderly_core::leader::StoreLease::new(
            store,
            orderly_testkit::elector::NAME,
            instance.clone(),
            timing.lease,
        ))
    }
}

/// Timings for the SQL elector in tests: a 3 s lease, renewed every 300 ms, a 2 s
/// renew deadline.
pub fn sql_elector_timing() -> orderly_core::leader::ElectorTiming {
    use std::time::Duration;
    orderly_core::leader::ElectorTiming {
        lease: Duration::from_secs(3),
        renew_interval: Duration::from_millis(300),
        renew_retry: Duration::from_millis(200),
        renew_deadline: Duration::from_secs(2),
        retry: Duration::from_millis(300),
        retry_jitter: 0.2,
        call_timeout: Duration::from_millis(500),
        stop_grace: Duration::from_millis(500),
        heartbeat_timeout: Duration::from_secs(1),
    }
}

pub async fn sqlite_elector() -> orderly_testkit::elector::ElectorCtx {
    orderly_testkit::elector::ElectorCtx {
        factory: Box::new(sqlite_factory(TimeSource::Database)),
        leases: Box::new(SqlLeases),
        timing: sql_elector_timing(),
    }
}

pub async fn postgres_elector() -> orderly_testkit::elector::ElectorCtx {
    orderly_testkit::elector::ElectorCtx {
        factory: Box::new(pg_factory(TimeSource::Database).await),
        leases: Box::new(SqlLeases),
        timing: sql_elector_timing(),
    }
}

/// An order submitted now.
pub async fn submitted(store: &dyn StateStore) -> orderly_core::OrderId {
    let order = orderly_testkit::builders::order(1);
    store
        .submit(&order, &orderly_testkit::builders::submitter(), &[])
        .await
        .unwrap();
    order.order_id
}

/// Claims and completes `id` (as a scheduler does).
pub async fn complete(store: &dyn StateStore, id: &orderly_core::OrderId) {
    let claimed = store
        .claim(&orderly_core::store::ClaimRequest {
            workflows: Default::default(),
            owner: orderly_core::InstanceId::parse("scheduler-1").unwrap(),
            limit: 10,
            timeout: std::time::Duration::from_secs(60),
        })
        .await
        .unwrap();
    let fence = claimed
        .into_iter()
        .find(|c| c.fence.order_id == *id)
        .unwrap()
        .fence;
    let out = store
        .complete_many(&[orderly_core::store::Completion::from(fence)])
        .await
        .unwrap();
    assert_eq!(out.completed.len(), 1);
}

/// An order taken to Processed now (claimed, completed).
pub async fn processed(store: &dyn StateStore) -> orderly_core::OrderId {
    let id = submitted(store).await;
    complete(store, &id).await;
    id
}
