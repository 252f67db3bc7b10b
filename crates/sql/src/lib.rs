//! The SQL state store of orderly: one implementation of the `orderly-core` store
//! ports per dialect, SQLite (the embedded default, a file and nothing else) and
//! PostgreSQL (production), with the embedded migrations of `migrations/`.
//!
//! Both dialects behave the same; the conformance suite in `orderly-testkit` proves it.
//! This crate must not depend on any queue or Azure crate.

// `SqlStore<D>` is public, its `Driver` seam is not: the store is only ever built over
// the two dialects of this crate, and the seam may change with them.
#![allow(private_bounds)]

mod driver;
mod error;
mod fence;
pub mod migrate;
mod outbox;
pub mod postgres;
mod queue;
mod rows;
pub mod sqlite;
mod statements;
pub mod stats;
mod store;
#[cfg(test)]
mod testing;
mod time;
mod wakeups;

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

pub use orderly_core::credentials::PasswordSource;
use orderly_core::store::StateStore;
use orderly_core::{Error, Result, TimeSource, ValidationError};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;
pub use store::SqlStore;

/// A state store and the SQL queue in the same database, opened together.
#[derive(Clone)]
pub struct Backend {
    /// The state store.
    pub store: Arc<dyn StateStore>,
    /// The embedded queue in the same database.
    pub transport: Arc<dyn orderly_core::transport::Transport>,
    /// The queue's depths and dead letters, for operators.
    pub inspector: Arc<dyn orderly_core::transport::QueueInspector>,
    /// The store's outbox (used with an external transport): its dead letters, for
    /// operators.
    pub outbox: Arc<dyn orderly_core::transport::Outbox>,
    /// What the store did: write transactions, batch sizes per stage.
    pub stats: Arc<stats::Stats>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").finish_non_exhaustive()
    }
}

/// Opens the store and the SQL queue a URL names (see [`open`]), running pending
/// migrations first.
pub async fn connect(url: &str, time: TimeSource) -> Result<Backend> {
    open_backend(url, time, true, None).await
}

/// [`connect`], PostgreSQL's password taken from `password` (an Entra ID token,
/// renewed before it expires) instead of the URL when given. SQLite takes none.
pub async fn connect_with(
    url: &str,
    time: TimeSource,
    password: Option<Arc<dyn PasswordSource>>,
) -> Result<Backend> {
    open_backend(url, time, true, password).await
}

/// [`connect`], with none of the handle's statements logged (`sqlx::query` events): a
/// tool's own reads beside the roles (the bench's), kept out of a count of the roles'
/// statements taken from those events.
pub async fn connect_unlogged(url: &str, time: TimeSource) -> Result<Backend> {
    open_backend(url, time, false, None).await
}

async fn open_backend(
    url: &str,
    time: TimeSource,
    logged: bool,
    password: Option<Arc<dyn PasswordSource>>,
) -> Result<Backend> {
    if url.starts_with("sqlite:") {
        no_password_for_sqlite(&password)?;
        let store = if logged {
            SqliteStore::open(url, time).await?
        } else {
            SqliteStore::open_unlogged(url, time).await?
        };
        let stats = store.stats();
        Ok(backend(Arc::new(store), stats))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        use sqlx::ConnectOptions as _;
        let store = PgStore::open_options(url, time, password, |options| {
            if logged {
                options
            } else {
                options.disable_statement_logging()
            }
        })
        .await?;
        let stats = store.stats();
        Ok(backend(Arc::new(store), stats))
    } else {
        Err(bad_url())
    }
}

/// One store handle in every part a [`Backend`] has.
fn backend<S>(store: Arc<S>, stats: Arc<stats::Stats>) -> Backend
where
    S: StateStore
        + orderly_core::transport::Transport
        + orderly_core::transport::QueueInspector
        + orderly_core::transport::Outbox
        + 'static,
{
    Backend {
        store: store.clone(),
        transport: store.clone(),
        inspector: store.clone(),
        stats,
        outbox: store,
    }
}

/// Checks a state-store URL without connecting: its scheme, and that the dialect can
/// parse it (on SQLite, the `synchronous` durability too). Errors name `database_url`,
/// never echo the URL.
pub fn check_url(url: &str) -> Result<()> {
    if url.starts_with("sqlite:") {
        sqlite::check_url(url)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres::options(url)?;
        postgres::answer_timeout_from_env().map(drop)
    } else {
        Err(bad_url())
    }
}

/// The driver's complaint about `url` for the `database_url` setting, with every part
/// of the URL that may hold a secret (the password, the query's names and values)
/// taken out of it: the driver's text is kept for what it says is wrong.
pub(crate) fn url_refused(url: &str, complaint: impl std::fmt::Display) -> Error {
    let mut text = complaint.to_string();
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.strip_prefix("sqlite:").unwrap_or(rest);
    let mut secrets: Vec<&str> = Vec::new();
    if let Some((userinfo, _)) = rest.split_once('@') {
        secrets.extend(userinfo.split(':').skip(1));
    }
    if let Some((_, query)) = url.split_once('?') {
        secrets.extend(query.split(['&', '=', ';']));
    }
    secrets.retain(|s| !s.is_empty());
    // Longest first, so a secret holding another is taken out whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in secrets {
        text = text.replace(s, "<redacted>");
    }
    Error::Invalid(ValidationError::new("database_url", text))
}

fn bad_url() -> Error {
    Error::Invalid(ValidationError::new(
        "database_url",
        "must start with sqlite: or postgres:// (the URL is not echoed: it may hold a password)",
    ))
}

/// A state store whose messages go to its transactional outbox, for an external
/// transport (Azure Service Bus), and the outbox a relay publishes from.
#[derive(Clone)]
pub struct OutboxBackend {
    /// The state store (writes its messages to the outbox in each transaction).
    pub store: Arc<dyn StateStore>,
    /// The outbox, for the relay.
    pub outbox: Arc<dyn orderly_core::transport::Outbox>,
    /// What the store did: write transactions, batch sizes per stage.
    pub stats: Arc<stats::Stats>,
}

/// A changing password is PostgreSQL's (Azure Database for PostgreSQL's Entra ID
/// tokens): refused for SQLite, naming the setting.
fn no_password_for_sqlite(password: &Option<Arc<dyn PasswordSource>>) -> Result<()> {
    match password {
        Some(_) => Err(Error::Invalid(ValidationError::new(
            "--database-credential / ORDERLY_DATABASE_CREDENTIAL",
            "applies to PostgreSQL only (the URL names SQLite)",
        ))),
        None => Ok(()),
    }
}

/// Opens the store a URL names (see [`open`]) with [`Delivery::Outbox`].
pub async fn connect_outbox(url: &str, time: TimeSource) -> Result<OutboxBackend> {
    connect_outbox_with(url, time, None).await
}

/// [`connect_outbox`], PostgreSQL's password from `password` when given (see
/// [`connect_with`]).
pub async fn connect_outbox_with(
    url: &str,
    time: TimeSource,
    password: Option<Arc<dyn PasswordSource>>,
) -> Result<OutboxBackend> {
    if url.starts_with("sqlite:") {
        no_password_for_sqlite(&password)?;
        let store = Arc::new(
            SqliteStore::open(url, time)
                .await?
                .with_delivery(Delivery::Outbox),
        );
        Ok(OutboxBackend {
            store: store.clone(),
            stats: store.stats(),
            outbox: store,
        })
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = Arc::new(
            PgStore::open_with(url, time, password)
                .await?
                .with_delivery(Delivery::Outbox),
        );
        Ok(OutboxBackend {
            store: store.clone(),
            stats: store.stats(),
            outbox: store,
        })
    } else {
        Err(bad_url())
    }
}

/// Opens the store a URL names, running pending migrations first:
/// `sqlite://path/to/file.db` (created if missing), `sqlite::memory:`, or
/// `postgres://user@host:port/database`.
pub async fn open(url: &str, time: TimeSource) -> Result<Arc<dyn StateStore>> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url, time).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::open(url, time).await?))
    } else {
        Err(bad_url())
    }
}
