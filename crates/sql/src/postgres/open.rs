//! Opening a PostgreSQL store: the URL's options and TLS, the limits of every
//! session, the pool, and a begin that runs to its answer.

use super::conn::{Pools, Transactions, Within};
use super::{DEFAULT_MAX_CONNECTIONS, POLL, PgConn, PgDriver, answer_timeout_from_env};
use crate::error::db;
use crate::store::SqlStore;
use crate::wakeups::Wakeups;
use orderly_core::credentials::PasswordSource;
use orderly_core::{Result, TimeSource};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx_core::transaction::TransactionManager;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// An idle connection older than this is pinged before it is handed out.
pub(super) const PING_IDLE: Duration = Duration::from_secs(1);

/// Takes a connection and runs `begin` (`BEGIN` unless given) on it, to its answer
/// even if the caller stops waiting. sqlx 0.9 arms the rollback of a transaction
/// dropped unfinished only once its `BEGIN` is answered: a begin abandoned before then
/// (a shutdown, a timeout, a `select!` that took another branch) would hand the pool a
/// connection inside a transaction nothing ends, and its next users' statements would
/// run in it, holding their locks and committing nothing. Run on a task of its own,
/// the begin finishes (or its answer times out and the connection is given up); a
/// transaction nobody takes is then dropped there, armed, and its rollback goes with
/// the connection's next statement.
pub(super) async fn begin_to_the_end(
    pools: Arc<Pools>,
    answer_timeout: Duration,
    begin: Option<&'static str>,
) -> Result<Box<PgConn>> {
    let begun = tokio::spawn(async move {
        let mut conn = Box::new(pools.acquire(answer_timeout).await?);
        let (raw, watch) = conn.parts();
        Transactions::begin(raw, begin.map(sqlx::SqlSafeStr::into_sql_str))
            .within(watch)
            .await?;
        Ok::<_, sqlx::Error>(conn)
    });
    match begun.await {
        Ok(tx) => tx.map_err(db),
        // Its task panicked, or the runtime is shutting down.
        Err(e) => Err(orderly_core::Error::Unavailable(Box::new(e))),
    }
}

/// The connection options of `url`. TLS follows the URL's `sslmode` (or `PGSSLMODE`):
/// `disable`, `prefer`, `require`, `verify-ca`, `verify-full` as libpq. Where neither
/// names one, a server on this machine (loopback or a Unix socket) gets `prefer` here
/// (and [`SqlStore::open`] goes plain to it unless it refuses plain: see
/// [`plain_on_this_machine`]), and any other `verify-full`: a server across a network is
/// checked against its certificate and name, never silently reached in clear or through
/// an impostor. The server is verified against the platform's roots plus `sslrootcert`,
/// or else the CA bundle `ORDERLY_CA_FILE` names. Errors name the setting, never echo
/// the URL.
pub fn options(url: &str) -> Result<PgConnectOptions> {
    let mut options = PgConnectOptions::from_str(url).map_err(|e| crate::url_refused(url, e))?;
    if !sslmode_chosen(url) && !on_this_machine(&options) {
        options = options.ssl_mode(PgSslMode::VerifyFull);
    }
    // Every session is bounded, so that a wedged one never hangs a role: unless the URL
    // (`?options=-c%20lock_timeout%3D...`) or PGOPTIONS sets them.
    let given = format!("{url} {}", std::env::var("PGOPTIONS").unwrap_or_default());
    let limits: Vec<(&str, &str)> = SESSION_LIMITS
        .iter()
        .filter(|(name, _)| !given.contains(name))
        .copied()
        .collect();
    if !limits.is_empty() {
        options = options.options(limits);
    }
    let names_root = url.contains("sslrootcert=") || std::env::var_os("PGSSLROOTCERT").is_some();
    if names_root {
        return Ok(options);
    }
    let trust = orderly_tls::Trust::from_env()
        .map_err(|e| orderly_core::ValidationError::new("ORDERLY_CA_FILE", e.to_string()))?;
    Ok(match trust.ca_file() {
        Some(file) => options.ssl_root_cert(file),
        None => options,
    })
}

/// Whether the URL or the environment chose a `sslmode`.
fn sslmode_chosen(url: &str) -> bool {
    query_names(url, &["sslmode", "ssl-mode"])
        || std::env::var_os("PGSSLMODE").is_some_and(|v| !v.is_empty())
}

/// For a server on this machine whose URL chose no `sslmode`: plain, unless the server
/// refuses a plain connection (its pg_hba.conf asks for TLS), then `prefer`. Traffic
/// over loopback or a socket never leaves the machine, and TLS there costs every round
/// trip (measured: PostgreSQL paced p50 at 500 orders/s 17-19 ms plain, 19-27 ms with
/// TLS, and 10-15% more CPU per order on both sides). Any other outcome of the probe
/// (the server down, a wrong password) keeps `prefer`, and the connection that follows
/// reports it.
pub async fn plain_on_this_machine(url: &str, options: PgConnectOptions) -> PgConnectOptions {
    if sslmode_chosen(url) || !on_this_machine(&options) {
        return options;
    }
    let plain = options.clone().ssl_mode(PgSslMode::Disable);
    let probe = tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::ConnectOptions::connect(&plain),
    )
    .await;
    match probe {
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
            plain
        }
        _ => options,
    }
}

/// Whether the query of `url` names one of `keys`.
fn query_names(url: &str, keys: &[&str]) -> bool {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    query
        .split('&')
        .filter_map(|pair| pair.split('=').next())
        .any(|key| keys.contains(&key))
}

/// Whether the server of `options` is on this machine: a Unix socket, `localhost` or a
/// loopback address.
fn on_this_machine(options: &PgConnectOptions) -> bool {
    if options.get_socket().is_some() {
        return true;
    }
    let host = options.get_host();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.starts_with('/')
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The limits of every session orderly opens, unless the URL or PGOPTIONS sets them: a
/// lock is waited for at most 30 s (a row held by a wedged session fails the statement,
/// which is retried, instead of hanging it), a session idle inside a transaction is
/// ended after 60 s (its locks go with it), and a statement runs at most 5 min (the
/// leader's vacuums lift this for themselves).
pub const SESSION_LIMITS: [(&str, &str); 3] = [
    ("lock_timeout", "30s"),
    ("idle_in_transaction_session_timeout", "60s"),
    ("statement_timeout", "5min"),
];

/// The first password of `source`, or the error that names it.
pub(crate) async fn first_password(
    source: &dyn PasswordSource,
) -> Result<orderly_core::credentials::Password> {
    source.password().await.map_err(|cause| {
        orderly_core::Error::Unavailable(
            format!(
                "cannot get the database password from {} (--database-credential / ORDERLY_DATABASE_CREDENTIAL): {cause}",
                source.describe()
            )
            .into(),
        )
    })
}

impl SqlStore<PgDriver> {
    /// Connects to `url` (`postgres://user@host:port/db`) and applies pending migrations.
    pub async fn open(url: &str, time: TimeSource) -> Result<Self> {
        Self::open_with(url, time, None).await
    }

    /// [`Self::open`], with the password from `password` instead of the URL's when
    /// given (an Entra ID token), renewed before it expires.
    pub async fn open_with(
        url: &str,
        time: TimeSource,
        password: Option<Arc<dyn PasswordSource>>,
    ) -> Result<Self> {
        Self::open_options(url, time, password, |o| o).await
    }

    /// [`Self::open_with`], its connection options changed by `adjust` first.
    pub(crate) async fn open_options(
        url: &str,
        time: TimeSource,
        password: Option<Arc<dyn PasswordSource>>,
        adjust: impl FnOnce(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<Self> {
        let mut options = adjust(options(url)?);
        let first = match &password {
            Some(source) => Some(first_password(source.as_ref()).await?),
            None => None,
        };
        if let Some(first) = &first {
            options = options.password(first.secret());
        }
        let options = plain_on_this_machine(url, options).await;
        let store = Self::connect(options, DEFAULT_MAX_CONNECTIONS, time).await?;
        if let (Some(source), Some(first)) = (password, first) {
            store.driver.pools.keep_password(source, first.expires_at);
        }
        Ok(store)
    }

    /// Connects with explicit options (e.g. a `search_path` for an isolated schema) and
    /// applies pending migrations.
    pub async fn connect(
        options: PgConnectOptions,
        max_connections: u32,
        time: TimeSource,
    ) -> Result<Self> {
        let answer_timeout = answer_timeout_from_env()?;
        Self::connect_answering_within(options, max_connections, time, answer_timeout).await
    }

    /// [`Self::connect`], waiting for any answer at most `answer_timeout` (instead of
    /// what [`ANSWER_TIMEOUT_SETTING`] says).
    pub async fn connect_answering_within(
        options: PgConnectOptions,
        max_connections: u32,
        time: TimeSource,
        answer_timeout: Duration,
    ) -> Result<Self> {
        // A connection is checked with a ping only after it sat idle for a while: a
        // ping on every acquire is a round trip per transaction under load. One that
        // broke while busy fails its statement, which the caller retries.
        let builder = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(15))
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    // Bounded like any answer: a connection gone silent while idle
                    // is closed here, not waited on.
                    if meta.idle_for >= PING_IDLE {
                        tokio::time::timeout(answer_timeout, sqlx::Connection::ping(conn))
                            .await
                            .map_err(|_| super::conn::unanswered(answer_timeout))??;
                    }
                    Ok(true)
                })
            });
        // No check of our own on the way back: the pool pings every connection handed
        // back itself (unbounded), and a second, bounded ping before it cost a round
        // trip per transaction (a quarter of all round trips under a steady load)
        // while closing only the window of that one round trip. A connection that goes
        // silent in the pool's ping holds its place until the pool, timed out, is
        // replaced (`Pools`).
        let options = options.application_name("orderly");
        let pool = builder
            .clone()
            .connect_with(options.clone())
            .await
            .map_err(db)?;
        let store = SqlStore::new(
            PgDriver {
                pools: Arc::new(Pools::new(pool, builder, options)),
                time,
                stats: Arc::default(),
                answer_timeout,
            },
            Arc::new(Wakeups::new(POLL)),
        );
        store.migrate().await?;
        Ok(store)
    }

    /// The connection pool (for tests and tools).
    pub fn pool(&self) -> &PgPool {
        &self.driver.pools.current().pool
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mode(url: &str) -> PgSslMode {
        options(url).unwrap().get_ssl_mode()
    }

    #[test]
    fn a_server_across_the_network_is_verified_unless_the_url_says_otherwise() {
        if std::env::var_os("PGSSLMODE").is_some() {
            // The environment chose for every URL; what this case checks does not apply.
            return;
        }
        for url in [
            "postgres://orderly@db.example.com:5432/orderly",
            "postgres://orderly@10.0.0.4/orderly",
            "postgres://orderly@postgres/orderly?application_name=x",
            "postgres://orderly@[2001:db8::1]/orderly",
        ] {
            assert!(matches!(mode(url), PgSslMode::VerifyFull), "{url}");
        }
        for url in [
            "postgres://postgres@127.0.0.1:5432/test",
            "postgres://postgres@localhost/test",
            "postgres://postgres@[::1]/test",
            "postgres://postgres@%2Fvar%2Frun%2Fpostgresql/test",
        ] {
            assert!(matches!(mode(url), PgSslMode::Prefer), "{url}");
        }
        assert!(matches!(
            mode("postgres://orderly@postgres/orderly?sslmode=disable"),
            PgSslMode::Disable
        ));
        assert!(matches!(
            mode("postgres://orderly@db.example.com/orderly?ssl-mode=require"),
            PgSslMode::Require
        ));
        assert!(matches!(
            mode("postgres://postgres@127.0.0.1/test?sslmode=verify-full"),
            PgSslMode::VerifyFull
        ));
    }

    /// On the test server (on loopback, offering TLS), a URL without sslmode is reached
    /// in plain: every connection of the opened store is unencrypted, as the server sees.
    #[tokio::test]
    async fn a_server_on_this_machine_is_reached_in_plain_when_it_takes_plain() {
        if std::env::var_os("PGSSLMODE").is_some() {
            return;
        }
        let url = std::env::var("ORDERLY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let base = options(&url).unwrap();
        let chosen = plain_on_this_machine(&url, base).await;
        assert!(matches!(chosen.get_ssl_mode(), PgSslMode::Disable));
        let mut conn = sqlx::ConnectOptions::connect(&chosen).await.unwrap();
        let ssl: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&mut conn)
                .await
                .unwrap();
        assert!(!ssl, "encrypted over loopback");
        // A URL that names its sslmode keeps it.
        let named = format!(
            "{url}{}sslmode=require",
            if url.contains('?') { '&' } else { '?' }
        );
        let kept = plain_on_this_machine(&named, options(&named).unwrap()).await;
        assert!(matches!(kept.get_ssl_mode(), PgSslMode::Require));
    }
}
