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
#[cfg(feature = "seed")]
pub mod seed;
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
    // After the scheme at the URL's start only: a `://` further on (in the query, say)
    // is not where the user information begins. Before, a query holding a URL hid the
    // password from this, and the driver's complaint showed it.
    let rest = match url.split_once(':') {
        Some((scheme, rest))
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c)) =>
        {
            rest.strip_prefix("//").unwrap_or(rest)
        }
        _ => url,
    };
    let mut secrets: Vec<String> = Vec::new();
    if let Some((userinfo, _)) = rest.split_once('@') {
        secrets.extend(userinfo.split(':').skip(1).map(str::to_owned));
    }
    if let Some((_, query)) = url.split_once('?') {
        secrets.extend(query.split(['&', '=', ';']).map(str::to_owned));
    }
    // The driver may quote a part decoded (`%53` as `S`): both forms go.
    let decoded: Vec<String> = secrets.iter().map(|s| percent_decoded(s)).collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    // Longest first, so a secret holding another is taken out whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for s in secrets {
        text = text.replace(&s, "<redacted>");
    }
    Error::Invalid(ValidationError::new("database_url", text))
}

/// `s` with its `%XX` escapes decoded (bytes that are not UTF-8 as U+FFFD, as a driver
/// shows them).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

#[cfg(test)]
mod url_tests {
    use super::*;

    const SECRET: &str = "Pl4ntedS3cretZq";

    fn refused(url: &str) -> String {
        let e = check_url(url).expect_err(url);
        format!("{e} {e:?}")
    }

    /// A URL in the query no longer hides the password from the redaction (found by
    /// the fuzz test: the driver quoted the rest of the URL, password and all).
    #[test]
    fn a_refused_url_never_shows_its_password_whatever_its_query_holds() {
        for url in [
            format!(
                "sqlite:orderly:{SECRET}@?%A0:{SECRET}/orderly?https://acct.blob.core.windows.net"
            ),
            format!("sqlite://orderly:{SECRET}@x:{SECRET}/o?bad=https://h&{SECRET}"),
            format!(
                "postgres://orderly:{SECRET}@host:{SECRET}/orderly?https://acct.blob.core.windows.net"
            ),
            // Escaped in the URL, quoted decoded by the driver.
            "sqlite:orderly:x@?%A0:Pl4nted%53%33cretZq/orderly?q".to_owned(),
        ] {
            let text = refused(&url);
            assert!(!text.contains(SECRET), "{url}: {text}");
            assert!(text.contains("database_url"), "{text}");
        }
    }

    #[test]
    fn escapes_are_decoded_as_a_driver_shows_them() {
        assert_eq!(percent_decoded("a%53b%zz%4"), "aSb%zz%4");
        assert_eq!(percent_decoded("%A0x"), "\u{fffd}x");
    }
}
