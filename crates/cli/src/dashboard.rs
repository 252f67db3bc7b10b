//! The web dashboard (`orderly dashboard`, and `orderly up --dashboard ADDR`):
//! server-rendered HTML with its style sheet and a small script embedded (nothing is
//! fetched from elsewhere); every page works without the script, which only keeps the
//! overview's figures and charts fresh.
//!
//! - `/` overview: orders by state (live), throughput, charts of the last hour (orders
//!   finished per minute by outcome, submit-to-Processed latency percentiles,
//!   recoveries and dead letters), the supervisors (who leads; or no supervisor
//!   running, or a leader lost), open alerts, the remote services, the queues (live);
//! - `/orders` every order, filtered by state, step, error text, age, customer, waiting
//!   service; found by id; paged by cursor;
//! - `/errors` Error orders grouped by cause, Retry all / Cancel all of a cause after a
//!   confirmation that says how many and what a retry will do; the orders one by one;
//! - `/orders/{id}` one order: a visual timeline of its steps and attempts, its steps,
//!   history and details, Retry / Cancel;
//! - `/alerts` alerts about the system and about orders;
//! - `/dead-letters` dead-lettered messages per queue, with why, Requeue / Discard;
//! - `/metrics` (Prometheus, behind the token like the pages), `/healthz` and `/readyz`
//!   (never behind it), as every role serves them.
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

mod actions;
mod alerts;
mod auth;
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
    /// Minutes of activity already counted, for the charts.
    activity: std::sync::Arc<charts::ActivityCache>,
}

/// Serves the dashboard on `listen` until `shutdown`. Refuses a non-loopback address
/// without a token.
pub async fn serve(
    listen: SocketAddr,
    backend: Backend,
    token: Option<String>,
    ops: orderly_runtime::ops::Endpoints,
    shutdown: CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    if !listen.ip().is_loopback() && token.as_deref().is_none_or(str::is_empty) {
        anyhow::bail!(
            "the dashboard on {listen} (not loopback) needs --token / ORDERLY_DASHBOARD_TOKEN"
        );
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} for the dashboard"))?;
    let addr = listener.local_addr()?;
    let state = Dash {
        backend,
        token,
        activity: std::sync::Arc::default(),
    };
    let app = axum::Router::new()
        .route("/", get(overview::overview))
        .route("/api/overview", get(overview::api))
        .route("/charts", get(overview::charts))
        .route("/orders", get(orders::orders))
        .route("/orders/{id}", get(order::order))
        .route("/orders/{id}/retry", post(actions::retry))
        .route("/orders/{id}/cancel", post(actions::cancel))
        .route("/errors", get(errors::errors))
        .route("/errors/group", get(errors::confirm).post(errors::act))
        .route("/alerts", get(alerts::alerts))
        .route("/workflows", get(workflows::workflows))
        .route("/workflows/move", post(workflows::move_orders))
        .route("/services/{service}/resume", post(actions::resume_service))
        .route("/dead-letters", get(dead_letters::dead_letters))
        .route("/dead-letters/requeue", post(actions::requeue))
        .route("/dead-letters/discard", post(actions::discard))
        .with_state(state.clone())
        .merge(ops.metrics)
        .layer(middleware::from_fn_with_state(state, guard))
        .merge(ops.probes);
    tracing::info!(%addr, "dashboard");
    Ok((
        addr,
        tokio::spawn(async move {
            let stop = shutdown.clone();
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
            {
                tracing::error!(error = %e, "the dashboard failed");
            }
        }),
    ))
}
