//! `orderly-submitter`: accepts orders from the orders queue.

use anyhow::Context;
use clap::Parser;
use orderly_core::TimeSource;
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
    orderly_runtime::init_tracing(args.common.log_json);
    let cfg = SubmitterConfig::new(args.common.instance("submitter")?);
    if args.common.checked("orderly-submitter") {
        return Ok(());
    }
    let backend = orderly_sql::connect(&args.common.database_url, TimeSource::Database)
        .await
        .context("cannot open the state store (--database-url / ORDERLY_DATABASE_URL)")?;
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
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    Ok(())
}
