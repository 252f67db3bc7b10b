//! The SQL state store of orderly: one implementation of the `orderly-core` store
//! ports per dialect, SQLite (the embedded default, a file and nothing else) and
//! PostgreSQL (production), with the embedded migrations of `migrations/`.
//!
//! Both dialects behave the same; the conformance suite in `orderly-testkit` proves it.
//! This crate must not depend on any queue or Azure crate.

mod error;
mod fence;
pub mod migrate;
mod outbox;
pub mod postgres;
mod queue;
mod rows;
mod shared;
pub mod sqlite;
mod statements;
mod time;

use std::sync::Arc;

/// Where the messages a state change causes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// To the store's own SQL queue, in the same transaction (the embedded default).
    #[default]
    Queue,
    /// To the transactional outbox, in the same transaction; a relay publishes them to
    /// an external transport (Azure Service Bus).
    Outbox,
}

use orderly_core::store::StateStore;
use orderly_core::{Error, Result, TimeSource, ValidationError};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// Opens the store a URL names, running pending migrations first:
/// `sqlite://path/to/file.db` (created if missing), `sqlite::memory:`, or
/// `postgres://user@host:port/database`.
pub async fn open(url: &str, time: TimeSource) -> Result<Arc<dyn StateStore>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url, time).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::open(url, time).await?))
    } else {
        Err(Error::Invalid(ValidationError::new(
            "database_url",
            "must start with sqlite: or postgres:// (the URL is not echoed: it may hold a password)",
        )))
    }
}
