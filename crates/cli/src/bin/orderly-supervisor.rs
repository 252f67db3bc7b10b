//! `orderly-supervisor`: while it leads, recovers timed-out orders and publishes alerts;
//! otherwise follows, ready to take over.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use orderly_cli::election::ElectionArgs;
use orderly_core::TimeSource;
use orderly_supervisor::{Supervisor, SupervisorConfig};

/// orderly-supervisor: recovers orders whose deadline passed and publishes operator
/// alerts, on the one instance elected leader.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
    #[command(flatten)]
    election: ElectionArgs,
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
    let instance = args.common.instance("supervisor")?;
    // Settings first: a wrong one stops start-up before any connection is made.
    let election = args.election.prepare()?;
    let mut cfg = SupervisorConfig::new(instance.clone());
    cfg.interval = args.interval_ms;
    cfg.policy.max_failures = args.max_failures;
    cfg.policy.backoff_base = args.backoff_base_ms;
    cfg.policy.backoff_max = args.backoff_max_ms;
    cfg.policy
        .validate()
        .context("invalid recovery settings (--max-failures, --backoff-*)")?;
    let backend = orderly_sql::connect(&args.common.database_url, TimeSource::Database)
        .await
        .context("cannot open the state store (--database-url / ORDERLY_DATABASE_URL)")?;
    let elector = election.elector(backend.store.clone(), instance)?;
    let supervisor = Supervisor::new(backend.store, backend.transport, cfg)
        .context("invalid recovery settings (--max-failures, --backoff-*)")?;
    supervisor
        .run(Arc::new(elector), orderly_runtime::shutdown_on_signals())
        .await;
    Ok(())
}
