//! What crosses the wire between the roles and the PostgreSQL server, for the bench's
//! counters: a relay on this machine that the roles connect through, passing every
//! byte on unchanged and counting, as the server's statistics cannot, the round trips
//! (each time a client speaks again after the server answered: a statement, a
//! `BEGIN`, a `COMMIT`, a ping, a prepare), the statements (simple queries and
//! executions of prepared ones) and the commits the clients asked for.
//!
//! The relay speaks to clients in clear: it answers a request for TLS with "no" (the
//! client on the loopback then goes on in clear, as orderly does with a server on this
//! machine), and connects to the server in clear. A bench measures what the roles ask
//! of the server, not the encryption.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The counts of everything that crossed a [`Relay`] so far; subtract two to measure a
/// phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireCounts {
    /// Connections opened through the relay.
    pub connections: u64,
    /// Times a client spoke after the server had answered (or first, on a new
    /// connection): each a wait for the server.
    pub round_trips: u64,
    /// Statements run: simple queries (`Query`) and executions of a prepared
    /// statement (`Execute`).
    pub statements: u64,
    /// `COMMIT`s sent (explicit transactions that ended in a commit request).
    pub commits: u64,
    /// Statements run by their text (whitespace folded, cut to [`TEXT_SHOWN`]
    /// characters).
    pub by_text: std::collections::BTreeMap<String, u64>,
}

impl WireCounts {
    /// What was counted between `earlier` and these counts.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            connections: self.connections - earlier.connections,
            round_trips: self.round_trips - earlier.round_trips,
            statements: self.statements - earlier.statements,
            commits: self.commits - earlier.commits,
            by_text: since(&self.by_text, &earlier.by_text),
        }
    }
}

/// The counts of `now` less those of `then`, the texts counted in between.
pub fn since(
    now: &std::collections::BTreeMap<String, u64>,
    then: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    now.iter()
        .map(|(text, n)| (text.clone(), n - then.get(text).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// How much of a statement's text names it in the counts.
pub const TEXT_SHOWN: usize = 90;

/// A statement's text as counted: whitespace folded, cut to [`TEXT_SHOWN`] characters.
pub fn shown(text: &str) -> String {
    let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match folded.char_indices().nth(TEXT_SHOWN) {
        Some((at, _)) => format!("{}…", &folded[..at]),
        None => folded,
    }
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    round_trips: AtomicU64,
    statements: AtomicU64,
    commits: AtomicU64,
    by_text: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Counters {
    fn statement(&self, text: &str) {
        self.statements.fetch_add(1, Ordering::Relaxed);
        let mut by_text = self.by_text.lock().unwrap_or_else(|e| e.into_inner());
        match by_text.get_mut(text) {
            Some(n) => *n += 1,
            None => {
                by_text.insert(text.to_owned(), 1);
            }
        }
    }
}

/// A counting relay in front of one PostgreSQL server, until dropped.
pub struct Relay {
    addr: SocketAddr,
    counters: Arc<Counters>,
    stop: CancellationToken,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Relay {
    /// Starts a relay on a free port of the loopback in front of the server `url`
    /// names (`postgres://user@host:port/db`, over TCP).
    pub async fn start(url: &str) -> anyhow::Result<Self> {
        let (host, port) = server_of(url)?;
        let server = tokio::net::lookup_host((host.as_str(), port))
            .await
            .with_context(|| format!("cannot resolve the PostgreSQL server {host}:{port}"))?
            .next()
            .with_context(|| format!("the PostgreSQL server {host}:{port} has no address"))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, server, counters.clone(), stop.clone()));
        Ok(Self {
            addr,
            counters,
            stop,
        })
    }

    /// Closes the relay: every connection open through it now, and its port (a client
    /// that tries again is refused). Its counts stay readable.
    pub fn close(&self) {
        self.stop.cancel();
    }

    /// `url` with the relay in place of the server, in clear.
    pub fn url(&self, url: &str) -> anyhow::Result<String> {
        through(url, self.addr)
    }

    /// The counts so far.
    pub fn counts(&self) -> WireCounts {
        let c = &self.counters;
        WireCounts {
            connections: c.connections.load(Ordering::Relaxed),
            round_trips: c.round_trips.load(Ordering::Relaxed),
            statements: c.statements.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            by_text: c.by_text.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

/// `url` with `addr` in place of its server, in clear.
fn through(url: &str, addr: SocketAddr) -> anyhow::Result<String> {
    let (scheme, rest) = url.split_once("://").context("not a URL")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let user = authority
        .rsplit_once('@')
        .map_or(String::new(), |(user, _)| format!("{user}@"));
    let tail = if tail.contains('?') {
        format!("{tail}&sslmode=disable")
    } else {
        format!("{tail}?sslmode=disable")
    };
    Ok(format!("{scheme}://{user}{addr}{tail}"))
}

/// The host and port of a `postgres://` URL (5432 if none is given).
fn server_of(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .context("not a postgres:// URL")?;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.is_empty() {
        anyhow::bail!(
            "the bench's counters on PostgreSQL need the server's TCP address in the URL"
        );
    }
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').context("an IPv6 address without ']'")?;
            (host, after.strip_prefix(':'))
        }
        None => match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    let port = match port {
        Some(p) => p.parse().with_context(|| format!("port {p:?}"))?,
        None => 5432,
    };
    Ok((host.to_owned(), port))
}

async fn accept(
    listener: TcpListener,
    server: SocketAddr,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(e) => {
                    tracing::warn!(error = %e, "the counting relay could not accept a connection");
                    continue;
                }
            },
        };
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let (counters, stop) = (counters.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                ended = relay(client, server, &counters) => if let Err(e) = ended {
                    tracing::debug!(error = %e, "a relayed connection ended");
                },
            }
        });
    }
}

/// The protocol's code of a request for TLS, and of one for GSS encryption, in place of
/// a start-up message's version.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

async fn relay(
    mut client: TcpStream,
    server: SocketAddr,
    counters: &Arc<Counters>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    // The untyped messages first: requests for encryption (refused here) until the
    // start-up message, which goes to the server.
    let startup = loop {
        let len = client.read_u32().await?;
        if !(8..=10_000).contains(&len) {
            return Err(std::io::Error::other("not a PostgreSQL start-up message"));
        }
        let mut body = vec![0; len as usize - 4];
        client.read_exact(&mut body).await?;
        let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            client.write_all(b"N").await?;
            continue;
        }
        let mut message = len.to_be_bytes().to_vec();
        message.extend_from_slice(&body);
        break message;
    };
    let mut upstream = TcpStream::connect(server).await?;
    upstream.set_nodelay(true)?;
    counters.round_trips.fetch_add(1, Ordering::Relaxed);
    upstream.write_all(&startup).await?;
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = upstream.into_split();
    let answered = Arc::new(AtomicBool::new(false));
    let up = {
        let (answered, counters) = (answered.clone(), counters.clone());
        async move {
            let mut messages = Messages::default();
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = from_client.read(&mut buf).await?;
                if n == 0 {
                    return to_server.shutdown().await;
                }
                if answered.swap(false, Ordering::AcqRel) {
                    counters.round_trips.fetch_add(1, Ordering::Relaxed);
                }
                messages.scan(&buf[..n], &counters);
                to_server.write_all(&buf[..n]).await?;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = from_server.read(&mut buf).await?;
            if n == 0 {
                return to_client.shutdown().await;
            }
            answered.store(true, Ordering::Release);
            to_client.write_all(&buf[..n]).await?;
        }
    };
    let (up, down): (std::io::Result<()>, std::io::Result<()>) = tokio::join!(up, down);
    up.and(down)
}

/// Where the scan of a client's typed messages stands: a message is a type byte, a
/// length of four bytes (itself included), then its body. The bodies that name
/// statements are kept: a simple query (`Q`, its text), a prepare (`P`, a statement's
/// name and text), a bind (`B`, which statement the next execution runs) and an
/// execution (`E`).
#[derive(Debug, Default)]
struct Messages {
    /// The header read so far.
    header: Vec<u8>,
    /// The type of the message whose body is being passed.
    kind: u8,
    /// Bytes of its body still to pass.
    remaining: usize,
    /// Its body so far, if it is one that is kept.
    body: Vec<u8>,
    /// Prepared statements' texts by name, as counted.
    prepared: std::collections::HashMap<String, String>,
    /// The statement the last bind named.
    bound: String,
}

/// The most of a body kept (a statement longer than this is named by its start).
const BODY_KEPT: usize = 64 * 1024;

impl Messages {
    fn scan(&mut self, mut bytes: &[u8], counters: &Counters) {
        while !bytes.is_empty() {
            if self.remaining == 0 && self.header.len() < 5 {
                let take = (5 - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() < 5 {
                    return;
                }
                self.kind = self.header[0];
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                self.remaining = len.saturating_sub(4);
                self.body.clear();
                if self.remaining == 0 {
                    self.ended(counters);
                }
                continue;
            }
            let take = self.remaining.min(bytes.len());
            if matches!(self.kind, b'Q' | b'P' | b'B' | b'E') && self.body.len() < BODY_KEPT {
                let keep = (BODY_KEPT - self.body.len()).min(take);
                self.body.extend_from_slice(&bytes[..keep]);
            }
            self.remaining -= take;
            bytes = &bytes[take..];
            if self.remaining == 0 {
                self.ended(counters);
            }
        }
    }

    /// A whole message has passed.
    fn ended(&mut self, counters: &Counters) {
        let mut fields = self.body.split(|b| *b == 0);
        let mut field = || String::from_utf8_lossy(fields.next().unwrap_or_default()).into_owned();
        match self.kind {
            b'Q' => {
                let text = shown(&field());
                if text.to_ascii_uppercase().starts_with("COMMIT") {
                    counters.commits.fetch_add(1, Ordering::Relaxed);
                }
                counters.statement(&text);
            }
            b'P' => {
                let name = field();
                let text = shown(&field());
                self.prepared.insert(name, text);
            }
            b'B' => {
                let _portal = field();
                self.bound = field();
            }
            b'E' => {
                let text = self
                    .prepared
                    .get(&self.bound)
                    .map_or("(a statement prepared before)", String::as_str);
                counters.statement(text);
            }
            _ => {}
        }
        self.header.clear();
        self.body.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn statements_and_commits_are_told_apart_however_the_bytes_are_cut() {
        let mut stream = Vec::new();
        stream.extend(message(b'Q', b"BEGIN\0"));
        stream.extend(message(b'P', b"\0SELECT 1\0\0\0"));
        stream.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
        stream.extend(message(b'E', b"\0\0\0\0\0"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', b"commit\0"));
        stream.extend(message(b'Q', b"SELECT pg_current_wal_lsn()\0"));
        for cut in 1..stream.len() {
            let counters = Counters::default();
            let mut scan = Messages::default();
            for chunk in stream.chunks(cut) {
                scan.scan(chunk, &counters);
            }
            assert_eq!(counters.statements.load(Ordering::Relaxed), 4, "cut {cut}");
            assert_eq!(counters.commits.load(Ordering::Relaxed), 1, "cut {cut}");
            let by_text = counters.by_text.lock().unwrap().clone();
            assert_eq!(
                by_text.into_iter().collect::<Vec<_>>(),
                [
                    ("BEGIN".to_owned(), 1),
                    ("SELECT 1".to_owned(), 1),
                    ("SELECT pg_current_wal_lsn()".to_owned(), 1),
                    ("commit".to_owned(), 1),
                ],
                "cut {cut}"
            );
        }
    }

    #[test]
    fn the_server_is_read_from_the_url_and_the_relay_takes_its_place() {
        assert_eq!(
            server_of("postgres://postgres@127.0.0.1:5432/test").unwrap(),
            ("127.0.0.1".to_owned(), 5432)
        );
        assert_eq!(
            server_of("postgresql://u:p@db.example/x?sslmode=require").unwrap(),
            ("db.example".to_owned(), 5432)
        );
        assert_eq!(
            server_of("postgres://[::1]:6543/x").unwrap(),
            ("::1".to_owned(), 6543)
        );
        assert!(server_of("postgres:///x?host=/run/postgresql").is_err());
        let relay: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        assert_eq!(
            through("postgres://postgres@127.0.0.1:5432/test", relay).unwrap(),
            "postgres://postgres@127.0.0.1:40001/test?sslmode=disable"
        );
        assert_eq!(
            through("postgres://u:p@db:5433/x?application_name=a", relay).unwrap(),
            "postgres://u:p@127.0.0.1:40001/x?application_name=a&sslmode=disable"
        );
    }

    /// A session through the relay works as one straight to the server, and the relay
    /// counts its statements, commits and round trips exactly. Needs the PostgreSQL
    /// of the tests (`ORDERLY_TEST_POSTGRES_URL`).
    #[tokio::test]
    async fn a_session_through_the_relay_is_counted_exactly() {
        use sqlx::{Connection as _, Executor as _};
        let url = std::env::var("ORDERLY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let relay = Relay::start(&url).await.unwrap();
        let mut conn = sqlx::PgConnection::connect(&relay.url(&url).unwrap())
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is needed for this test: {e}"));
        let before = relay.counts();
        assert_eq!(before.connections, 1);
        let mut tx = conn.begin().await.unwrap();
        tx.execute("CREATE TEMP TABLE relayed (n int)")
            .await
            .unwrap();
        sqlx::query("INSERT INTO relayed VALUES ($1)")
            .bind(1_i32)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let one: i32 = sqlx::query_scalar("SELECT n FROM relayed")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(one, 1);
        let counted = relay.counts().since(&before);
        // BEGIN, CREATE, INSERT, COMMIT, SELECT.
        assert_eq!(counted.statements, 5, "{counted:?}");
        assert_eq!(counted.commits, 1, "{counted:?}");
        assert_eq!(
            counted.by_text.get("INSERT INTO relayed VALUES ($1)"),
            Some(&1),
            "a prepared statement is named by its text: {counted:?}"
        );
        // One wait each, and one more for each of the two prepared statements' first
        // use (sqlx prepares them apart).
        assert_eq!(counted.round_trips, 7, "{counted:?}");
        conn.close().await.unwrap();
        relay.close();
        assert!(
            sqlx::PgConnection::connect(&relay.url(&url).unwrap())
                .await
                .is_err(),
            "a closed relay takes no connection"
        );
        assert_eq!(relay.counts().connections, 1);
    }
}
