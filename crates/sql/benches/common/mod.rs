//! Scratch databases for the benchmarks: a temporary SQLite file, or a schema in the
//! PostgreSQL database `ORDERLY_BENCH_POSTGRES_URL` names (default
//! `postgres://postgres@127.0.0.1:5432/test`); both are dropped afterwards.

use std::str::FromStr;
use std::sync::Arc;

use orderly_core::TimeSource;
use orderly_core::store::StateStore;
use orderly_core::transport::Transport;
use orderly_sql::{PgStore, SqliteStore};
use sqlx::postgres::PgConnectOptions;

/// One scratch database.
pub enum Db {
    Sqlite { path: String },
    Postgres { url: String, schema: String },
}

/// A store opened on a scratch database.
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

impl Store {
    #[allow(dead_code)]
    pub fn state_store(self) -> Arc<dyn StateStore> {
        match self {
            Store::Sqlite(s) => Arc::new(s),
            Store::Postgres(s) => Arc::new(s),
        }
    }

    #[allow(dead_code)]
    pub fn transport(self) -> Arc<dyn Transport> {
        match self {
            Store::Sqlite(s) => Arc::new(s),
            Store::Postgres(s) => Arc::new(s),
        }
    }
}

impl Db {
    /// A new scratch database of `kind` (`sqlite` or `postgres`).
    pub async fn fresh(kind: &str) -> Db {
        let id = uuid::Uuid::new_v4().simple().to_string();
        if kind == "sqlite" {
            let path = std::env::temp_dir().join(format!("orderly-bench-{id}.db"));
            return Db::Sqlite {
                path: path.display().to_string(),
            };
        }
        let url = std::env::var("ORDERLY_BENCH_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let schema = format!("orderly_bench_{id}");
        let pool = sqlx::PgPool::connect(&url)
            .await
            .expect("PostgreSQL reachable for the benchmark");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&pool)
            .await
            .expect("schema");
        Db::Postgres { url, schema }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Db::Sqlite { .. } => "SQLite",
            Db::Postgres { .. } => "PostgreSQL",
        }
    }

    /// A new handle (its own connections), migrations applied.
    pub async fn open(&self) -> Store {
        match self {
            Db::Sqlite { path } => Store::Sqlite(
                SqliteStore::open(&format!("sqlite://{path}"), TimeSource::Database)
                    .await
                    .expect("open SQLite"),
            ),
            Db::Postgres { url, schema } => {
                let options = PgConnectOptions::from_str(url)
                    .expect("url")
                    .options([("search_path", schema.as_str())]);
                Store::Postgres(
                    PgStore::connect(options, 8, TimeSource::Database)
                        .await
                        .expect("connect PostgreSQL"),
                )
            }
        }
    }

    pub async fn drop_all(&self) {
        match self {
            Db::Sqlite { path } => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
            Db::Postgres { url, schema } => {
                if let Ok(pool) = sqlx::PgPool::connect(url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS {schema} CASCADE"
                    )))
                    .execute(&pool)
                    .await;
                }
            }
        }
    }
}
