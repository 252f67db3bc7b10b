//! Who may use the dashboard: the token (off loopback), its cookie, and the guard
//! every page and action passes.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::Dash;

pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Who acts, as the last action's form said (`dashboard` until one did).
pub(super) fn operator(headers: &HeaderMap) -> String {
    cookie(headers, "orderly_operator")
        .filter(|n| !n.is_empty())
        .unwrap_or("dashboard")
        .to_owned()
}

/// Constant-time comparison of two secrets.
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The names the dashboard answers to.
#[derive(Debug, Clone)]
pub(super) struct Hosts {
    /// The host of its public URL, if it has one.
    pub(super) public: Option<String>,
    /// Any name (off loopback without a public URL).
    pub(super) any: bool,
}

impl Hosts {
    /// Whether `authority` (`host[:port]`, as in `Host` or an origin) names this
    /// dashboard: an IP address (a browser at an address, not a name, cannot be
    /// rebound), `localhost`, or the public URL's host.
    pub(super) fn allows(&self, authority: &str) -> bool {
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

/// Refuses requests not addressed to this dashboard (a `Host` it does not answer to:
/// 421) and state-changing requests sent by another site (an `Origin` of another host,
/// or `Sec-Fetch-Site: cross-site`: 403). The probes are served apart and not checked.
pub(super) async fn same_site(State(dash): State<Dash>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    if !dash.hosts.allows(host) {
        tracing::warn!(host, path = %req.uri().path(), "refused: a Host this dashboard does not answer to (DNS rebinding?)");
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard does not answer to that host name; set --public-url / ORDERLY_DASHBOARD_PUBLIC_URL to the name it is reached by\n",
        )
            .into_response();
    }
    let reads = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if !reads {
        let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let cross_origin = origin.is_some_and(|o| {
            let authority = o.split_once("://").map_or("", |(_, a)| a);
            !authority.eq_ignore_ascii_case(host) || !dash.hosts.allows(authority)
        });
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"));
        if cross_origin || cross_site {
            tracing::warn!(origin = origin.unwrap_or("-"), host, path = %req.uri().path(), "refused: a state-changing request from another site");
            return (
                StatusCode::FORBIDDEN,
                "refused: this request comes from another site\n",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// The token (when one is required) and a CSRF cookie on every response.
pub(super) async fn guard(State(dash): State<Dash>, req: Request, next: Next) -> Response {
    if let Some(token) = dash.token.as_deref().filter(|t| !t.is_empty()) {
        let headers = req.headers();
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let query = req.uri().query().and_then(|q| {
            q.split('&')
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| *k == "token")
                .map(|(_, v)| v.to_string())
        });
        if query.as_deref().is_some_and(|q| same(q, token)) {
            // Keep it in a cookie and drop it (only it) from the address bar.
            let rest: Vec<&str> = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .filter(|p| !p.is_empty() && !p.starts_with("token="))
                .collect();
            let path = if rest.is_empty() {
                req.uri().path().to_string()
            } else {
                format!("{}?{}", req.uri().path(), rest.join("&"))
            };
            return (
                [(
                    header::SET_COOKIE,
                    format!("orderly_token={token}; HttpOnly; SameSite=Strict; Path=/"),
                )],
                Redirect::to(&path),
            )
                .into_response();
        }
        let ok = bearer.is_some_and(|b| same(b, token))
            || cookie(headers, "orderly_token").is_some_and(|c| same(c, token));
        if !ok {
            return (
                StatusCode::UNAUTHORIZED,
                "this dashboard needs its token: open it once with ?token=...\n",
            )
                .into_response();
        }
    }
    // A first visit gets its CSRF token at once: the page it is answered with carries
    // it in its forms already.
    let mut req = req;
    let fresh = cookie(req.headers(), "orderly_csrf")
        .is_none()
        .then(|| uuid::Uuid::new_v4().simple().to_string());
    if let Some(token) = &fresh
        && let Ok(v) = format!("orderly_csrf={token}").parse()
    {
        req.headers_mut().append(header::COOKIE, v);
    }
    let mut res = next.run(req).await;
    if let Some(token) = fresh
        && let Ok(v) = format!("orderly_csrf={token}; SameSite=Strict; Path=/").parse()
    {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::html::esc;

    #[test]
    fn only_addresses_localhost_and_the_public_name_are_answered() {
        let local = Hosts {
            public: None,
            any: false,
        };
        for ok in [
            "127.0.0.1:8088",
            "localhost:8088",
            "LOCALHOST",
            "[::1]:8088",
            "10.0.0.7",
            "localhost.",
        ] {
            assert!(local.allows(ok), "{ok}");
        }
        for bad in [
            "rebind.example",
            "rebind.example:8088",
            "",
            "127.0.0.1.rebind.example",
            "localhost.evil",
        ] {
            assert!(!local.allows(bad), "{bad}");
        }
        let public = Hosts {
            public: Some("ops.example.com".into()),
            any: false,
        };
        assert!(public.allows("ops.example.com") && public.allows("OPS.example.com:443"));
        assert!(!public.allows("rebind.example"));
        assert!(
            Hosts {
                public: None,
                any: true
            }
            .allows("anything.example")
        );
    }

    #[test]
    fn text_is_escaped_and_secrets_compared_in_full() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
