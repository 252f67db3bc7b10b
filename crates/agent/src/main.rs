//! `orderly-agent`: performs workflow steps against remote services.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use std::time::Duration;

use orderly_agent::{Agent, AgentConfig, BreakerConfig, Endpoints, FleetConfig, HttpRemote};
use orderly_core::service::OutagePolicy;
use orderly_core::transport::QueueName;

/// orderly-agent: consumes step requests and calls the remote services.
#[derive(Parser)]
#[command(version = orderly_runtime::VERSION, about)]
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
    /// Base URL of the remote services; an action is POSTed to BASE/ACTION. It may carry
    /// a key (`?code=...`): its value is never shown in --help or logs.
    #[arg(
        long,
        env = "ORDERLY_REMOTE_URL",
        default_value = "http://127.0.0.1:8080/actions",
        hide_env_values = true
    )]
    remote_url: String,
    /// Per-action URL, ACTION=URL (repeatable, or comma-separated in the variable).
    #[arg(
        long = "endpoint",
        env = "ORDERLY_AGENT_ENDPOINTS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    endpoints: Vec<String>,
    /// Requests worked on at once, per queue (each queue, one remote service, has its own).
    #[arg(long, env = "ORDERLY_AGENT_CONCURRENCY", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    concurrency: u64,
    /// Most requests received from a queue at once.
    #[arg(long, env = "ORDERLY_AGENT_RECEIVE_BATCH", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    receive_batch: u32,
    /// Transient failures in a row (errors, timeouts, 5xx, 429) that open the circuit
    /// breaker of a service.
    #[arg(long, env = "ORDERLY_BREAKER_FAILURES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    breaker_failures: u32,
    /// How long an open breaker keeps this agent off its service before one try.
    #[arg(long = "breaker-open", env = "ORDERLY_BREAKER_OPEN", default_value = "2s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    breaker_open_ms: Duration,
    /// `on`: a service whose breaker opens is reported down to the whole fleet, so
    /// schedulers stop sending it work and the orders that need it wait (not counted
    /// as failures) until a probe finds it back; `off`: each agent's breaker is its own.
    #[arg(long, env = "ORDERLY_BACKPRESSURE", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    backpressure: bool,
    /// Queues (services) left out of backpressure: their breakers stay this agent's own.
    #[arg(long, env = "ORDERLY_BACKPRESSURE_OFF", value_delimiter = ',')]
    backpressure_off: Vec<String>,
    /// After a service goes down, the wait before the first probe (doubles
    /// after each failed probe).
    #[arg(long = "probe-after", env = "ORDERLY_PROBE_AFTER", default_value = "5s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    probe_after_ms: Duration,
    /// The longest wait between probes.
    #[arg(long = "probe-max", env = "ORDERLY_PROBE_MAX", default_value = "1m", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    probe_max_ms: Duration,
    /// Once a service is back, how many of the orders waiting for it resume per second.
    #[arg(long, env = "ORDERLY_RESUME_PER_SECOND", default_value_t = 200)]
    resume_per_second: u32,
}

/// `on` or `off`.
fn on_off(raw: &str) -> Result<bool, String> {
    match raw.trim() {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        other => Err(format!("{other:?}: expected on or off")),
    }
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderly_runtime::exit("orderly-agent", run().await)
}

async fn run() -> anyhow::Result<()> {
    let args: Args = orderly_runtime::settings::parse("agent")?;
    let instance = args.common.instance("agent")?;
    let _telemetry = orderly_runtime::telemetry::init("orderly-agent", &args.common, &instance)?;
    let cfg = config(&args, instance.clone())?;
    let remote = remote(&args)?;
    let fleet = fleet(&args)?;
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
        args.common.ops_listen()?,
        "agent",
        &backend,
        None,
        &shutdown,
    )
    .await?;
    // A request's deadline is read on the store's clock, not this host's.
    let clock = orderly_runtime::clock::on_store_time(backend.store.clone(), &shutdown).await;
    // Requests are checked against the workflow versions the schedulers stored.
    let fleet = args.backpressure.then_some(fleet);
    let key = opened.message_key(&instance).await?;
    Agent::wired(
        backend.store.clone(),
        backend.transport.clone(),
        Arc::new(remote),
        clock,
        cfg,
        fleet,
        key,
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

/// The remote services' client: the base URL, each action's own URL, the trust store.
fn remote(args: &Args) -> anyhow::Result<HttpRemote> {
    let mut overrides = std::collections::HashMap::new();
    for (n, e) in args.endpoints.iter().enumerate() {
        // The entry is not echoed: its URL may carry a key.
        let (action, url) = e.split_once('=').with_context(|| {
            format!(
                "invalid --endpoint / ORDERLY_AGENT_ENDPOINTS entry {}: expected ACTION=URL",
                n + 1
            )
        })?;
        overrides.insert(action.to_owned(), url.to_owned());
    }
    if !args.remote_url.starts_with("http://") && !args.remote_url.starts_with("https://") {
        anyhow::bail!(
            "invalid --remote-url / ORDERLY_REMOTE_URL: must start with http:// or https://"
        );
    }
    let trust = orderly_tls::Trust::from_env()?;
    HttpRemote::new(
        Endpoints {
            base_url: args.remote_url.clone(),
            overrides,
        },
        &trust,
    )
    .context("cannot build the HTTP client")
}

/// The agent's queues, concurrency and breaker.
fn config(args: &Args, instance: orderly_core::InstanceId) -> anyhow::Result<AgentConfig> {
    let queues = args
        .queues
        .iter()
        .map(|q| QueueName::parse(q.clone()))
        .collect::<Result<Vec<_>, _>>()
        .context("invalid --queues / ORDERLY_AGENT_QUEUES")?;
    let mut cfg = AgentConfig::new(instance, queues);
    cfg.concurrency = usize::try_from(args.concurrency).unwrap_or(64);
    cfg.receive_batch = args.receive_batch;
    cfg.breaker = BreakerConfig {
        failure_threshold: args.breaker_failures,
        open_for: args.breaker_open_ms,
    };
    Ok(cfg)
}

/// How the fleet shares what it knows of the services' outages, checked; errors name
/// the setting.
fn fleet(args: &Args) -> anyhow::Result<FleetConfig> {
    let fleet = FleetConfig {
        policy: OutagePolicy {
            probe_after: args.probe_after_ms,
            probe_max: args.probe_max_ms,
            resume_per_second: args.resume_per_second,
        },
        excluded: args
            .backpressure_off
            .iter()
            .filter(|q| !q.trim().is_empty())
            .map(|q| QueueName::parse(q.trim().to_owned()))
            .collect::<Result<_, _>>()
            .context("invalid --backpressure-off / ORDERLY_BACKPRESSURE_OFF")?,
        ..FleetConfig::default()
    };
    fleet.policy.validate().map_err(|e| {
        let setting = match e.field.as_str() {
            "probe_after" => "--probe-after / ORDERLY_PROBE_AFTER",
            "probe_max" => "--probe-max / ORDERLY_PROBE_MAX",
            _ => "--resume-per-second / ORDERLY_RESUME_PER_SECOND",
        };
        anyhow::anyhow!("invalid {setting}: {}", e.reason)
    })?;
    Ok(fleet)
}
