//! `orderly-remote-sim`: the demo remote services, with fault injection.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use orderly_remote_sim::{Sim, SimConfig};

/// orderly-remote-sim: inventory, payment and shipping over HTTP, with faults.
#[derive(Parser)]
#[command(version = orderly_runtime::VERSION, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "ORDERLY_SIM_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Latency of every answer.
    #[arg(long = "latency", env = "ORDERLY_SIM_LATENCY", default_value = "0", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    latency_ms: Duration,
    /// Share of calls failing transiently (503/429).
    #[arg(long, env = "ORDERLY_SIM_TRANSIENT_RATE", default_value_t = 0.0)]
    transient_rate: f64,
    /// Share of idempotency keys failing permanently (422).
    #[arg(long, env = "ORDERLY_SIM_PERMANENT_RATE", default_value_t = 0.0)]
    permanent_rate: f64,
    /// Share of calls that hang.
    #[arg(long, env = "ORDERLY_SIM_HANG_RATE", default_value_t = 0.0)]
    hang_rate: f64,
    /// How long a hanging call hangs.
    #[arg(long = "hang", env = "ORDERLY_SIM_HANG", default_value = "30s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    hang_ms: Duration,
    /// Actions that always fail permanently (comma-separated).
    #[arg(long, env = "ORDERLY_SIM_PERMANENT_ACTIONS", value_delimiter = ',')]
    permanent_actions: Vec<String>,
    /// Actions that always hang, then fail without taking effect (comma-separated).
    #[arg(long, env = "ORDERLY_SIM_HANG_ACTIONS", value_delimiter = ',')]
    hang_actions: Vec<String>,
    /// Actions whose first call of a key takes effect, then hangs and fails: the reply
    /// is lost after the effect (comma-separated).
    #[arg(long, env = "ORDERLY_SIM_LOSE_REPLY_ACTIONS", value_delimiter = ',')]
    lose_reply_actions: Vec<String>,
    /// Forget an idempotency key this long after applying it (a repeat then applies
    /// again); kept for good if unset.
    #[arg(long = "forget-keys-after", env = "ORDERLY_SIM_FORGET_KEYS_AFTER", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    forget_keys_after_ms: Option<Duration>,
    /// A planned outage, ACTION@START+DURATION (e.g. `charge-payment@30s+30s`): from
    /// START after it begins serving, the action answers 503 for DURATION. Repeatable,
    /// or comma-separated in the variable. `PUT`/`DELETE /faults/down/ACTION` take an
    /// action down and bring it back at any time.
    #[arg(long = "outage", env = "ORDERLY_SIM_OUTAGES", value_delimiter = ',')]
    outages: Vec<orderly_remote_sim::Outage>,
    /// Seed of the fault dice.
    #[arg(long, env = "ORDERLY_SIM_SEED", default_value_t = 1)]
    seed: u64,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "ORDERLY_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderly_runtime::exit("orderly-remote-sim", run().await)
}

async fn run() -> anyhow::Result<()> {
    let args: Args = orderly_runtime::settings::parse("remote-sim")?;
    orderly_runtime::init_tracing(args.log_json);
    let cfg = SimConfig {
        latency: args.latency_ms,
        transient_rate: args.transient_rate,
        permanent_rate: args.permanent_rate,
        hang_rate: args.hang_rate,
        hang_for: args.hang_ms,
        permanent_actions: args.permanent_actions,
        hang_actions: args.hang_actions,
        lose_reply_actions: args.lose_reply_actions,
        forget_keys_after: args.forget_keys_after_ms,
        outages: args.outages,
        seed: args.seed,
    };
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("invalid simulator setting: {e}"))?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "remote-service simulator listening");
    // Bounded like every listener; its connection caps fit a bench's agents.
    let limits = orderly_runtime::http::Limits::from_env_over(
        orderly_runtime::http::Limits::test_service(),
    )?;
    Sim::new(cfg)
        .serve_within(listener, limits, orderly_runtime::shutdown_on_signals())
        .await;
    Ok(())
}
