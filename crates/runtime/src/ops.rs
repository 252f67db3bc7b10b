//! What every role serves for its operators and its orchestrator, on `--http-listen` /
//! `ORDERLY_HTTP_LISTEN`: `/healthz` (the process runs), `/readyz` (ready only when the
//! state store and the queues answer: one statement that reads no table, and the
//! broker's own ping), and `/metrics` (Prometheus text: the process's counters,
//! histograms and leadership).
//!
//! The store-wide gauges (orders by state, queue depths and dead letters, the
//! leadership's epoch) come from one place: the process whose elector leads (the leading
//! supervisor, or `orderly up`), read at most every [`STORE_GAUGES_EVERY`]. Every other
//! replica leaves them out, so a `sum()` over the fleet counts each order once and a
//! scrape never costs the store more than a ping.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
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

/// The store-wide gauges are read again after this long (by the leader only).
pub const STORE_GAUGES_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Ops {
    role: &'static str,
    backend: Backend,
    metrics: PrometheusHandle,
    leaders: Vec<watch::Receiver<LeaderStatus>>,
    store_gauges: Arc<tokio::sync::Mutex<StoreGauges>>,
}

/// The last reading of the store-wide gauges, as Prometheus text.
#[derive(Default)]
struct StoreGauges {
    read_at: Option<tokio::time::Instant>,
    text: String,
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
        store_gauges: Arc::default(),
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
        .inspect(|_| describe())
}

/// Help text for every metric a role records (Prometheus shows it as `# HELP`).
fn describe() {
    use metrics::{describe_counter as c, describe_gauge as g, describe_histogram as h};
    c!(
        "orderly_alerts_published_total",
        "Alerts published to the alerts queue."
    );
    c!(
        "orderly_completions_refused_total",
        "Step replies the store refused (stale owner, or the order already moved on)."
    );
    g!(
        "orderly_clock_offset_seconds",
        "How far the state store's clock is ahead of this host's (negative: behind); deadlines are read on the store's time."
    );
    c!(
        "orderly_dead_lettered_total",
        "Messages this process dead-lettered, by queue and reason."
    );
    c!(
        "orderly_leadership_changes_total",
        "Times this process gained or lost a leadership."
    );
    c!(
        "orderly_lease_renewal_failures_total",
        "Failed lease renewals of this process's elector."
    );
    c!(
        "orderly_orders_claimed_total",
        "Orders this scheduler claimed."
    );
    c!(
        "orderly_orders_parked_total",
        "Orders parked to wait for a remote service that is down."
    );
    c!(
        "orderly_orders_processed_total",
        "Orders this scheduler brought to Processed."
    );
    c!(
        "orderly_orders_submitted_total",
        "Orders the submitter took in, by outcome (accepted, duplicate)."
    );
    c!(
        "orderly_outbox_dead_lettered_total",
        "Outbox messages set aside as undeliverable."
    );
    c!(
        "orderly_outbox_relay_failures_total",
        "Failed outbox relay passes (retried with back-off)."
    );
    c!(
        "orderly_outbox_relayed_total",
        "Outbox messages published to the broker."
    );
    c!(
        "orderly_pruned_total",
        "Rows removed by retention, by what."
    );
    c!(
        "orderly_recoveries_total",
        "Timed-out orders the leader recovered, by outcome."
    );
    c!(
        "orderly_remote_calls_total",
        "Calls this agent made to remote services (every attempt), by action."
    );
    c!(
        "orderly_requests_deferred_total",
        "Step requests deferred while their service is down."
    );
    c!(
        "orderly_service_alerts_total",
        "Alerts about remote services, by kind."
    );
    c!(
        "orderly_service_outages_total",
        "Outages of remote services this agent saw begin."
    );
    c!(
        "orderly_servicebus_reconnects_total",
        "Times this process reconnected to Service Bus."
    );
    c!(
        "orderly_status_probes_total",
        "Status probes this agent made after a call ended without an answer, by action and verdict."
    );
    c!(
        "orderly_steps_succeeded_total",
        "Steps recorded as succeeded."
    );
    c!(
        "orderly_system_alerts_total",
        "System alerts raised by the leader, by kind."
    );
    c!("orderly_vacuums_total", "Vacuums the leader ran, by table.");
    g!(
        "orderly_is_leader",
        "1 while this process's elector leads (by instance_id)."
    );
    g!(
        "orderly_leader",
        "1 while this process holds the leadership (by leadership)."
    );
    g!(
        "orderly_leader_epoch",
        "The epoch of this process's leadership term."
    );
    g!(
        "orderly_outbox_backlog",
        "Outbox messages not yet published."
    );
    g!(
        "orderly_outbox_dead_letters",
        "Outbox messages set aside as undeliverable, not yet dealt with."
    );
    g!(
        "orderly_servicebus_connected",
        "1 while this process's Service Bus connection is up."
    );
    g!(
        "orderly_store_up",
        "1 if the state store answered this scrape."
    );
    h!(
        "orderly_recovered_failures",
        "The failure count of each order the leader sent back to Pending."
    );
    h!(
        "orderly_step_duration_seconds",
        metrics::Unit::Seconds,
        "How long a step's remote call took, by action and outcome."
    );
    h!(
        "orderly_step_writes_seconds",
        metrics::Unit::Seconds,
        "How long recording a batch of step replies took."
    );
}

/// Where the operations endpoints listen, and the token /metrics asks for
/// ([`crate::Common::ops_listen`]). Its `Debug` leaves the token out.
#[derive(Clone)]
pub struct Listen {
    /// The address.
    pub addr: SocketAddr,
    /// Asked for as `Authorization: Bearer` on /metrics; `None`: open (loopback only).
    pub metrics_token: Option<String>,
    /// Where /healthz and /readyz are also served alone, on connections of their own.
    pub probes: Option<SocketAddr>,
}

impl std::fmt::Debug for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listen")
            .field("addr", &self.addr)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .field("probes", &self.probes)
            .finish()
    }
}

/// `router` answering 401 unless the request carries `token` as a bearer token.
fn behind(router: axum::Router, token: Option<String>) -> axum::Router {
    let Some(token) = token else {
        return router;
    };
    let token: Arc<str> = token.into();
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let token = token.clone();
            async move {
                if crate::http::bearer_is(request.headers(), &token) {
                    next.run(request).await
                } else {
                    (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "missing or wrong token: send Authorization: Bearer <ORDERLY_METRICS_TOKEN>\n",
                    )
                        .into_response()
                }
            }
        },
    ))
}

/// Serves the operations endpoints of `role` on `listen` until `shutdown`, and the
/// routes of `extra` beside them (the submitter's HTTP intake).
pub async fn serve(
    listen: Listen,
    role: &'static str,
    backend: Backend,
    leader: Option<watch::Receiver<LeaderStatus>>,
    extra: Option<axum::Router>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let metrics = install_metrics()?;
    let limits = crate::http::Limits::from_env()?;
    let Listen {
        addr: listen,
        metrics_token,
        probes: probe_listen,
    } = listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| {
            format!("cannot listen on --http-listen / ORDERLY_HTTP_LISTEN {listen}")
        })?;
    let probe_listener = match probe_listen {
        Some(at) => Some(tokio::net::TcpListener::bind(at).await.with_context(|| {
            format!("cannot listen on --probe-listen / ORDERLY_PROBE_LISTEN {at}")
        })?),
        None => None,
    };
    let Endpoints { probes, metrics } =
        endpoints(role, backend, metrics, leader.into_iter().collect());
    let mut app = probes.clone().merge(behind(metrics, metrics_token));
    if let Some(extra) = extra {
        app = app.merge(extra);
    }
    tracing::info!(%listen, "serving /healthz, /readyz and /metrics");
    let main = crate::http::serve(listener, app, limits, "operations", shutdown.clone());
    let Some(probe_listener) = probe_listener else {
        return Ok(tokio::spawn(main));
    };
    tracing::info!(listen = ?probe_listen, "serving /healthz and /readyz on their own");
    let alone = crate::http::serve(probe_listener, probes, limits, "probes", shutdown);
    Ok(tokio::spawn(async move {
        tokio::join!(main, alone);
    }))
}

/// What is not ready (for anyone to read) and why (for the log).
async fn readiness(ops: &Ops) -> Result<(), (&'static str, String)> {
    tokio::time::timeout(PROBE_TIMEOUT, async {
        ops.backend
            .store
            .ping()
            .await
            .map_err(|e| ("the state store", e.to_string()))?;
        ops.backend
            .inspector
            .ping()
            .await
            .map_err(|e| ("the queues", e.to_string()))?;
        Ok(())
    })
    .await
    .map_err(|_| {
        (
            "the state store or the queues",
            format!("no answer within {} ms", PROBE_TIMEOUT.as_millis()),
        )
    })?
}

/// `/readyz` is open (the orchestrator asks without a token): its answer names what is
/// not ready, never the error, which may name hosts, users or databases; the error is
/// in the log.
async fn readyz(State(ops): State<Ops>) -> impl IntoResponse {
    match readiness(&ops).await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err((what, why)) => {
            tracing::warn!(what, %why, "not ready");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {what} (the cause is in this process's log)\n"),
            )
        }
    }
}

/// The process's metrics, and the store-wide gauges where this process leads.
async fn render(State(ops): State<Ops>) -> impl IntoResponse {
    let up = matches!(
        tokio::time::timeout(PROBE_TIMEOUT, ops.backend.store.ping()).await,
        Ok(Ok(()))
    );
    metrics::gauge!("orderly_store_up", "role" => ops.role).set(if up { 1.0 } else { 0.0 });
    let mut leads = false;
    for status in &ops.leaders {
        let s = status.borrow().clone();
        leads |= s.is_leader;
        metrics::gauge!("orderly_is_leader", "instance_id" => s.instance.as_str().to_owned())
            .set(if s.is_leader { 1.0 } else { 0.0 });
    }
    let mut body = ops.metrics.render();
    if leads {
        body.push_str(&store_gauges(&ops).await);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

/// The store-wide gauges, read again if the last reading is older than
/// [`STORE_GAUGES_EVERY`]; empty if the store did not answer (no stale figures).
async fn store_gauges(ops: &Ops) -> String {
    let mut cached = ops.store_gauges.lock().await;
    let fresh = cached
        .read_at
        .is_some_and(|at| at.elapsed() < STORE_GAUGES_EVERY);
    if !fresh {
        match tokio::time::timeout(PROBE_TIMEOUT, read_store_gauges(ops)).await {
            Ok(Ok(text)) => {
                cached.text = text;
                cached.read_at = Some(tokio::time::Instant::now());
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "metrics: the store-wide gauges could not be read");
                cached.text.clear();
                cached.read_at = None;
            }
            Err(_) => {
                tracing::warn!(
                    "metrics: the store-wide gauges took over {} ms",
                    PROBE_TIMEOUT.as_millis()
                );
                cached.text.clear();
                cached.read_at = None;
            }
        }
    }
    cached.text.clone()
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn read_store_gauges(ops: &Ops) -> anyhow::Result<String> {
    let mut out = String::new();
    out.push_str(
        "# HELP orderly_orders Orders in the state store by state (from the leader only).\n",
    );
    out.push_str("# TYPE orderly_orders gauge\n");
    for (state, n) in ops.backend.store.count_by_state().await? {
        let _ = writeln!(out, "orderly_orders{{state=\"{}\"}} {n}", state.as_str());
    }
    let depths = match ops.backend.inspector.depths().await {
        Ok(depths) => depths,
        // Service Bus: depths are Azure Monitor's; the rest is still reported.
        Err(orderly_core::transport::TransportError::Unsupported(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    if !depths.is_empty() {
        out.push_str("# HELP orderly_queue_messages Messages in each queue by condition (from the leader only).\n");
        out.push_str("# TYPE orderly_queue_messages gauge\n");
        for d in &depths {
            let queue = label(d.queue.as_str());
            for (condition, n) in [
                ("ready", d.ready),
                ("locked", d.locked),
                ("scheduled", d.scheduled),
            ] {
                let _ = writeln!(
                    out,
                    "orderly_queue_messages{{queue=\"{queue}\",condition=\"{condition}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP orderly_dead_letters Dead-lettered messages of each queue (from the leader only).\n");
        out.push_str("# TYPE orderly_dead_letters gauge\n");
        for d in &depths {
            let _ = writeln!(
                out,
                "orderly_dead_letters{{queue=\"{}\"}} {}",
                label(d.queue.as_str()),
                d.dead_lettered
            );
        }
    }
    if let Some(term) = ops
        .backend
        .store
        .term(orderly_core::leader::SUPERVISORS)
        .await?
    {
        out.push_str("# HELP orderly_leadership_epoch The epoch of the current leadership term, as the store records it.\n");
        out.push_str("# TYPE orderly_leadership_epoch gauge\n");
        let _ = writeln!(
            out,
            "orderly_leadership_epoch{{leadership=\"{}\"}} {}",
            label(&term.fence.name),
            term.fence.epoch.0
        );
    }
    Ok(out)
}

/// Starts the endpoints if `listen` is set; the role's own task otherwise runs alone.
pub async fn maybe_serve(
    listen: Option<Listen>,
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
