//! `orderly-submitter`: accepts orders from the orders queue.

use clap::Parser;
use orderly_submitter::{Submitter, SubmitterConfig};

/// orderly-submitter: records orders posted to the orders queue.
#[derive(Parser)]
#[command(version = orderly_runtime::VERSION, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
    /// Also accept orders over HTTP on --http-listen: POST /orders (JSON order; 202 once
    /// it is on the orders queue) and GET /orders/{id}. Off by default.
    #[arg(long, env = "ORDERLY_HTTP_INTAKE")]
    http_intake: bool,
    /// The token HTTP clients send as `Authorization: Bearer` (required when
    /// --http-listen is not loopback; a secret).
    #[arg(long, env = "ORDERLY_INTAKE_TOKEN", hide_env_values = true)]
    intake_token: Option<String>,
    /// A file holding the intake token (e.g. a mounted secret).
    #[arg(long, env = "ORDERLY_INTAKE_TOKEN_FILE")]
    intake_token_file: Option<std::path::PathBuf>,
    /// Serve the intake without a token, on loopback only: any process of this
    /// machine may then post orders (for a laptop or a sidecar). Without a token the
    /// intake does not start unless this says so.
    #[arg(long, env = "ORDERLY_INTAKE_OPEN")]
    intake_open: bool,
    /// Most orders read from the orders queue and recorded in one transaction.
    #[arg(long, env = "ORDERLY_SUBMIT_BATCH", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    submit_batch: u32,
    /// Only queues whose names start with this may be an order's `reply_to` (the
    /// clients' queues, `client-` say); unset: any queue but orderly's own. An order
    /// naming another is dead-lettered (HTTP: 400) with the reason.
    #[arg(long, env = "ORDERLY_REPLY_TO_PREFIX")]
    reply_to_prefix: Option<String>,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderly_runtime::exit("orderly-submitter", run().await)
}

async fn run() -> anyhow::Result<()> {
    let mut args: Args = orderly_runtime::settings::parse("submitter")?;
    args.intake_token = orderly_runtime::secret(
        args.intake_token.as_deref(),
        args.intake_token_file.as_deref(),
        "--intake-token / ORDERLY_INTAKE_TOKEN",
        "--intake-token-file / ORDERLY_INTAKE_TOKEN_FILE",
    )?;
    let instance = args.common.instance("submitter")?;
    let _telemetry =
        orderly_runtime::telemetry::init("orderly-submitter", &args.common, &instance)?;
    let cfg = config(&args, instance.clone())?;
    let plan = orderly_runtime::backend::Plan::new(&args.common)?;
    check_intake(&args)?;
    let ops_listen = args.common.ops_listen()?;
    let intake_on = ops_listen.clone().filter(|_| args.http_intake);
    if args.common.checked("orderly-submitter")? {
        return Ok(());
    }
    let opened = plan.open(&instance).await?;
    opened.ensure_queues([cfg.orders.clone()]).await?;
    let backend = opened.backend.clone();
    let shutdown = orderly_runtime::shutdown_on_signals();
    let ops = serve(&args, &cfg, &opened, ops_listen, intake_on, &shutdown).await?;
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

/// The submitter's batch and the reply queues its orders may name.
fn config(args: &Args, instance: orderly_core::InstanceId) -> anyhow::Result<SubmitterConfig> {
    let mut cfg = SubmitterConfig::new(instance);
    cfg.batch = args.submit_batch;
    if let Some(prefix) = &args.reply_to_prefix {
        cfg.reply_queues = orderly_core::store::ReplyQueues::prefixed(
            prefix,
            "--reply-to-prefix / ORDERLY_REPLY_TO_PREFIX",
        )?;
    }
    Ok(cfg)
}

/// The HTTP intake's settings: it needs a listener, and off loopback a token.
fn check_intake(args: &Args) -> anyhow::Result<()> {
    match (args.http_intake, args.common.http_listen) {
        (false, _) => Ok(()),
        (true, None) => anyhow::bail!(
            "--http-intake / ORDERLY_HTTP_INTAKE needs --http-listen / ORDERLY_HTTP_LISTEN (where to serve it)"
        ),
        (true, Some(addr)) => {
            orderly_submitter::intake::check(addr, args.intake_token.as_deref(), args.intake_open)
        }
    }
}

/// The operations endpoints and, if asked for, the HTTP intake beside them.
async fn serve(
    args: &Args,
    cfg: &SubmitterConfig,
    opened: &orderly_runtime::backend::Opened,
    ops_listen: Option<orderly_runtime::ops::Listen>,
    intake_on: Option<orderly_runtime::ops::Listen>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let backend = &opened.backend;
    let Some(listen) = intake_on else {
        return orderly_runtime::ops::maybe_serve(ops_listen, "submitter", backend, None, shutdown)
            .await;
    };
    let intake = orderly_submitter::intake::router(
        backend.store.clone(),
        backend.transport.clone(),
        orderly_submitter::intake::IntakeConfig {
            orders: cfg.orders.clone(),
            token: args.intake_token.clone(),
            reply_queues: cfg.reply_queues.clone(),
            // With a token, any name: a page cannot send the token, which keeps a
            // rebound one out. Without (loopback only), addresses and localhost.
            hosts: orderly_runtime::http::Hosts {
                public: None,
                any: args.intake_token.is_some(),
            },
        },
    );
    tracing::info!(listen = %listen.addr, "accepting orders over HTTP: POST /orders, GET /orders/{{id}}");
    Ok(Some(
        orderly_runtime::ops::serve(
            listen,
            "submitter",
            backend.clone(),
            None,
            Some(intake),
            shutdown.clone(),
        )
        .await?,
    ))
}
