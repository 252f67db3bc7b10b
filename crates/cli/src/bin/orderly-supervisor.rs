//! `orderly-supervisor`: recovers timed-out orders and publishes alerts.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use orderly_core::TimeSource;
use orderly_supervisor::{Supervisor, SupervisorConfig};

/// orderly-supervisor: recovers orders whose deadline passed; publishes operator alerts.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
    /// Time between sweeps, in ms.
    #[arg(long, env = "ORDERLY_SWEEP_INTERVAL_MS", default_value = "1000", value_parser = orderly_runtime::millis)]
    interval_ms: Duration,
    /// At this failure count an order goes to Error.
    #[arg(long, env = "ORDERLY_MAX_FAILURES", default_value_t = 5)]
    max_failures: i32,
    /// Back-off after the first failure, in ms; doubles with each further one.
    #[arg(long, env = "ORDERLY_BACKOFF_BASE_MS", default_value = "1000", value_parser = orderly_runtime::millis)]
    backoff_base_ms: Duration,
    /// Longest back-off, in ms.
    #[arg(long, env = "ORDERLY_BACKOFF_MAX_MS", default_value = "300000", value_parser = orderly_runtime::millis)]
    backoff_max_ms: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    orderly_runtime::init_tracing(args.common.log_json);
    let mut cfg = SupervisorConfig::new(args.common.instance("supervisor")?);
    cfg.interval = args.interval_ms;
    cfg.policy.max_failures = args.max_failures;
    cfg.policy.backoff_base = args.backoff_base_ms;
    cfg.policy.backoff_max = args.backoff_max_ms;
    let backend = orderly_sql::connect(&args.common.database_url, TimeSource::Database)
        .await
        .context("cannot open the state store (--database-url / ORDERLY_DATABASE_URL)")?;
    let supervisor = Supervisor::new(backend.store, backend.transport, cfg)
        .context("invalid recovery settings (--max-failures, --backoff-*)")?;
    supervisor.run(orderly_runtime::shutdown_on_signals()).await;
    Ok(())
}
