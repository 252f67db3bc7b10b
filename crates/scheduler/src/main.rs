//! `orderly-scheduler`: claims orders and drives their workflow.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use orderly_scheduler::{Scheduler, SchedulerConfig};

/// orderly-scheduler: claims due orders and drives each through its workflow.
#[derive(Parser)]
#[command(version = orderly_runtime::VERSION, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
    /// Workflow files (TOML; repeat the flag or separate with commas). The first is
    /// the default for orders that name none. Orders are pinned to the version they
    /// start under: to change a workflow with orders in flight, give the new file
    /// first and keep the old one after it until `orderly workflows` shows none of its
    /// orders left. Without any, the default order workflow.
    #[arg(long, env = "ORDERLY_WORKFLOW", value_delimiter = ',')]
    workflow: Vec<PathBuf>,
    /// An order's deadline after its claim (default: the workflow's total budget).
    #[arg(long = "processing-timeout", env = "ORDERLY_PROCESSING_TIMEOUT", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    processing_timeout_ms: Option<Duration>,
    /// Most orders claimed at once.
    #[arg(long, env = "ORDERLY_CLAIM_BATCH", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    claim_batch: u32,
    /// Most replies applied in one transaction.
    #[arg(long, env = "ORDERLY_REPLY_BATCH", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    reply_batch: u32,
    /// With nothing to claim, the longest wait before looking again while other
    /// processes' writes are not heard, or an order is due that it did not take: new,
    /// released and recovered orders wake it at once; while writes are heard it
    /// waits until the next order's back-off ends (at most 5 s) instead.
    #[arg(long = "claim-poll", env = "ORDERLY_CLAIM_POLL", default_value = "250ms", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::period)]
    claim_poll_ms: Duration,
    /// Most orders this instance holds at once.
    #[arg(long, env = "ORDERLY_MAX_IN_FLIGHT", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_in_flight: u32,
    /// On SIGTERM: how long to keep finishing the orders it holds (claiming none) before handing the rest back.
    #[arg(long = "shutdown-grace", env = "ORDERLY_SHUTDOWN_GRACE", default_value = "10s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    shutdown_grace_ms: Duration,
    /// How often it looks for Pending orders of workflows it does not run and logs a
    /// warning naming them.
    #[arg(long = "unserved-check", env = "ORDERLY_UNSERVED_CHECK", default_value = "30s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    unserved_check_ms: Duration,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderly_runtime::exit("orderly-scheduler", run().await)
}

async fn run() -> anyhow::Result<()> {
    let args: Args = orderly_runtime::settings::parse("scheduler")?;
    let instance = args.common.instance("scheduler")?;
    let _telemetry =
        orderly_runtime::telemetry::init("orderly-scheduler", &args.common, &instance)?;
    let workflows = Arc::new(orderly_runtime::load_workflows(&args.workflow)?);
    let plan = orderly_runtime::backend::Plan::new(&args.common)?;
    if args.common.checked("orderly-scheduler")? {
        return Ok(());
    }
    let opened = plan.open(&instance).await?;
    // It reads replies and sends each step's requests.
    opened
        .ensure_queues(
            std::iter::once(orderly_runtime::backend::queue(
                orderly_core::messages::queues::REPLIES,
            ))
            .chain(workflows.queues()),
        )
        .await?;
    let backend = opened.backend.clone();
    let mut cfg = SchedulerConfig::new(instance.clone(), workflows);
    cfg.claim_batch = args.claim_batch;
    cfg.reply_batch = args.reply_batch;
    cfg.claim_poll = args.claim_poll_ms;
    cfg.max_in_flight = args.max_in_flight;
    cfg.shutdown_grace = args.shutdown_grace_ms;
    cfg.unserved_check = args.unserved_check_ms;
    if let Some(t) = args.processing_timeout_ms {
        cfg.processing_timeout = t;
    }
    let shutdown = orderly_runtime::shutdown_on_signals();
    let ops = orderly_runtime::ops::maybe_serve(
        args.common.ops_listen()?,
        "scheduler",
        &backend,
        None,
        &shutdown,
    )
    .await?;
    // Replies are in time by the store's clock, not this host's.
    let clock = orderly_runtime::clock::on_store_time(backend.store.clone(), &shutdown).await;
    // It sends no request to a service the fleet sees down (agents report it).
    let key = opened.message_key(&instance).await?;
    Scheduler::wired(backend.store, backend.transport, clock, cfg, key)
        .run(shutdown)
        .await;
    // What the role wrote last still goes out (Service Bus: the outbox relay drains).
    opened.finish().await;
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    Ok(())
}
