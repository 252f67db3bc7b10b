//! The web dashboard (`orderly dashboard`, and `orderly up --dashboard ADDR`): plain
//! server-rendered HTML, no JavaScript needed.
//!
//! - `/` overview: orders by state, throughput (orders finished in the last minute,
//!   5 minutes and hour, by outcome, and per minute), age of the oldest Pending order,
//!   the supervisors' leader, queue depths;
//! - `/errors` the Error triage list, searchable by error text and step;
//! - `/orders/{id}` one order: details, steps, its timeline, the last error, and
//!   Retry / Cancel (POST forms, CSRF-protected);
//! - `/dead-letters` dead-lettered messages per queue, with why;
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
mod auth;
mod html;
mod pages;

use actions::{cancel, resume_service, retry};
use auth::guard;
use pages::{dead_letters, errors, order, overview};

#[derive(Clone)]
struct Dash {
    backend: Backend,
    token: Option<String>,
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
    let state = Dash { backend, token };
    let app = axum::Router::new()
        .route("/", get(overview))
        .route("/errors", get(errors))
        .route("/orders/{id}", get(order))
        .route("/orders/{id}/retry", post(retry))
        .route("/orders/{id}/cancel", post(cancel))
        .route("/services/{service}/resume", post(resume_service))
        .route("/dead-letters", get(dead_letters))
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
