//! `orderly-submitter`: accepts orders from the orders queue.

use clap::Parser;
use orderly_submitter::{Submitter, SubmitterConfig};

/// orderly-submitter: records orders posted to the orders queue.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Args = orderly_runtime::settings::parse("submitter")?;
    let instance = args.common.instance("submitter")?;
    let _telemetry =
        orderly_runtime::telemetry::init("orderly-submitter", &args.common, &instance)?;
    let cfg = SubmitterConfig::new(instance.clone());
    let plan = orderly_cli::backend::Plan::new(&args.common)?;
    if args.common.checked("orderly-submitter") {
        return Ok(());
    }
    let opened = plan.open(&instance).await?;
    let backend = opened.backend.clone();
    let shutdown = orderly_runtime::shutdown_on_signals();
    let ops = orderly_cli::ops::maybe_serve(
        args.common.http_listen,
        "submitter",
        &backend,
        None,
        &shutdown,
    )
    .await?;
    Submitter::new(backend.store, backend.transport, cfg)
        .run(shutdown)
        .await;
    // What the role wrote last still goes out (Service Bus: the outbox relay drains).
    opened.finish().await;
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    Ok(())
}
