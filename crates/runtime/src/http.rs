//! How every orderly HTTP listener (the operations endpoints, the submitter's intake,
//! the dashboard) serves: bounded, so a slow or hostile client cannot hold it.
//!
//! - a request's headers must arrive within `ORDERLY_HTTP_HEADER_TIMEOUT_MS` (10 s), on
//!   a new connection and between the requests of a kept-alive one: a half-sent
//!   request (slowloris) or an idle connection is closed then;
//! - a request, its body included, is answered within `ORDERLY_HTTP_REQUEST_TIMEOUT_MS`
//!   (60 s), or gets 408;
//! - at most `ORDERLY_HTTP_MAX_CONNECTIONS` (256) connections at once: one more is
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
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            max_connections: 256,
        }
    }
}

impl Limits {
    /// The bounds from the environment (the defaults where a variable is unset); a bad
    /// value is refused, naming the variable.
    pub fn from_env() -> anyhow::Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let d = Self::default();
        let number =
            |name: &str, default: u64, range: std::ops::RangeInclusive<u64>| match get(name) {
                None => Ok(default),
                Some(raw) => raw
                    .trim()
                    .parse::<u64>()
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
            max_connections: usize::try_from(number(
                "ORDERLY_HTTP_MAX_CONNECTIONS",
                d.max_connections as u64,
                1..=100_000,
            )?)
            .unwrap_or(d.max_connections),
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
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::warn!(listener = what, error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!("orderly_http_connections_refused_total", "listener" => what)
                .increment(1);
            tracing::debug!(listener = what, %peer, max = limits.max_connections, "connection refused: too many open");
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
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(listener = what, %peer, error = %e, "connection ended");
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
        assert_eq!(Limits::from_lookup(none).unwrap(), Limits::default());
        let set = |name: &str| (name == "ORDERLY_HTTP_MAX_CONNECTIONS").then(|| "8".to_owned());
        assert_eq!(Limits::from_lookup(set).unwrap().max_connections, 8);
        for bad in ["0", "-1", "ten", "100001"] {
            let e = Limits::from_lookup(|name: &str| {
                (name == "ORDERLY_HTTP_MAX_CONNECTIONS").then(|| bad.to_owned())
            })
            .unwrap_err();
            assert!(
                e.to_string().contains("ORDERLY_HTTP_MAX_CONNECTIONS"),
                "{bad}: {e}"
            );
        }
        for bad in ["5ms", "5", "11m"] {
            let e = Limits::from_lookup(|name: &str| {
                (name == "ORDERLY_HTTP_HEADER_TIMEOUT").then(|| bad.to_owned())
            })
            .unwrap_err();
            assert!(
                e.to_string().contains("ORDERLY_HTTP_HEADER_TIMEOUT"),
                "{bad}: {e}"
            );
        }
        let old =
            |name: &str| (name == "ORDERLY_HTTP_REQUEST_TIMEOUT_MS").then(|| "2500".to_owned());
        assert_eq!(
            Limits::from_lookup(old).unwrap().request_timeout,
            Duration::from_millis(2500),
            "the old name, in milliseconds, is still read"
        );
    }
}
