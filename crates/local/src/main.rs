//! `orderly-local`: the local runner. Every role in one process on one store: `demo`
//! (a run of N orders, its summary and the invariants), `up` (until Ctrl-C or SIGTERM)
//! and `bench` (throughput and latency). `orderly demo`, `orderly up` and `orderly
//! bench` run this binary.

use anyhow::Context;
use clap::{Parser, Subcommand};

mod bench;
mod console_bench;
mod local;

use local::Faults;

/// orderly-local: the whole orderly system in one process, for trying it, developing
/// against it and measuring it.
#[derive(Parser)]
#[command(name = "orderly-local", version = orderly_runtime::VERSION, about)]
struct Cli {
    /// State store for `up`: sqlite://FILE (embedded default) or
    /// postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        env = "ORDERLY_DATABASE_URL",
        default_value = "sqlite://orderly.db",
        hide_env_values = true,
        global = true
    )]
    database_url: String,

    /// Log as JSON lines instead of text (`up` logs what it does; an error comes as one
    /// JSON line).
    #[arg(long, env = "ORDERLY_LOG_JSON", global = true)]
    log_json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole system in this process on one store (SQLite by default): the
    /// remote-service simulator, two schedulers, two agents, two supervisors and a
    /// submitter. Submit N orders through the orders queue, show progress, print a
    /// summary, and check the invariants; exits non-zero if one fails.
    Demo {
        /// Orders to submit.
        #[arg(long, default_value_t = 1_000)]
        orders: usize,
        /// Fault injection: on (10% transient failures, 2% hangs, 1% permanent
        /// failures) or off.
        #[arg(long, default_value = "on")]
        faults: Faults,
        /// Give up waiting after this long.
        #[arg(long = "timeout", default_value = "5m", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
        timeout: std::time::Duration,
        /// State store; by default a new SQLite file in the temporary directory.
        #[arg(long = "store")]
        store: Option<String>,
    },
    /// Run the whole system in this process until Ctrl-C / SIGTERM.
    Up {
        /// Fault injection in the simulator.
        #[arg(long, default_value = "off")]
        faults: Faults,
        /// Serve the web dashboard here; anything but loopback needs --dashboard-token.
        #[arg(
            long,
            env = "ORDERLY_DASHBOARD_LISTEN",
            default_value = "127.0.0.1:8088"
        )]
        dashboard: std::net::SocketAddr,
        /// The dashboard's token (required off loopback).
        #[arg(long, env = "ORDERLY_DASHBOARD_TOKEN", hide_env_values = true)]
        dashboard_token: Option<String>,
    },
    /// Measure end-to-end throughput and submit->Processed latency with the simulator
    /// answering at once: a burst of N orders, then a paced run at half that rate.
    /// `bench console` measures the operators' console on a seeded store instead.
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        what: Option<BenchWhat>,
        /// Orders in the burst (5,000; 1,000 with --counters).
        #[arg(long)]
        orders: Option<usize>,
        /// State store; by default a new SQLite file in the temporary directory.
        #[arg(long = "store")]
        store: Option<String>,
        /// The paced run's rate in orders/s; by default half the burst's throughput.
        /// Give one to compare latencies at the same load across builds or stores.
        #[arg(long, value_parser = positive_rate)]
        paced_rate: Option<f64>,
        /// Then run the same phases with every role its own process, as deployed (one
        /// submitter, two schedulers, two agents, one supervisor and the simulator,
        /// from the binaries beside this one: `cargo build --release` builds them), and
        /// print both side by side.
        #[arg(long)]
        processes: bool,
        /// A quick run for the counters that do not move with the machine: a burst,
        /// then the low-load phase of 500 orders, printing per order the statements
        /// the roles sent, their round trips and commits, the store's write
        /// transactions, the rows written by table and, on PostgreSQL, the server's
        /// transactions and log.
        #[arg(long, conflicts_with_all = ["paced_rate", "processes"])]
        counters: bool,
        /// Check those counters against the limits in this file (as
        /// crates/local/bench-limits.toml); exits non-zero naming each figure over its
        /// limit.
        #[arg(long, value_name = "FILE")]
        limits: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand)]
enum BenchWhat {
    /// The operators' console at production size: seed an empty store with N finished
    /// orders over seven days, a tenth as many in Error across 50 causes and a
    /// hundredth in flight, then time every page and every read of the JSON API
    /// (p50 / p95 / max of one request after another).
    Console {
        /// Finished orders to seed.
        #[arg(long, default_value_t = 1_000_000)]
        orders: u64,
        /// State store, empty; by default a new SQLite file in the temporary directory.
        #[arg(long = "store")]
        store: Option<String>,
        /// Requests timed per page.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
    },
}

fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{s:?} is not a rate in orders/s above 0")),
    }
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Deep stacks: the dashboard of `up` serves on them.
    orderly_runtime::run_with_deep_stacks("orderly-local", run())
}

async fn run() -> anyhow::Result<()> {
    let cli: Cli = orderly_runtime::settings::parse_command_line("orderly-local");
    init_logging(&cli)?;
    match cli.command {
        Command::Demo {
            orders,
            faults,
            timeout,
            store,
        } => local::run_demo(orders, faults, timeout, store).await,
        Command::Bench {
            what:
                Some(BenchWhat::Console {
                    orders,
                    store,
                    requests,
                }),
            ..
        } => console_bench::run(orders, store, requests as usize).await,
        Command::Bench {
            what: None,
            orders,
            store,
            paced_rate,
            processes,
            counters,
            limits,
        } => {
            let mode = if counters {
                bench::Mode::Counters
            } else {
                bench::Mode::Full {
                    paced_rate,
                    processes,
                }
            };
            bench::run_bench(orders, store, mode, limits).await
        }
        Command::Up {
            faults,
            dashboard,
            dashboard_token,
        } => local::run_up(&cli.database_url, faults, dashboard, dashboard_token).await,
    }
}

/// Logs: the demo and the bench log a lot, to a file, keeping the terminal for progress
/// and the summary; `up` runs as a service, its logs say what it does, and come as JSON
/// lines with ORDERLY_LOG_JSON (as every role's do).
fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("ORDERLY_LOG").unwrap_or_else(|_| "info".into())
    };
    if matches!(cli.command, Command::Demo { .. } | Command::Bench { .. }) {
        let log = std::env::temp_dir().join(format!("orderly-{}.log", std::process::id()));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create log file {}", log.display()))?;
        eprintln!("logs: {}", log.display());
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        let log = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .with_filter(filter());
        // A counters run counts the statements from sqlx's events, logged or not.
        let counting = matches!(cli.command, Command::Bench { counters: true, .. })
            .then(orderly_local::measure::statement_counter);
        tracing_subscriber::registry()
            .with(log)
            .with(counting)
            .init();
        return Ok(());
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr);
    if cli.log_json {
        builder.json().init();
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    Ok(())
}
