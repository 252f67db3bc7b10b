//! `orderly-supervisor`: while it leads, recovers timed-out orders and publishes alerts;
//! otherwise follows, ready to take over.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use orderly_runtime::election::ElectionArgs;
use orderly_supervisor::{AlertWebhook, Supervisor, SupervisorConfig, WebhookConfig};

/// orderly-supervisor: recovers orders whose deadline passed and publishes operator
/// alerts, on the one instance elected leader.
#[derive(Parser)]
#[command(version = orderly_runtime::VERSION, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
    #[command(flatten)]
    election: ElectionArgs,
    /// Time between sweeps.
    #[arg(long = "interval", env = "ORDERLY_SWEEP_INTERVAL", default_value = "1s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::period)]
    interval_ms: Duration,
    /// At this failure count an order goes to Error.
    #[arg(long, env = "ORDERLY_MAX_FAILURES", default_value_t = 5)]
    max_failures: i32,
    /// An order whose undoing times out is sent round to undo again, with back-off, up
    /// to this many more failures past --max-failures, before it ends in Error as
    /// needing manual repair (with the back-off cap, 30 is about two hours).
    #[arg(long, env = "ORDERLY_MAX_UNDO_FAILURES", default_value_t = 30)]
    max_undo_failures: i32,
    /// Back-off after the first failure; doubles with each further one.
    #[arg(long = "backoff-base", env = "ORDERLY_BACKOFF_BASE", default_value = "1s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    backoff_base_ms: Duration,
    /// Longest back-off.
    #[arg(long = "backoff-max", env = "ORDERLY_BACKOFF_MAX", default_value = "5m", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    backoff_max_ms: Duration,
    /// Also POST every alert as JSON to this URL (http or https; it may carry a token and is never logged).
    #[arg(long, env = "ORDERLY_ALERT_WEBHOOK_URL", hide_env_values = true)]
    alert_webhook_url: Option<String>,
    /// Each webhook attempt is abandoned after this long.
    #[arg(long = "alert-webhook-timeout", env = "ORDERLY_ALERT_WEBHOOK_TIMEOUT", default_value = "5s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    alert_webhook_timeout_ms: Duration,
    /// Remove finished orders (Processed or Cancelled; with their steps, history and
    /// alerts), old dead letters and relayed outbox rows this long after they ended:
    /// 7d, 36h, ...; `off` keeps everything. Only the leader prunes, in small batches.
    #[arg(long, env = "ORDERLY_RETAIN_FINISHED", default_value = "7d", value_parser = span_or_off)]
    retain_finished: SpanOrOff,
    /// How often the leader prunes: 10m, 1h, ...
    #[arg(long, env = "ORDERLY_PRUNE_EVERY", default_value = "10m", value_parser = orderly_runtime::span)]
    prune_every: Duration,
    /// How often the leader vacuums the hot tables (queue messages, order state and
    /// steps, outbox) on PostgreSQL when enough dead rows piled up in one: 1s, 30s, ...;
    /// `off` leaves it to the server's autovacuum. Nothing to do on SQLite.
    #[arg(long, env = "ORDERLY_VACUUM_EVERY", default_value = "1s", value_parser = span_or_off)]
    vacuum_every: SpanOrOff,
    /// Raise an alert when the oldest Pending order (not one waiting for a service that
    /// is down) has waited longer than this: 5m, 1h, ...; `off` never.
    #[arg(long, env = "ORDERLY_ALERT_PENDING_AFTER", default_value = "5m", value_parser = span_or_off)]
    alert_pending_after: SpanOrOff,
    /// Attempts per alert before the webhook gives up on it (it stays in the alerts table and queue).
    #[arg(long, env = "ORDERLY_ALERT_WEBHOOK_MAX_ATTEMPTS", default_value_t = 8)]
    alert_webhook_max_attempts: u32,
}

/// The webhook's settings, checked; errors name the setting, never the URL.
fn webhook(args: &Args) -> anyhow::Result<Option<WebhookConfig>> {
    let Some(raw) = &args.alert_webhook_url else {
        return Ok(None);
    };
    let url = reqwest::Url::parse(raw)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "invalid --alert-webhook-url / ORDERLY_ALERT_WEBHOOK_URL: must be an http(s) URL (not echoed: it may hold a token)"
            )
        })?;
    if args.alert_webhook_max_attempts == 0 {
        anyhow::bail!(
            "invalid --alert-webhook-max-attempts / ORDERLY_ALERT_WEBHOOK_MAX_ATTEMPTS: must be at least 1"
        );
    }
    if args.alert_webhook_timeout_ms.is_zero() {
        anyhow::bail!(
            "invalid --alert-webhook-timeout / ORDERLY_ALERT_WEBHOOK_TIMEOUT: must be more than 0"
        );
    }
    Ok(Some(WebhookConfig {
        timeout: args.alert_webhook_timeout_ms,
        max_attempts: args.alert_webhook_max_attempts,
        trust: orderly_tls::Trust::from_env()?,
        ..WebhookConfig::new(url)
    }))
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderly_runtime::exit("orderly-supervisor", run().await)
}

async fn run() -> anyhow::Result<()> {
    let args: Args = orderly_runtime::settings::parse("supervisor")?;
    let instance = args.common.instance("supervisor")?;
    let _telemetry =
        orderly_runtime::telemetry::init("orderly-supervisor", &args.common, &instance)?;
    // Settings first: a wrong one stops start-up before any connection is made.
    let election = args.election.prepare()?;
    let webhook = webhook(&args)?;
    let cfg = config(&args, instance.clone())?;
    let plan = orderly_runtime::backend::Plan::new(&args.common)?;
    if args.common.checked("orderly-supervisor")? {
        return Ok(());
    }
    let opened = plan.open(&instance).await?;
    // It publishes alerts.
    opened.ensure_queues([cfg.alerts.clone()]).await?;
    let backend = opened.backend.clone();
    let elector = election.elector(backend.store.clone(), instance.clone())?;
    let shutdown = orderly_runtime::shutdown_on_signals();
    let ops = orderly_runtime::ops::maybe_serve(
        args.common.ops_listen()?,
        "supervisor",
        &backend,
        Some(elector.status()),
        &shutdown,
    )
    .await?;
    let mut supervisor = Supervisor::wired(backend.store.clone(), cfg)
        .context("invalid recovery settings (--max-failures, --backoff-*)")?;
    let mut delivery = None;
    if let Some(cfg) = webhook {
        let (hook, task) = AlertWebhook::start(cfg, shutdown.clone())
            .context("cannot set up the alert webhook client")?;
        supervisor = supervisor.with_webhook(hook);
        delivery = Some(task);
    }
    supervisor.run(Arc::new(elector), shutdown).await;
    if let Some(task) = delivery {
        let _ = task.await;
    }
    // What the role wrote last still goes out (Service Bus: the outbox relay drains).
    opened.finish().await;
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    Ok(())
}

/// The sweeps, retention, tidying, alerting and recovery policy, checked.
fn config(args: &Args, instance: orderly_core::InstanceId) -> anyhow::Result<SupervisorConfig> {
    let mut cfg = SupervisorConfig::new(instance);
    cfg.interval = args.interval_ms;
    cfg.retention = args
        .retain_finished
        .0
        .map(|keep| orderly_core::store::Retention {
            keep,
            batch: cfg.batch,
        });
    cfg.prune_every = args.prune_every;
    cfg.tidy_every = args.vacuum_every.0;
    cfg.pending_alert_after = args.alert_pending_after.0;
    cfg.policy.max_failures = args.max_failures;
    cfg.policy.max_undo_failures = args.max_undo_failures;
    cfg.policy.backoff_base = args.backoff_base_ms;
    cfg.policy.backoff_max = args.backoff_max_ms;
    cfg.policy
        .validate()
        .context("invalid recovery settings (--max-failures, --max-undo-failures, --backoff-*)")?;
    Ok(cfg)
}

/// A span that may be `off` (`None`): how long finished orders are kept, how long the
/// oldest Pending order may wait before it is alerted on, how often the leader vacuums.
#[derive(Debug, Clone, Copy)]
struct SpanOrOff(Option<Duration>);

/// Reads a span, or `off`.
fn span_or_off(raw: &str) -> Result<SpanOrOff, String> {
    if raw.trim().eq_ignore_ascii_case("off") {
        Ok(SpanOrOff(None))
    } else {
        orderly_runtime::span(raw).map(|keep| SpanOrOff(Some(keep)))
    }
}
