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

/// Who acts: the operator signed in, else as the last action's form said
/// (`dashboard` until one did).
pub(super) fn operator(headers: &HeaderMap) -> String {
    if let Some(name) = headers.get(SIGNED_IN).and_then(|v| v.to_str().ok()) {
        return name.to_owned();
    }
    cookie(headers, "orderly_operator")
        .filter(|n| !n.is_empty())
        .unwrap_or("dashboard")
        .to_owned()
}

/// Constant-time comparison of two secrets.
pub(super) use orderly_runtime::http::same_secret as same;

/// The names the dashboard answers to.
pub(super) use orderly_runtime::http::Hosts;

/// Refuses requests not addressed to this dashboard (a `Host` it does not answer to:
/// 421) and state-changing requests sent by another site (an `Origin` of another host,
/// or `Sec-Fetch-Site: cross-site`: 403). The probes are served apart and not checked.
pub(super) async fn same_site(State(dash): State<Dash>, req: Request, next: Next) -> Response {
    let reads = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    match orderly_runtime::http::same_site(&dash.hosts, req.headers(), req.uri(), !reads) {
        Ok(()) => next.run(req).await,
        Err(orderly_runtime::http::SiteRefusal::Host(host)) => {
            tracing::warn!(host, path = %req.uri().path(), "refused: a Host this dashboard does not answer to (DNS rebinding?)");
            (
                StatusCode::MISDIRECTED_REQUEST,
                "this dashboard does not answer to that host name; set --public-url / ORDERLY_DASHBOARD_PUBLIC_URL to the name it is reached by\n",
            )
                .into_response()
        }
        Err(orderly_runtime::http::SiteRefusal::CrossSite(origin)) => {
            tracing::warn!(origin, path = %req.uri().path(), "refused: a state-changing request from another site");
            (
                StatusCode::FORBIDDEN,
                "refused: this request comes from another site\n",
            )
                .into_response()
        }
    }
}

/// The name of the operator signed in, set by [`guard`] (a client's own is dropped).
pub(super) const SIGNED_IN: &str = "x-orderly-signed-in";

/// The token a request carries: `Authorization: Bearer`, the cookie, or `?token=`
/// (the last is moved into the cookie at once).
fn presented(req: &Request) -> (Option<String>, Option<String>) {
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or_else(|| cookie(headers, "orderly_token").map(str::to_owned));
    let query = req.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| *k == "token")
            .map(|(_, v)| v.to_string())
    });
    (bearer, query)
}

/// Keeps `token` in an HttpOnly cookie and sends the browser back to the same address
/// without it (the token never stays in the address bar or the history).
fn sign_in(req: &Request, token: &str, secure: bool) -> Response {
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
    let secure = if secure { "; Secure" } else { "" };
    (
        [(
            header::SET_COOKIE,
            format!("orderly_token={token}; HttpOnly; SameSite=Strict; Path=/{secure}"),
        )],
        Redirect::to(&path),
    )
        .into_response()
}

/// Who the request is from, when the dashboard identifies its operators: the operator
/// whose `token` it carries, or the name the trusted proxy gives in its one header
/// (only from its address). `Err`: the answer to give (nobody, or a proxy header that
/// does not hold exactly one valid name).
fn identified(
    dash: &Dash,
    req: &Request,
    token: Option<&str>,
) -> Result<(String, super::access::Role), &'static str> {
    const SIGN_IN: &str = "sign in: open the dashboard once with ?token=YOUR-OPERATOR-TOKEN, or through its authenticating proxy\n";
    let access = &dash.access;
    if let Some(o) = token.and_then(|t| access.by_token(t)) {
        return Ok((o.name.clone(), o.role));
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let Some(proxy) = access.proxy.as_ref().filter(|p| Some(p.address) == peer) else {
        return Err(SIGN_IN);
    };
    let mut values = req.headers().get_all(&proxy.header).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        // None, or several: a client's own value beside the proxy's.
        tracing::warn!(header = %proxy.header, "refused: the proxy's identity header is missing or given more than once");
        return Err(
            "the authenticating proxy must name exactly one operator in its identity header\n",
        );
    };
    let name = value.to_str().map(str::trim).unwrap_or("");
    if !super::access::valid_name(name) {
        // A list ("mallory, carol"), non-ASCII, or anything else that is not one name.
        tracing::warn!(header = %proxy.header, "refused: the proxy's identity header does not hold one valid name");
        return Err(
            "the authenticating proxy's identity header must hold one name: 1 to 64 ASCII letters, digits, '-', '_', '.' or '@'\n",
        );
    }
    Ok((name.to_owned(), access.role_of(name)))
}

/// The token (when one is required) and a CSRF cookie on every response.
pub(super) async fn guard(State(dash): State<Dash>, req: Request, next: Next) -> Response {
    let mut req = req;
    req.headers_mut().remove(SIGNED_IN);
    let (token, query) = presented(&req);
    if dash.access.identifies() {
        if let Some(query) = query.filter(|q| dash.access.by_token(q).is_some()) {
            return sign_in(&req, &query, dash.secure);
        }
        let (name, role) = match identified(&dash, &req, token.as_deref()) {
            Ok(who) => who,
            Err(why) => return (StatusCode::UNAUTHORIZED, why).into_response(),
        };
        let reads = matches!(
            *req.method(),
            axum::http::Method::GET | axum::http::Method::HEAD
        );
        if !reads && role == super::access::Role::Read {
            return (
                StatusCode::FORBIDDEN,
                format!("{name} may read the dashboard, not act on it (role read)\n"),
            )
                .into_response();
        }
        // A valid name is ASCII, so it always makes a header value; were it not to,
        // nothing is done under another name.
        let Ok(n) = name.parse() else {
            return (
                StatusCode::UNAUTHORIZED,
                "this operator name cannot be used\n",
            )
                .into_response();
        };
        req.headers_mut().insert(SIGNED_IN, n);
    } else if let Some(shared) = dash.token.as_deref().filter(|t| !t.is_empty()) {
        if query.as_deref().is_some_and(|q| same(q, shared)) {
            return sign_in(&req, shared, dash.secure);
        }
        if !token.as_deref().is_some_and(|t| same(t, shared)) {
            return (
                StatusCode::UNAUTHORIZED,
                "this dashboard needs its token: open it once with ?token=...\n",
            )
                .into_response();
        }
    }
    // A first visit gets its CSRF token at once: the page it is answered with carries
    // it in its forms already.
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
        && let Ok(v) = format!(
            "orderly_csrf={token}; SameSite=Strict; Path=/{}",
            if dash.secure { "; Secure" } else { "" }
        )
        .parse()
    {
        res.headers_mut().append(header::SET_COOKIE, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn secrets_are_compared_in_full() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
