//! What every role serves for its operators and its orchestrator, on `--http-listen` /
//! `ORDERLY_HTTP_LISTEN`: `/healthz` (the process runs), `/readyz` (ready only when the
//! state store and the queues answer), and `/metrics` (Prometheus text: the role's
//! counters and histograms, plus orders by state, queue depths and dead letters, and
//! the supervisors' leadership, read at scrape time).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use orderly_core::leader::LeaderStatus;
use orderly_sql::Backend;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a readiness check or a scrape may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct Ops {
    role: &'static str,
    backend: Backend,
    metrics: PrometheusHandle,
    leaders: Vec<watch::Receiver<LeaderStatus>>,
}

/// The operations endpoints as routers, for a server of their own ([`serve`]) or to
/// be mounted beside the dashboard.
pub struct Endpoints {
    /// `/healthz` and `/readyz`: for the orchestrator, never behind a token.
    pub probes: axum::Router,
    /// `/metrics`: behind the dashboard's token where there is one.
    pub metrics: axum::Router,
}

/// The endpoints of `role` over `backend`; `leaders` are the electors of this process
/// (none but in supervisors and the embedded system).
pub fn endpoints(
    role: &'static str,
    backend: Backend,
    metrics: PrometheusHandle,
    leaders: Vec<watch::Receiver<LeaderStatus>>,
) -> Endpoints {
    let state = Ops {
        role,
        backend,
        metrics,
        leaders,
    };
    Endpoints {
        probes: axum::Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(state.clone()),
        metrics: axum::Router::new()
            .route("/metrics", get(render))
            .with_state(state),
    }
}

/// Installs the process's metrics recorder (once per process).
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets(&[
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ])
        .context("metrics buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")
}

/// Serves the operations endpoints of `role` on `listen` until `shutdown`, and the
/// routes of `extra` beside them (the submitter's HTTP intake).
pub async fn serve(
    listen: SocketAddr,
    role: &'static str,
    backend: Backend,
    leader: Option<watch::Receiver<LeaderStatus>>,
    extra: Option<axum::Router>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let metrics = install_metrics()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| {
            format!("cannot listen on --http-listen / ORDERLY_HTTP_LISTEN {listen}")
        })?;
    let Endpoints { probes, metrics } =
        endpoints(role, backend, metrics, leader.into_iter().collect());
    let mut app = probes.merge(metrics);
    if let Some(extra) = extra {
        app = app.merge(extra);
    }
    tracing::info!(%listen, "serving /healthz, /readyz and /metrics");
    Ok(tokio::spawn(async move {
        let stop = shutdown.clone();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        {
            tracing::error!(error = %e, "the operations endpoint failed");
        }
    }))
}

async fn readiness(ops: &Ops) -> Result<(), String> {
    tokio::time::timeout(PROBE_TIMEOUT, async {
        ops.backend
            .store
            .count_by_state()
            .await
            .map_err(|e| format!("state store: {e}"))?;
        ops.backend
            .inspector
            .ping()
            .await
            .map_err(|e| format!("queues: {e}"))?;
        Ok(())
    })
    .await
    .map_err(|_| format!("no answer within {} ms", PROBE_TIMEOUT.as_millis()))?
}

async fn readyz(State(ops): State<Ops>) -> impl IntoResponse {
    match readiness(&ops).await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => {
            tracing::warn!(%why, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            )
        }
    }
}

/// Refreshes the gauges read from the store, then renders everything.
async fn render(State(ops): State<Ops>) -> impl IntoResponse {
    let refreshed = tokio::time::timeout(PROBE_TIMEOUT, refresh(&ops)).await;
    let up = matches!(refreshed, Ok(Ok(())));
    if let Ok(Err(e)) = &refreshed {
        tracing::warn!(error = %e, "metrics: the store did not answer");
    }
    metrics::gauge!("orderly_store_up", "role" => ops.role).set(if up { 1.0 } else { 0.0 });
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        ops.metrics.render(),
    )
}

async fn refresh(ops: &Ops) -> anyhow::Result<()> {
    for (state, n) in ops.backend.store.count_by_state().await? {
        metrics::gauge!("orderly_orders", "state" => state.as_str()).set(n as f64);
    }
    let depths = match ops.backend.inspector.depths().await {
        Ok(depths) => depths,
        // Service Bus: depths are Azure Monitor's; the rest is still reported.
        Err(orderly_core::transport::TransportError::Unsupported(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    for d in depths {
        let queue = d.queue.as_str().to_owned();
        for (condition, n) in [
            ("ready", d.ready),
            ("locked", d.locked),
            ("scheduled", d.scheduled),
        ] {
            metrics::gauge!("orderly_queue_messages", "queue" => queue.clone(), "condition" => condition)
                .set(n as f64);
        }
        metrics::gauge!("orderly_dead_letters", "queue" => queue).set(d.dead_lettered as f64);
    }
    if let Some(term) = ops
        .backend
        .store
        .term(orderly_core::leader::SUPERVISORS)
        .await?
    {
        metrics::gauge!("orderly_leadership_epoch", "leadership" => term.fence.name)
            .set(term.fence.epoch.0 as f64);
    }
    for status in &ops.leaders {
        let s = status.borrow().clone();
        metrics::gauge!("orderly_is_leader", "instance" => s.instance.as_str().to_owned())
            .set(if s.is_leader { 1.0 } else { 0.0 });
    }
    Ok(())
}

/// Starts the endpoints if `listen` is set; the role's own task otherwise runs alone.
pub async fn maybe_serve(
    listen: Option<SocketAddr>,
    role: &'static str,
    backend: &Backend,
    leader: Option<watch::Receiver<LeaderStatus>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    match listen {
        Some(addr) => Ok(Some(
            serve(addr, role, backend.clone(), leader, None, shutdown.clone()).await?,
        )),
        None => Ok(None),
    }
}
