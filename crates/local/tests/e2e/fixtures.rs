//! Fresh stores per test: a new SQLite file, or a new PostgreSQL schema. PostgreSQL is
//! required: a test that cannot reach it fails, so a green run always includes it.

use orderly_core::TimeSource;
use orderly_sql::Backend;

/// Where the PostgreSQL tests connect (`ORDERLY_TEST_POSTGRES_URL`).
pub fn postgres_url() -> String {
    std::env::var("ORDERLY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A fresh database; removed when dropped.
pub struct Db {
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    File(std::path::PathBuf),
    Schema(String),
}

impl Db {
    pub async fn new(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Sqlite => {
                let path = std::env::temp_dir()
                    .join(format!("orderly-e2e-{}.db", uuid::Uuid::new_v4().simple()));
                Db {
                    url: format!("sqlite://{}", path.display()),
                    cleanup: Cleanup::File(path),
                }
            }
            Dialect::Postgres => {
                let base = postgres_url();
                let pool = match sqlx::PgPool::connect(&base).await {
                    Ok(pool) => pool,
                    Err(e) => panic!(
                        "PostgreSQL is required by the end-to-end tests and is not reachable: {e}. \
                         Start it (see README.md, or run .ci/run) or set ORDERLY_TEST_POSTGRES_URL."
                    ),
                };
                let schema = format!("orderly_e2e_{}", uuid::Uuid::new_v4().simple());
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&pool)
                    .await
                    .unwrap();
                pool.close().await;
                let sep = if base.contains('?') { '&' } else { '?' };
                Db {
                    url: format!("{base}{sep}options=-c%20search_path%3D{schema}"),
                    cleanup: Cleanup::Schema(schema),
                }
            }
        }
    }

    /// A fresh database with the default workflow's queues declared (requests locked
    /// for `request_lock`), and a backend on it.
    pub async fn with_queues(
        dialect: Dialect,
        request_lock: std::time::Duration,
    ) -> (Self, Backend) {
        let db = Self::new(dialect).await;
        let backend = db.backend().await;
        orderly_local::system::declare_queues(
            &backend,
            &orderly_core::workflow::Workflow::default(),
            request_lock,
        )
        .await
        .expect("declare the queues");
        (db, backend)
    }

    pub async fn backend(&self) -> Backend {
        orderly_sql::connect(&self.url, TimeSource::Database)
            .await
            .expect("open the test store")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::File(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::Schema(schema) => {
                let schema = schema.clone();
                // Best effort, on a thread of its own: Drop may run inside a runtime.
                let _ = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    if let Ok(rt) = rt {
                        rt.block_on(async {
                            if let Ok(pool) = sqlx::PgPool::connect(&postgres_url()).await {
                                let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
                                let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&pool).await;
                            }
                        });
                    }
                })
                .join();
            }
        }
    }
}

/// Declares the test in both dialects: `both!(name, body_fn)` makes `name::sqlite` and
/// `name::postgres` calling `body_fn(Dialect)`.
#[macro_export]
macro_rules! both {
    ($name:ident, $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$body($crate::fixtures::Dialect::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$body($crate::fixtures::Dialect::Postgres).await
            }
        }
    };
}

/// Workflow files of a test, in a directory of their own; removed when dropped.
pub struct Files {
    dir: std::path::PathBuf,
}

impl Files {
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "orderly-workflows-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    /// Writes `text` as the file `name`: its path, and the workflow it loads as.
    pub fn write(&self, name: &str, text: &str) -> (String, orderly_core::workflow::Workflow) {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        let workflow = orderly_runtime::load_workflow(Some(&path)).unwrap();
        (path.display().to_string(), workflow)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
