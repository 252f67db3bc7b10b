//! How every orderly HTTP listener (the operations endpoints, the submitter's intake,
//! the dashboard) serves: bounded, so a slow or hostile client cannot hold it.
//!
//! - a request's headers must arrive within `ORDERLY_HTTP_HEADER_TIMEOUT_MS` (10 s), on
//!   a new connection and between the requests of a kept-alive one: a half-sent
//!   request (slowloris) or an idle connection is closed then;
//! - a request, its body included, is answered within `ORDERLY_HTTP_REQUEST_TIMEOUT_MS`
//!   (60 s), or gets 408;
//! - a response that the client does not read (its writes make no progress) for
//!   `ORDERLY_HTTP_WRITE_TIMEOUT` (30 s) ends its connection, counted
//!   (`orderly_http_connections_cut_total`): a client that pipelines requests and never
//!   reads the answers holds no slot for ever;
//! - at most `ORDERLY_HTTP_MAX_CONNECTIONS` (256) connections at once, and at most
//!   `ORDERLY_HTTP_MAX_CONNECTIONS_PER_CLIENT` (64) from one address: one more is
//!   closed as soon as it is accepted, and counted
//!   (`orderly_http_connections_refused_total`).
//!
//! Bodies are capped by axum's extractors (2 MB) wherever one is read.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// The bounds of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// A request is answered within this, or gets 408.
    pub request_timeout: Duration,
    /// A response's writes may make no progress for this long, then the connection
    /// is ended.
    pub write_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections served at once from one address.
    pub max_connections_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections: 256,
            max_connections_per_client: 64,
        }
    }
}

impl Limits {
    /// The bounds from the environment (the defaults where a variable is unset); a bad
    /// value is refused, naming the variable.
    pub fn from_env() -> anyhow::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok(), Self::default())
    }

    /// [`Self::from_env`] over other defaults (a server with other needs).
    pub fn from_env_over(defaults: Self) -> anyhow::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok(), defaults)
    }

    /// The bounds of a server that stands in for the remote services in tests and
    /// demos: the same timeouts, and connection caps that every agent of a bench
    /// stays within (each agent opens up to its concurrency, 256 a queue, from this
    /// machine).
    #[must_use]
    pub fn test_service() -> Self {
        Self {
            max_connections: 16_384,
            max_connections_per_client: 16_384,
            ..Self::default()
        }
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>, d: Self) -> anyhow::Result<Self> {
        let count =
            |name: &str, default: usize, range: std::ops::RangeInclusive<usize>| match get(name) {
                None => Ok(default),
                Some(raw) => raw
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| range.contains(n))
                    .with_context(|| {
                        format!(
                            "invalid {name}: {raw:?} is not a whole number from {} to {}",
                            range.start(),
                            range.end()
                        )
                    }),
            };
        let duration =
            |name: &str, default: Duration, most: Duration| match orderly_core::duration::from_env(
                &get, name,
            )
            .map_err(anyhow::Error::msg)?
            {
                None => Ok(default),
                Some(d) if (Duration::from_millis(100)..=most).contains(&d) => Ok(d),
                Some(_) => Err(anyhow::anyhow!(
                    "invalid {name}: must be from 100ms to {}",
                    orderly_core::duration::format(most)
                )),
            };
        Ok(Self {
            header_timeout: duration(
                "ORDERLY_HTTP_HEADER_TIMEOUT",
                d.header_timeout,
                Duration::from_secs(600),
            )?,
            request_timeout: duration(
                "ORDERLY_HTTP_REQUEST_TIMEOUT",
                d.request_timeout,
                Duration::from_secs(3_600),
            )?,
            write_timeout: duration(
                "ORDERLY_HTTP_WRITE_TIMEOUT",
                d.write_timeout,
                Duration::from_secs(3_600),
            )?,
            max_connections: count(
                "ORDERLY_HTTP_MAX_CONNECTIONS",
                d.max_connections,
                1..=100_000,
            )?,
            max_connections_per_client: count(
                "ORDERLY_HTTP_MAX_CONNECTIONS_PER_CLIENT",
                d.max_connections_per_client,
                1..=100_000,
            )?,
        })
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown`, then lets the requests
/// in progress finish (up to 5 s). `what` names the listener in logs.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    what: &'static str,
    shutdown: CancellationToken,
) {
    serve_counting(listener, app, limits, what, shutdown, || {}).await;
}

/// [`serve`], calling `accepted` for every connection taken (for a server that
/// counts them, as the remote-service simulator does).
pub async fn serve_counting(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    what: &'static str,
    shutdown: CancellationToken,
    accepted: impl Fn() + Send + Sync + 'static,
) {
    let request_timeout = limits.request_timeout;
    let app = app.layer(axum::middleware::from_fn(
        move |req: Request, next: axum::middleware::Next| async move {
            match tokio::time::timeout(request_timeout, next.run(req)).await {
                Ok(response) => response,
                Err(_) => timed_out(request_timeout),
            }
        },
    ));
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let clients = Clients::new(limits.max_connections_per_client);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => break,
            next = listener.accept() => next,
        };
        let (stream, peer) = match next {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(listener = what, error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        accepted();
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!("orderly_http_connections_refused_total", "listener" => what)
                .increment(1);
            tracing::debug!(listener = what, %peer, max = limits.max_connections, "connection refused: too many open");
            drop(stream);
            continue;
        };
        let Some(client_slot) = clients.take(peer.ip()) else {
            metrics::counter!("orderly_http_connections_refused_total", "listener" => what)
                .increment(1);
            tracing::debug!(listener = what, %peer, max = limits.max_connections_per_client, "connection refused: too many open from this address");
            drop(stream);
            continue;
        };
        // Handlers may ask who connected (the dashboard believes a proxy's identity
        // headers only from the proxy's address).
        let service = hyper_util::service::TowerToHyperService::new(app.clone().map_request(
            move |req: Request<hyper::body::Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            },
        ));
        let (stream, stalled) = Watched::new(
            stream,
            Place {
                _all: permit,
                _client: client_slot,
            },
        );
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        let write_timeout = limits.write_timeout;
        tokio::spawn(async move {
            tokio::select! {
                ended = conn => if let Err(e) = ended {
                    tracing::debug!(listener = what, %peer, error = %e, "connection ended");
                },
                () = stalled.outlasts(write_timeout) => {
                    // Dropping the connection closes it.
                    metrics::counter!("orderly_http_connections_cut_total", "listener" => what, "reason" => "write_timeout")
                        .increment(1);
                    tracing::debug!(listener = what, %peer, write_timeout_ms = write_timeout.as_millis() as u64, "connection cut: the client reads nothing of its answer");
                }
            }
        });
    }
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = what,
            "requests still running 5 s after shutdown: cut"
        );
    }
}

/// The connections open per client address, each held by a [`ClientSlot`].
#[derive(Clone)]
struct Clients {
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    max: usize,
}

impl Clients {
    fn new(max: usize) -> Self {
        Self {
            open: Arc::default(),
            max,
        }
    }

    /// A slot for one more connection from `ip`, unless it has `max` open.
    fn take(&self, ip: std::net::IpAddr) -> Option<ClientSlot> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
        })
    }
}

/// One open connection of a client; given back when dropped.
struct ClientSlot {
    clients: Clients,
    ip: std::net::IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self
            .clients
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Since when a connection's writes have made no progress (`None`: they do).
#[derive(Clone, Default)]
struct Stalled(Arc<std::sync::Mutex<Option<tokio::time::Instant>>>);

impl Stalled {
    fn set(&self, pending: bool) {
        let mut since = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (pending, since.is_some()) {
            (true, false) => *since = Some(tokio::time::Instant::now()),
            (false, true) => *since = None,
            _ => {}
        }
    }

    /// Returns once the writes have made no progress for `limit`.
    async fn outlasts(&self, limit: Duration) {
        let check = (limit / 4).max(Duration::from_millis(25));
        loop {
            tokio::time::sleep(check).await;
            let since = *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if since.is_some_and(|s| s.elapsed() >= limit) {
                return;
            }
        }
    }
}

/// A connection's place among those served: in all, and from its client's address.
struct Place {
    _all: tokio::sync::OwnedSemaphorePermit,
    _client: ClientSlot,
}

/// A connection whose writes are watched: [`Stalled`] says since when one waits for
/// the client to read. It holds the connection's [`Place`] and gives it back before
/// the client can see the connection end (before the shutdown of its writes, or the
/// close): a client that connects again once it sees the close finds its place free.
/// Given back after, on a busy machine a client at its cap was refused on the next
/// connection, then counted one short a moment later.
struct Watched {
    place: Option<Place>,
    inner: tokio::net::TcpStream,
    stalled: Stalled,
}

impl Watched {
    fn new(inner: tokio::net::TcpStream, place: Place) -> (Self, Stalled) {
        let stalled = Stalled::default();
        (
            Self {
                place: Some(place),
                inner,
                stalled: stalled.clone(),
            },
            stalled,
        )
    }

    fn watch<T>(
        &self,
        poll: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        self.stalled.set(poll.is_pending());
        poll
    }
}

impl tokio::io::AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(poll)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // A socket's flush never waits: only writes say whether the client reads.
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.place = None;
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Before the socket closes (the fields are dropped after this).
        self.place = None;
    }
}

fn timed_out(limit: Duration) -> Response {
    (
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the request took longer than {} ms (ORDERLY_HTTP_REQUEST_TIMEOUT_MS)\n",
            limit.as_millis()
        ),
    )
        .into_response()
}

/// The names a server answers to, against DNS rebinding: a page from another site whose
/// name was rebound to this address sends that site's name as `Host`.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// The host of the server's public URL, if it has one.
    pub public: Option<String>,
    /// Any name (off loopback without a public URL: the token it then requires keeps
    /// a rebound page out).
    pub any: bool,
}

impl Hosts {
    /// Whether `authority` (`host[:port]`, as in `Host` or an origin) names this
    /// server: an IP address (a browser at an address, not a name, cannot be
    /// rebound), `localhost`, or the public URL's host.
    pub fn allows(&self, authority: &str) -> bool {
        if self.any {
            return true;
        }
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => authority.rsplit_once(':').map_or(authority, |(h, port)| {
                if port.chars().all(|c| c.is_ascii_digit()) {
                    h
                } else {
                    authority
                }
            }),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        host.parse::<std::net::IpAddr>().is_ok()
            || host == "localhost"
            || self.public.as_deref() == Some(host.as_str())
    }
}

/// Why [`same_site`] refuses a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SiteRefusal {
    /// Addressed to a name this server does not answer to (421): DNS rebinding, or a
    /// public name not configured.
    Host(String),
    /// A state-changing request sent by a page of another site (403): an `Origin` of
    /// another host, or `Sec-Fetch-Site: cross-site`.
    CrossSite(String),
}

/// Checks that a request is addressed to this server (`Host`, or the URI's authority)
/// and, if it changes state, that no page of another site sent it. Non-browser
/// clients send no `Origin` and pass.
pub fn same_site(
    hosts: &Hosts,
    headers: &axum::http::HeaderMap,
    uri: &axum::http::Uri,
    changes_state: bool,
) -> Result<(), SiteRefusal> {
    use axum::http::header;
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or("");
    if !hosts.allows(host) {
        return Err(SiteRefusal::Host(host.to_owned()));
    }
    if changes_state {
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let cross_origin = origin.is_some_and(|o| {
            let authority = o.split_once("://").map_or("", |(_, a)| a);
            !authority.eq_ignore_ascii_case(host) || !hosts.allows(authority)
        });
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"));
        if cross_origin || cross_site {
            return Err(SiteRefusal::CrossSite(origin.unwrap_or("-").to_owned()));
        }
    }
    Ok(())
}

/// Whether two secrets are equal, compared in constant time (a token, a CSRF value).
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Whether `headers` carry `token` as `Authorization: Bearer`.
pub fn bearer_is(headers: &axum::http::HeaderMap, token: &str) -> bool {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same_secret(given.trim(), token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_come_from_the_environment_and_a_bad_value_names_its_variable() {
        let none = |_: &str| None;
        assert_eq!(
            Limits::from_lookup(none, Limits::default()).unwrap(),
            Limits::default()
        );
        let set = |name: &str| (name == "ORDERLY_HTTP_MAX_CONNECTIONS").then(|| "8".to_owned());
        assert_eq!(
            Limits::from_lookup(set, Limits::default())
                .unwrap()
                .max_connections,
            8
        );
        for bad in ["0", "-1", "ten", "100001"] {
            let e = Limits::from_lookup(
                |name: &str| (name == "ORDERLY_HTTP_MAX_CONNECTIONS").then(|| bad.to_owned()),
                Limits::default(),
            )
            .unwrap_err();
            assert!(
                e.to_string().contains("ORDERLY_HTTP_MAX_CONNECTIONS"),
                "{bad}: {e}"
            );
        }
        for bad in ["5ms", "5", "11m"] {
            let e = Limits::from_lookup(
                |name: &str| (name == "ORDERLY_HTTP_HEADER_TIMEOUT").then(|| bad.to_owned()),
                Limits::default(),
            )
            .unwrap_err();
            assert!(
                e.to_string().contains("ORDERLY_HTTP_HEADER_TIMEOUT"),
                "{bad}: {e}"
            );
        }
        let old =
            |name: &str| (name == "ORDERLY_HTTP_REQUEST_TIMEOUT_MS").then(|| "2500".to_owned());
        assert_eq!(
            Limits::from_lookup(old, Limits::default())
                .unwrap()
                .request_timeout,
            Duration::from_millis(2500),
            "the old name, in milliseconds, is still read"
        );
        let per_client = |name: &str| {
            (name == "ORDERLY_HTTP_MAX_CONNECTIONS_PER_CLIENT").then(|| "3".to_owned())
        };
        let limits = Limits::from_lookup(per_client, Limits::test_service()).unwrap();
        assert_eq!(limits.max_connections_per_client, 3);
        assert_eq!(
            limits.max_connections,
            Limits::test_service().max_connections
        );
        let write = |name: &str| (name == "ORDERLY_HTTP_WRITE_TIMEOUT").then(|| "1s".to_owned());
        assert_eq!(
            Limits::from_lookup(write, Limits::default())
                .unwrap()
                .write_timeout,
            Duration::from_secs(1)
        );
    }

    /// A connection's place is free before its client can see the end: before the
    /// shutdown of the server's writes, and before the close of a connection cut.
    #[tokio::test]
    async fn a_connections_place_is_given_back_before_its_end_shows() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let all = Arc::new(tokio::sync::Semaphore::new(1));
        let clients = Clients::new(1);
        let ip = addr.ip();
        for shut in [true, false] {
            let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            let place = Place {
                _all: all.clone().try_acquire_owned().unwrap(),
                _client: clients.take(ip).unwrap(),
            };
            let (mut watched, _) = Watched::new(stream, place);
            assert!(clients.take(ip).is_none(), "held while open");
            assert_eq!(all.available_permits(), 0);
            // Without the shutdown, dropping the stream closes it: one or the other
            // is the first sign of the end the client gets.
            if shut {
                watched.shutdown().await.unwrap();
                assert!(clients.take(ip).is_some(), "free once shut");
                assert_eq!(all.available_permits(), 1);
            }
            drop(watched);
            assert!(clients.take(ip).is_some(), "free once closed");
            assert_eq!(all.available_permits(), 1);
        }
    }

    /// A client that has seen its connection closed may connect again at once: the
    /// connection's place (per address and in all) is given back before the client can
    /// see the close. Before, it was given back after, so a client at its cap that
    /// connected again on seeing the close was sometimes refused (or, counted one
    /// short, let past its cap a moment later).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_counts_no_more_once_its_client_sees_it_closed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 1,
            max_connections_per_client: 1,
            ..Limits::default()
        };
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, limits, "test", shutdown.clone()));
        for round in 0..200 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            // A refused connection is closed at once (or reset): nothing read.
            let _ = s.read_to_end(&mut answer).await;
            assert!(
                answer.starts_with(b"HTTP/1.1 200"),
                "round {round}: {:?}",
                String::from_utf8_lossy(&answer)
            );
        }
        shutdown.cancel();
        server.await.unwrap();
    }
}
