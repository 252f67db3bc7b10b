//! `orderly-agent`: performs workflow steps against remote services.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use orderly_agent::{Agent, AgentConfig, Endpoints, HttpRemote};
use orderly_core::SystemClock;
use orderly_core::transport::QueueName;

/// orderly-agent: consumes step requests and calls the remote services.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    common: orderly_runtime::Common,
    /// Agent queues to consume (comma-separated).
    #[arg(
        long,
        env = "ORDERLY_AGENT_QUEUES",
        value_delimiter = ',',
        default_value = "agent.inventory,agent.payment,agent.shipping"
    )]
    queues: Vec<String>,
    /// Base URL of the remote services; an action is POSTed to BASE/ACTION.
    #[arg(
        long,
        env = "ORDERLY_REMOTE_URL",
        default_value = "http://127.0.0.1:8080/actions"
    )]
    remote_url: String,
    /// Per-action URL, ACTION=URL (repeatable, or comma-separated in the variable).
    #[arg(
        long = "endpoint",
        env = "ORDERLY_AGENT_ENDPOINTS",
        value_delimiter = ','
    )]
    endpoints: Vec<String>,
    /// Requests worked on at once, per queue (each queue, one remote service, has its own).
    #[arg(long, env = "ORDERLY_AGENT_CONCURRENCY", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    concurrency: u64,
    /// Most requests received from a queue at once.
    #[arg(long, env = "ORDERLY_AGENT_RECEIVE_BATCH", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    receive_batch: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Args = orderly_runtime::settings::parse("agent")?;
    let instance = args.common.instance("agent")?;
    let _telemetry = orderly_runtime::telemetry::init("orderly-agent", &args.common, &instance)?;
    let queues = args
        .queues
        .iter()
        .map(|q| QueueName::parse(q.clone()))
        .collect::<Result<Vec<_>, _>>()
        .context("invalid --queues / ORDERLY_AGENT_QUEUES")?;
    let mut overrides = std::collections::HashMap::new();
    for e in &args.endpoints {
        let (action, url) = e.split_once('=').with_context(|| {
            format!("invalid --endpoint / ORDERLY_AGENT_ENDPOINTS {e:?}: expected ACTION=URL")
        })?;
        overrides.insert(action.to_owned(), url.to_owned());
    }
    if !args.remote_url.starts_with("http://") && !args.remote_url.starts_with("https://") {
        anyhow::bail!(
            "invalid --remote-url / ORDERLY_REMOTE_URL: must start with http:// or https://"
        );
    }
    let remote = HttpRemote::new(Endpoints {
        base_url: args.remote_url,
        overrides,
    })
    .context("cannot build the HTTP client")?;
    let mut cfg = AgentConfig::new(instance.clone(), queues);
    cfg.concurrency = usize::try_from(args.concurrency).unwrap_or(64);
    cfg.receive_batch = args.receive_batch;
    let plan = orderly_runtime::backend::Plan::new(&args.common)?;
    if args.common.checked("orderly-agent")? {
        return Ok(());
    }
    let opened = plan.open(&instance).await?;
    // It reads its request queues and answers on the replies queue.
    opened
        .ensure_queues(cfg.queues.iter().cloned().chain(std::iter::once(
            orderly_runtime::backend::queue(orderly_core::messages::queues::REPLIES),
        )))
        .await?;
    let backend = opened.backend.clone();
    let shutdown = orderly_runtime::shutdown_on_signals();
    let ops = orderly_runtime::ops::maybe_serve(
        args.common.http_listen,
        "agent",
        &backend,
        None,
        &shutdown,
    )
    .await?;
    Agent::new(
        backend.transport.clone(),
        Arc::new(remote),
        Arc::new(SystemClock),
        cfg,
    )
    .run(shutdown)
    .await;
    // What the role wrote last still goes out (Service Bus: the outbox relay drains).
    opened.finish().await;
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    Ok(())
}
