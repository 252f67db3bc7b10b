//! The web dashboard (`orderly dashboard`, and `orderly up --dashboard ADDR`):
//! server-rendered HTML with its style sheet and a small script embedded (nothing is
//! fetched from elsewhere); every page works without the script, which only keeps the
//! overview's figures and charts fresh and reads every list again every 5 s.
//!
//! - `/` overview: orders by state (live), throughput, charts of the last hour (orders
//!   finished per minute by outcome, submit-to-Processed latency percentiles,
//!   recoveries and dead letters), the supervisors (who leads; or no supervisor
//!   running, or a leader lost), open alerts, the remote services, the queues (live);
//! - `/orders` every order, filtered by state, step, error text, age, customer, waiting
//!   service; found by id; paged by cursor; the orders ticked, or all the filters
//!   match, retried or cancelled at once (`bulk`);
//! - `/errors` Error orders grouped by cause, Retry all / Cancel all of a cause after a
//!   confirmation that says how many and what a retry will do; the orders one by one;
//! - `/orders/{id}` one order: a visual timeline of its steps and attempts, its steps,
//!   history and details, Retry / Cancel;
//! - `/alerts` alerts about the system and about orders, Acknowledge for either;
//! - `/dead-letters` dead-lettered messages per queue, with why, Requeue / Discard;
//! - `/api/...` the same as JSON, and every action (see `api`);
//! - `/metrics` (Prometheus, behind the token like the pages), `/healthz` and `/readyz`
//!   (never behind it), as every role serves them.
//!
//! It answers only requests addressed to it: the `Host` must be an IP address,
//! `localhost`, or the host of `--public-url` / `ORDERLY_DASHBOARD_PUBLIC_URL` (else
//! 421), so a page on another site whose name is rebound to the dashboard's address
//! reads nothing and changes nothing; a state-changing request whose `Origin` is
//! another site, or whose browser says it is cross-site, is refused (403). Off loopback
//! without a public URL any name is answered (the token keeps others out).
//!
//! On a loopback address it needs nothing; on any other it requires a token
//! (`--token` / `ORDERLY_DASHBOARD_TOKEN`), given once as `?token=...` (kept in an
//! HttpOnly cookie) or as `Authorization: Bearer ...`. State-changing requests must
//! carry the CSRF token of the page's form, matched against a SameSite=Strict cookie.

use std::net::SocketAddr;

use anyhow::Context;
use axum::middleware;
use axum::routing::{get, post};
use orderly_sql::Backend;
use tokio_util::sync::CancellationToken;

mod access;
mod actions;
mod alerts;
mod api;
mod auth;
mod bulk;
mod charts;
mod dead_letters;
mod errors;
mod html;
mod order;
mod orders;
mod overview;
mod workflows;

use auth::guard;

#[derive(Clone)]
struct Dash {
    backend: Backend,
    token: Option<String>,
    /// The names it answers to.
    hosts: auth::Hosts,
    /// Who its operators are, when it is told.
    access: access::Access,
    /// Reached over https (its public URL): cookies are `Secure`.
    secure: bool,
    /// Minutes of activity already counted, for the charts.
    activity: std::sync::Arc<charts::ActivityCache>,
}

pub use access::{Access, Proxy};

/// Serves the dashboard on `listen` until `shutdown`, answering the names `public_url`
/// and `hosts` allow, to the operators `access` names (or, without any, to whoever has
/// `token`, on loopback to anyone). Refuses a non-loopback address without a token or
/// operators.
pub async fn serve(
    listen: SocketAddr,
    backend: Backend,
    token: Option<String>,
    public_url: Option<reqwest::Url>,
    access: access::Access,
    ops: orderly_runtime::ops::Endpoints,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let public_host = match &public_url {
        None => None,
        Some(u) => Some(
            u.host_str()
                .filter(|_| matches!(u.scheme(), "http" | "https"))
                .with_context(|| {
                    format!("invalid --public-url / ORDERLY_DASHBOARD_PUBLIC_URL {u}: not an http(s) URL with a host")
                })?
                .to_ascii_lowercase(),
        ),
    };
    if !listen.ip().is_loopback()
        && token.as_deref().is_none_or(str::is_empty)
        && !access.identifies()
    {
        anyhow::bail!(
            "the dashboard on {listen} (not loopback) needs --token / ORDERLY_DASHBOARD_TOKEN"
        );
    }
    let limits = orderly_runtime::http::Limits::from_env()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} for the dashboard"))?;
    let addr = listener.local_addr()?;
    let state = Dash {
        backend,
        token,
        hosts: auth::Hosts {
            public: public_host,
            // Off loopback without a public URL, any name reaches it (behind an
            // ingress, say): the token it requires keeps a rebound page out.
            any: !listen.ip().is_loopback() && public_url.is_none(),
        },
        secure: public_url.as_ref().is_some_and(|u| u.scheme() == "https"),
        access,
        activity: std::sync::Arc::default(),
    };
    let app = axum::Router::new()
        .route("/", get(overview::overview))
        .route("/api/overview", get(overview::api))
        .route("/charts", get(overview::charts))
        .route("/orders", get(orders::orders))
        .route("/orders/bulk", post(bulk::bulk))
        .route("/orders/{id}", get(order::order))
        .route("/orders/{id}/retry", post(actions::retry))
        .route("/orders/{id}/cancel", post(actions::cancel))
        .route("/errors", get(errors::errors))
        .route("/errors/group", get(errors::confirm).post(errors::act))
        .route("/alerts", get(alerts::alerts))
        .route("/alerts/{id}/ack", post(alerts::acknowledge))
        .route("/alerts/system/{id}/ack", post(alerts::acknowledge_system))
        .route("/workflows", get(workflows::workflows))
        .route("/workflows/move", post(workflows::move_orders))
        .route("/services/{service}/resume", post(actions::resume_service))
        .route("/dead-letters", get(dead_letters::dead_letters))
        .route("/dead-letters/requeue", post(actions::requeue))
        .route("/dead-letters/discard", post(actions::discard))
        .merge(api::routes())
        .with_state(state.clone())
        .merge(ops.metrics)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(middleware::from_fn_with_state(state, auth::same_site))
        .merge(ops.probes);
    tracing::info!(%addr, "dashboard");
    Ok((
        addr,
        tokio::spawn(orderly_runtime::http::serve(
            listener,
            app,
            limits,
            "dashboard",
            shutdown,
        )),
    ))
}
