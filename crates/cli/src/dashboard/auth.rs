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
