//! A connection of the pool whose every answer is waited for a bounded time.
//!
//! A connection can go silent without breaking: a partition that drops every packet,
//! a middlebox that swallows them, a server host frozen. Nothing is reset, so sqlx
//! waits for the answer for ever (or for the kernel's retransmission limit, about
//! 15 min on Linux), the role that asked waits with it and logs nothing, and the pool's
//! own check on the connection's return would wait too, holding the slot. Here each
//! statement's answer is waited for at most the answer timeout; past it the statement
//! fails as the database being unavailable (the caller retries with back-off, as for
//! any outage) and the connection is marked lost: dropped, it is detached from the pool
//! and closed without a word to the server (which ends the session and its transaction
//! when it notices), never handed back. Scripts (migrations, the leader's vacuums) are
//! not bounded: they may run long.

use std::future::Future;
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres};
use sqlx_core::transaction::TransactionManager;

/// How sqlx opens, commits and rolls back PostgreSQL transactions.
pub(super) type Transactions = <Postgres as sqlx::Database>::TransactionManager;

/// The setting of the answer timeout, a duration (`60s`; its old form
/// `ORDERLY_DATABASE_ANSWER_TIMEOUT_MS`, in milliseconds, is read with a warning).
pub const ANSWER_TIMEOUT_SETTING: &str = "ORDERLY_DATABASE_ANSWER_TIMEOUT";

/// How long an answer is waited for unless [`ANSWER_TIMEOUT_SETTING`] says otherwise:
/// twice the longest a lock is waited for (`lock_timeout`), so a statement that waits
/// on a busy row fails on the server first.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The shortest answer timeout allowed.
const MIN_ANSWER_TIMEOUT: Duration = Duration::from_millis(100);

/// The answer timeout: [`ANSWER_TIMEOUT_SETTING`] if set (at least 100 ms), else
/// [`DEFAULT_ANSWER_TIMEOUT`]. A value that is not one stops start-up naming the
/// setting.
pub fn answer_timeout_from_env() -> orderly_core::Result<Duration> {
    answer_timeout(|name| std::env::var(name).ok())
}

fn answer_timeout(get: impl Fn(&str) -> Option<String>) -> orderly_core::Result<Duration> {
    match orderly_core::duration::from_env(get, ANSWER_TIMEOUT_SETTING) {
        Ok(None) => Ok(DEFAULT_ANSWER_TIMEOUT),
        Ok(Some(d)) if d >= MIN_ANSWER_TIMEOUT => Ok(d),
        Ok(Some(_)) => Err(refused("must be at least 100ms")),
        Err(e) => Err(refused(&e)),
    }
}

fn refused(why: &str) -> orderly_core::Error {
    orderly_core::ValidationError::new(ANSWER_TIMEOUT_SETTING, why.to_owned()).into()
}

/// One pool, and how many of its connections are out of it, as [`PgConn`]s or held by
/// the queue listener.
#[derive(Debug)]
pub(super) struct Generation {
    pub(super) pool: PgPool,
    out: AtomicUsize,
}

/// The pool in use, replaced when connections stick in it.
///
/// sqlx checks every connection handed back to its pool with a ping it waits for
/// without a bound. A connection that goes silent at that moment (its last statement
/// was answered, its ping is not) holds its place in the pool for as long as the
/// silence lasts: for ever behind a proxy that keeps the socket open. When
/// the pool times out and some of its places are held by connections neither idle nor
/// out (so stuck in that check), a new pool takes over; the old one is closed, and
/// what comes back to it is closed too.
#[derive(Debug)]
pub(super) struct Pools {
    /// Each generation lives as long as the process: a pool handle is small, a
    /// replacement rare (one per stuck pool), and callers may hold `&PgPool`.
    current: RwLock<&'static Generation>,
    builder: PgPoolOptions,
    /// How new connections are opened (its password changes when it is a token).
    connect: RwLock<PgConnectOptions>,
}

impl Pools {
    pub(super) fn new(pool: PgPool, builder: PgPoolOptions, connect: PgConnectOptions) -> Self {
        Self {
            current: RwLock::new(Self::leak(pool)),
            builder,
            connect: RwLock::new(connect),
        }
    }

    /// New connections, of this pool and of any that replaces it, open with `secret`;
    /// those open stay as they are (a password is checked when a session starts).
    fn set_password(&self, secret: &str) {
        let mut connect = self.connect.write().unwrap_or_else(|e| e.into_inner());
        *connect = connect.clone().password(secret);
        self.current().pool.set_connect_options(connect.clone());
    }

    /// Renews the password from `source` before each one expires (the first expires at
    /// `expires_at`), for as long as these pools are in use. A failure is logged when it
    /// starts or its cause changes, and retried with back-off (1 s doubling to 30 s)
    /// while the connections already open go on.
    pub(super) fn keep_password(
        self: &std::sync::Arc<Self>,
        source: std::sync::Arc<dyn orderly_core::credentials::PasswordSource>,
        expires_at: std::time::SystemTime,
    ) {
        const RETRY_MIN: Duration = Duration::from_secs(1);
        const RETRY_MAX: Duration = Duration::from_secs(30);
        let pools = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            let mut wait =
                orderly_core::credentials::renew_in(expires_at, std::time::SystemTime::now());
            let mut retry = RETRY_MIN;
            let mut failing: Option<String> = None;
            loop {
                tokio::time::sleep(wait).await;
                let Some(pools) = pools.upgrade() else {
                    return; // the store is gone
                };
                match source.password().await {
                    Ok(password) => {
                        pools.set_password(password.secret());
                        if failing.take().is_some() {
                            tracing::info!(source = %source.describe(), "database password renewed again");
                        }
                        retry = RETRY_MIN;
                        wait = orderly_core::credentials::renew_in(
                            password.expires_at,
                            std::time::SystemTime::now(),
                        );
                    }
                    Err(cause) => {
                        if failing.as_deref() != Some(cause.as_str()) {
                            tracing::warn!(
                                source = %source.describe(),
                                cause = %cause,
                                "cannot renew the database password; the open connections go on, new ones fail once it expires"
                            );
                            failing = Some(cause);
                        }
                        wait = retry;
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
            }
        });
    }

    fn leak(pool: PgPool) -> &'static Generation {
        Box::leak(Box::new(Generation {
            pool,
            out: AtomicUsize::new(0),
        }))
    }

    pub(super) fn current(&self) -> &'static Generation {
        *self.current.read().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection of the current pool, answering within `bound`.
    pub(super) async fn acquire(&self, bound: Duration) -> Result<PgConn, sqlx::Error> {
        let generation = self.current();
        match generation.pool.acquire().await {
            Ok(conn) => Ok(PgConn::new(conn, bound, generation)),
            Err(sqlx::Error::PoolTimedOut) => {
                self.unstick(generation);
                Err(sqlx::Error::PoolTimedOut)
            }
            Err(e) => Err(e),
        }
    }

    /// Counts a connection `generation`'s pool gave to someone else (the listener)
    /// until the returned guard is dropped.
    pub(super) fn lend(generation: &'static Generation) -> Lent {
        generation.out.fetch_add(1, Ordering::AcqRel);
        Lent(generation)
    }

    /// After `generation`'s pool timed out: replaces it if some of its places are
    /// held by connections neither idle nor out.
    fn unstick(&self, generation: &'static Generation) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if !std::ptr::eq(*current, generation) {
            return; // replaced already
        }
        let pool = &generation.pool;
        let stuck = (pool.size() as usize)
            .saturating_sub(pool.num_idle())
            .saturating_sub(generation.out.load(Ordering::Acquire));
        if stuck == 0 {
            return; // every place is in use: a busy pool, not a stuck one
        }
        tracing::warn!(
            stuck,
            "connections to PostgreSQL stuck in the pool's check (a silent network); \
             a new pool replaces it"
        );
        let connect = self
            .connect
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        *current = Self::leak(self.builder.clone().connect_lazy_with(connect));
        let old = pool.clone();
        tokio::spawn(async move { old.close().await });
    }
}

/// A connection counted as out of its pool until dropped.
#[derive(Debug)]
pub(super) struct Lent(&'static Generation);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.out.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A pooled connection, inside a transaction or not, whose answers are bounded.
pub struct PgConn {
    /// `None` only while being dropped.
    conn: Option<PoolConnection<Postgres>>,
    _out: Lent,
    /// A statement went unanswered past the bound: the connection's state is unknown.
    lost: bool,
    bound: Duration,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn")
            .field("lost", &self.lost)
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

/// What bounds one answer: the connection's mark, set when it does not come.
pub(super) struct Watch<'a> {
    lost: &'a mut bool,
    bound: Duration,
}

impl PgConn {
    pub(super) fn new(
        conn: PoolConnection<Postgres>,
        bound: Duration,
        generation: &'static Generation,
    ) -> Self {
        Self {
            conn: Some(conn),
            _out: Pools::lend(generation),
            lost: false,
            bound,
        }
    }

    /// The connection to run a statement on, and the watch to await its answer with.
    pub(super) fn parts(&mut self) -> (&mut PgConnection, Watch<'_>) {
        let conn = self.conn.as_mut().expect("a connection until dropped");
        (
            &mut **conn,
            Watch {
                lost: &mut self.lost,
                bound: self.bound,
            },
        )
    }

    /// The connection, unbounded: for scripts, which may run long.
    pub(super) fn unbounded(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("a connection until dropped")
    }

    /// Whether a statement on it went unanswered past the bound.
    pub fn is_lost(&self) -> bool {
        self.lost
    }
}

/// `.within(watch)` on a statement's answer: [`Watch::answer`].
pub(super) trait Within<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    fn within(self, watch: Watch<'_>) -> impl Future<Output = Result<T, sqlx::Error>> {
        watch.answer(self)
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Within<T> for F {}

impl Watch<'_> {
    /// `answer`, if it comes within the bound; else the connection is marked lost and
    /// the statement fails as an outage would.
    pub(super) async fn answer<T>(
        self,
        answer: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        match tokio::time::timeout(self.bound, answer).await {
            Ok(answered) => answered,
            Err(_) => {
                *self.lost = true;
                Err(unanswered(self.bound))
            }
        }
    }
}

/// The error of a statement (or a connection's check) the database did not answer
/// within `bound`, said in the log here, whoever asked: a caller that retries quietly
/// (a view read again later, a look at a queue, the pool's check of an idle
/// connection) would otherwise leave no trace of an unreachable database.
pub(super) fn unanswered(bound: Duration) -> sqlx::Error {
    let text = format!(
        "the database did not answer within {} ms ({ANSWER_TIMEOUT_SETTING}); \
         the connection is given up",
        bound.as_millis()
    );
    tracing::warn!(answer_timeout_ms = bound.as_millis() as u64, "{text}");
    sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, text))
}

impl Drop for PgConn {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.lost {
            // Out of the pool at once (a replacement may be opened), and closed by
            // dropping it: no goodbye to wait for. Handed back, the pool would wait
            // for its answer to a check.
            drop(conn.detach());
        } else if Transactions::get_transaction_depth(&conn) > 0 {
            // Sent ahead of the connection's next statement (the pool's check on its
            // return), as sqlx does for a transaction dropped unfinished.
            Transactions::start_rollback(&mut conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_timeout_is_a_duration_of_at_least_100ms_its_old_form_still_read() {
        let one = |name: &'static str, value: &'static str| {
            move |n: &str| (n == name).then(|| value.to_owned())
        };
        assert_eq!(
            answer_timeout(|_: &str| None).unwrap(),
            DEFAULT_ANSWER_TIMEOUT
        );
        assert_eq!(
            answer_timeout(one(ANSWER_TIMEOUT_SETTING, "2500ms")).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(
            answer_timeout(one("ORDERLY_DATABASE_ANSWER_TIMEOUT_MS", " 60000 ")).unwrap(),
            DEFAULT_ANSWER_TIMEOUT
        );
        for bad in ["", "abc", "1.5s", "-1s", "99ms", "0", "60"] {
            let e = answer_timeout(one(ANSWER_TIMEOUT_SETTING, bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains(ANSWER_TIMEOUT_SETTING), "{bad:?}: {e}");
        }
        let e = answer_timeout(one("ORDERLY_DATABASE_ANSWER_TIMEOUT_MS", "99"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(ANSWER_TIMEOUT_SETTING), "{e}");
    }
}
