//! `orderly`: the operator and developer command line. Thin: parse, connect, call the
//! store (or start the embedded system), print.

use std::io::Read;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use orderly_core::store::{NewOrder, OrderFilter, SubmitOutcome};
use orderly_core::transport::QueueName;
use orderly_core::{Actor, OrderId, ProcessState, TimeSource};

use orderly_cli::demo;
use orderly_cli::sample;
use orderly_cli::system::{System, SystemConfig};
use orderly_remote_sim::SimConfig;

mod outbox;
mod post;
mod print;

/// orderly: Scheduler-Agent-Supervisor order processing.
#[derive(Parser)]
#[command(name = "orderly", version, about)]
struct Cli {
    /// State store: sqlite://FILE (embedded default) or postgres://USER@HOST:PORT/DB.
    #[arg(
        long,
        env = "ORDERLY_DATABASE_URL",
        default_value = "sqlite://orderly.db",
        hide_env_values = true,
        global = true
    )]
    database_url: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending migrations and declare the queues of the SQL transport (both also
    /// happen when a role starts): orders, replies, alerts and each workflow step's queue,
    /// created with the defaults if missing, left as they are if present.
    Migrate {
        /// The workflow files whose step queues to declare (repeat or separate with
        /// commas; default: the built-in order workflow).
        #[arg(long, env = "ORDERLY_WORKFLOW", value_delimiter = ',')]
        workflow: Vec<std::path::PathBuf>,
    },
    /// Post orders to the orders queue as a client does (through the submitter): a JSON
    /// file (`-` for stdin) of one order or an array, or samples; on the SQL queue or
    /// Service Bus. `--wait` follows them to their end.
    Post(post::PostArgs),
    /// The outbox (used with Service Bus): messages waiting to be published, and those
    /// set aside as undeliverable (queue missing, or too many failures) with why.
    Outbox {
        /// Publish the undeliverable ones again (after fixing the cause).
        #[arg(long)]
        requeue: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import orders straight into the state store, BYPASSING the orders queue and the
    /// submitter (no dead-lettering, no `received` notice): an operator's direct import.
    /// Clients post with `orderly post`.
    Submit {
        /// File with `{"order_id": ..., "details": {...}, "reply_to": ...}` or an array of them.
        file: Option<String>,
        /// Submit N generated sample orders instead.
        #[arg(long, conflicts_with = "file")]
        sample: Option<u64>,
        /// Who is submitting (recorded in each order's history).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// List orders, oldest first.
    List {
        #[command(flatten)]
        filter: Filter,
        /// Page size.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one order: state, details, steps and its full history.
    Show {
        /// The order id.
        order_id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Count orders by state.
    Counts,
    /// The orders in flight (Pending, Processing) by workflow version: which versions
    /// still have orders, so their schedulers (or their files) can be retired once
    /// none are left, and which orders wait for a scheduler that runs their workflow.
    Workflows {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send an Error order round again (Pending, fresh failure budget).
    Resubmit {
        /// The order id.
        #[arg(required_unless_present = "all")]
        order_id: Option<String>,
        /// Every Error order the filter selects (asks first unless --yes).
        #[arg(long, conflicts_with = "order_id")]
        all: bool,
        #[command(flatten)]
        filter: Filter,
        /// Confirm --all without asking.
        #[arg(long)]
        yes: bool,
        /// Why, for the history.
        #[arg(long)]
        reason: String,
        /// Who is acting.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Cancel a Pending, Processing or Error order. Steps that may have taken effect
    /// are undone first (by a scheduler, in reverse order), then it is Cancelled.
    Cancel {
        /// The order id.
        #[arg(required_unless_present = "all")]
        order_id: Option<String>,
        /// Every order the filter selects (asks first unless --yes).
        #[arg(long, conflicts_with = "order_id", requires = "state")]
        all: bool,
        #[command(flatten)]
        filter: Filter,
        /// Confirm --all without asking.
        #[arg(long)]
        yes: bool,
        /// Why, for the history.
        #[arg(long)]
        reason: String,
        /// Who is acting.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// Cancel at once without undoing completed steps.
        #[arg(long)]
        no_compensation: bool,
    },
    /// List operator alerts (orders that ended in Error), newest first.
    Alerts {
        /// Include acknowledged alerts.
        #[arg(long)]
        all: bool,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Acknowledge this alert ("seen, being handled") instead of listing.
        #[arg(long, value_name = "ALERT_ID")]
        ack: Option<i64>,
        /// Who is acknowledging.
        #[arg(long, env = "ORDERLY_OPERATOR", default_value = "cli")]
        operator: String,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serve the web dashboard: overview, Error triage, orders with their timeline,
    /// retry and cancel, dead letters.
    Dashboard {
        /// Address to serve on; anything but loopback needs --token.
        #[arg(
            long,
            env = "ORDERLY_DASHBOARD_LISTEN",
            default_value = "127.0.0.1:8088"
        )]
        listen: std::net::SocketAddr,
        /// Required for a non-loopback address; give it once as ?token=...
        #[arg(long, env = "ORDERLY_DASHBOARD_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Settings files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Show the supervisors' current leader: holder, term (epoch), lease.
    Leader {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show every queue's depth: ready, locked, scheduled, dead-lettered.
    Queues {
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List a queue's dead-lettered messages with why, oldest first.
    DeadLetters {
        /// The queue, e.g. orders.
        queue: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON lines (with the body) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Put dead-lettered messages back on their queue once the cause is fixed.
    Requeue {
        /// The queue.
        queue: String,
        /// The message id to requeue.
        #[arg(required_unless_present = "all")]
        message_id: Option<String>,
        /// Requeue every dead letter of the queue.
        #[arg(long, conflicts_with = "message_id")]
        all: bool,
        /// Confirm --all without asking.
        #[arg(long)]
        yes: bool,
    },
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
        /// Give up waiting after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
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
    Bench {
        /// Orders in the burst.
        #[arg(long, default_value_t = 5_000)]
        orders: usize,
        /// State store; by default a new SQLite file in the temporary directory.
        #[arg(long = "store")]
        store: Option<String>,
    },
}

/// Which orders: by state, error text, step, age.
#[derive(clap::Args, Clone, Debug, Default)]
struct Filter {
    /// Only this state (Pending, Processing, Processed, Error, Cancelled).
    #[arg(long)]
    state: Option<ProcessState>,
    /// Only orders whose last error contains this text.
    #[arg(long)]
    error: Option<String>,
    /// Only orders at this step (0-based index).
    #[arg(long)]
    step: Option<i32>,
    /// Only orders created more than this many seconds ago.
    #[arg(long, value_name = "SECS")]
    older_than: Option<u64>,
}

impl Filter {
    fn to_store(&self, limit: u32) -> OrderFilter {
        OrderFilter {
            state: self.state,
            error_contains: self.error.clone(),
            current_step: self.step,
            created_before: self.older_than.map(|s| {
                chrono::Utc::now()
                    - chrono::Duration::seconds(i64::try_from(s).unwrap_or(i64::MAX / 2))
            }),
            limit,
            ..Default::default()
        }
    }
}

/// Every order `filter` selects, page by page.
async fn select_all(
    store: &dyn orderly_core::store::StateStore,
    filter: &Filter,
) -> anyhow::Result<Vec<OrderId>> {
    let mut query = filter.to_store(500);
    let mut ids = Vec::new();
    loop {
        let page = store.list(&query).await?;
        ids.extend(page.orders.into_iter().map(|o| o.order_id));
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(ids),
        }
    }
}

/// The orders one command acts on: the one named, or all the filter selects once the
/// operator confirmed.
async fn targets(
    store: &dyn orderly_core::store::StateStore,
    order_id: Option<String>,
    filter: &Filter,
    yes: bool,
    verb: &str,
) -> anyhow::Result<Vec<OrderId>> {
    if let Some(id) = order_id {
        return Ok(vec![OrderId::parse(id)?]);
    }
    let ids = select_all(store, filter).await?;
    if ids.is_empty() {
        bail!("no order matches the filter");
    }
    if !yes && !confirm(&format!("{verb} {} orders?", ids.len()))? {
        bail!("nothing done");
    }
    Ok(ids)
}

/// What `orderly config` does.
#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a settings file (TOML) as each worker role would read it, with this
    /// environment: unknown keys and invalid values are named; exits non-zero if any.
    Check {
        /// The file.
        file: std::path::PathBuf,
    },
}

/// Fault injection presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Faults {
    On,
    Off,
}

impl Faults {
    fn sim(self) -> SimConfig {
        match self {
            Faults::Off => SimConfig::default(),
            Faults::On => SimConfig {
                transient_rate: 0.10,
                hang_rate: 0.02,
                permanent_rate: 0.01,
                ..SimConfig::default()
            },
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = |default: &str| {
        tracing_subscriber::EnvFilter::try_from_env("ORDERLY_LOG")
            .unwrap_or_else(|_| default.into())
    };
    match &cli.command {
        // The in-process system logs a lot; keep the terminal for progress and the summary.
        Command::Demo { .. } | Command::Bench { .. } => {
            let log = std::env::temp_dir().join(format!("orderly-{}.log", std::process::id()));
            let file = std::fs::File::create(&log)
                .with_context(|| format!("cannot create log file {}", log.display()))?;
            eprintln!("logs: {}", log.display());
            tracing_subscriber::fmt()
                .with_env_filter(filter("info"))
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        _ => tracing_subscriber::fmt()
            .with_env_filter(filter(if matches!(cli.command, Command::Up { .. }) {
                "info"
            } else {
                "warn"
            }))
            .with_writer(std::io::stderr)
            .init(),
    }
    let cli = match cli.command {
        Command::Post(args) => return post::run(args, &cli.database_url).await,
        Command::Outbox { requeue, json } => {
            return outbox::run(&cli.database_url, requeue, json).await;
        }
        command => Cli {
            command,
            database_url: cli.database_url,
        },
    };
    match &cli.command {
        Command::Demo {
            orders,
            faults,
            timeout_secs,
            store,
        } => return run_demo(*orders, *faults, *timeout_secs, store.clone()).await,
        Command::Bench { orders, store } => return run_bench(*orders, store.clone()).await,
        Command::Up {
            faults,
            dashboard,
            dashboard_token,
        } => {
            return run_up(
                &cli.database_url,
                *faults,
                *dashboard,
                dashboard_token.clone(),
            )
            .await;
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => return check_config(file),

        Command::Dashboard { listen, token } => {
            let backend = orderly_sql::connect(&cli.database_url, TimeSource::Database)
                .await
                .context(
                    "cannot open the state store named by --database-url / ORDERLY_DATABASE_URL",
                )?;
            let shutdown = orderly_runtime::shutdown_on_signals();
            let ops = orderly_cli::ops::endpoints(
                "dashboard",
                backend.clone(),
                orderly_cli::ops::install_metrics()?,
                Vec::new(),
            );
            let (addr, task) =
                orderly_cli::dashboard::serve(*listen, backend, token.clone(), ops, shutdown)
                    .await?;
            println!("dashboard on http://{addr}/");
            task.await?;
            return Ok(());
        }
        _ => {}
    }
    let backend = orderly_sql::connect(&cli.database_url, TimeSource::Database)
        .await
        .context("cannot open the state store named by --database-url / ORDERLY_DATABASE_URL")?;
    let store = backend.store.clone();

    match cli.command {
        // Dispatched before the store is opened (it may not need it).
        Command::Post(_) | Command::Outbox { .. } => {
            unreachable!("dispatched above")
        }
        Command::Migrate { workflow } => {
            let workflows = orderly_runtime::load_workflows(&workflow)?;
            let wanted: Vec<QueueName> = orderly_cli::backend::fixed_queues()
                .into_iter()
                .chain(workflows.queues())
                .collect();
            orderly_cli::backend::ensure_queues(backend.transport.as_ref(), wanted.clone()).await?;
            println!("migrations applied; the store is up to date");
            let names: Vec<&str> = wanted.iter().map(QueueName::as_str).collect();
            println!("queues declared: {}", names.join(", "));
        }
        Command::Submit {
            file,
            sample,
            operator,
        } => {
            let submitter = Actor::operator(&operator);
            let orders = match (file, sample) {
                (_, Some(n)) => (0..n).map(sample::order).collect(),
                (Some(path), None) => read_orders(&path)?,
                (None, None) => bail!("give a JSON file (or - for stdin), or --sample N"),
            };
            let (mut accepted, mut duplicates) = (0, 0);
            for order in &orders {
                match store
                    .submit(order, &submitter, &[])
                    .await
                    .with_context(|| format!("order {}", order.order_id))?
                {
                    SubmitOutcome::Accepted => accepted += 1,
                    SubmitOutcome::Duplicate => duplicates += 1,
                }
            }
            println!(
                "submitted {} orders: {accepted} accepted, {duplicates} duplicates",
                orders.len()
            );
        }
        Command::List {
            filter,
            limit,
            json,
        } => {
            let page = store.list(&filter.to_store(limit)).await?;
            print::orders(&page.orders, json)?;
            if page.next.is_some() && !json {
                println!("(more orders: raise --limit or filter)");
            }
        }
        Command::Show { order_id, json } => {
            let view = store.get(&OrderId::parse(order_id)?).await?;
            print::order(&view, json)?;
        }
        Command::Counts => {
            for (state, n) in store.count_by_state().await? {
                println!("{:<11} {n}", state.as_str());
            }
        }
        Command::Workflows { json } => {
            print::workflows(&store.workflows_in_flight().await?, json)?;
        }
        Command::Resubmit {
            order_id,
            all: _,
            mut filter,
            yes,
            reason,
            operator,
        } => {
            filter.state = Some(ProcessState::Error);
            let one = order_id.is_some();
            let ids = targets(store.as_ref(), order_id, &filter, true, "resubmit").await?;
            // What each retry will do: continue from the failed step, or (some step was
            // undone) run afresh from the first step under a new generation.
            let mut plans = Vec::with_capacity(ids.len());
            for id in &ids {
                let view = store.get(id).await?;
                let plan = orderly_core::RetryPlan::for_order(
                    view.state.generation,
                    view.state.current_step,
                    &view.steps,
                );
                plans.push((view.state.generation, plan));
            }
            if !one && !yes {
                let fresh = plans
                    .iter()
                    .filter(|(_, p)| matches!(p, orderly_core::RetryPlan::FreshRun { .. }))
                    .count();
                let question = format!(
                    "resubmit {} orders? {} continue from their failed step; {fresh} run afresh \
                     from the first step (steps of theirs were undone, so the redo gets new \
                     idempotency keys)",
                    ids.len(),
                    ids.len() - fresh
                );
                if !confirm(&question)? {
                    bail!("nothing done");
                }
            }
            let actor = Actor::operator(&operator);
            let mut failed = 0;
            for (id, (generation, plan)) in ids.iter().zip(plans) {
                match store.resubmit(id, &actor, &reason, &[]).await {
                    Ok(row) => {
                        let what = if row.generation > generation {
                            plan.describe()
                        } else {
                            orderly_core::RetryPlan::Continue {
                                from_step: row.current_step,
                            }
                            .describe()
                        };
                        println!(
                            "order {} is {} again: {what}",
                            row.order_id, row.process_state
                        )
                    }
                    Err(e) => {
                        failed += 1;
                        eprintln!("order {id}: {e}");
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} orders not resubmitted", ids.len());
            }
        }
        Command::Cancel {
            order_id,
            all: _,
            filter,
            yes,
            reason,
            operator,
            no_compensation,
        } => {
            let ids = targets(store.as_ref(), order_id, &filter, yes, "cancel").await?;
            let actor = Actor::operator(&operator);
            let mut failed = 0;
            for id in &ids {
                let row = if no_compensation {
                    store.cancel(id, &actor, &reason, &[]).await
                } else {
                    store.request_cancel(id, &actor, &reason, &[]).await
                };
                match row {
                    Ok(row) if row.finish_as == Some(ProcessState::Cancelled) => println!(
                        "order {} will be Cancelled once its completed steps are undone",
                        row.order_id
                    ),
                    Ok(row) => println!("order {} is {}", row.order_id, row.process_state),
                    Err(e) => {
                        failed += 1;
                        eprintln!("order {id}: {e}");
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} orders not cancelled", ids.len());
            }
        }
        Command::Alerts {
            all,
            limit,
            ack: Some(id),
            operator,
            json,
        } => {
            let _ = (all, limit);
            let Some(alert) = store
                .acknowledge_alert(id, &Actor::operator(&operator))
                .await?
            else {
                bail!("no alert #{id}");
            };
            print::alerts(std::slice::from_ref(&alert), json)?;
        }
        Command::Alerts {
            all, limit, json, ..
        } => print::alerts(&store.alerts(!all, limit).await?, json)?,
        Command::Leader { json } => {
            let term = store.term(orderly_supervisor::LEADERSHIP).await?;
            print::leader(term.as_ref(), json)?;
        }
        Command::Queues { json } => print::depths(&backend.inspector.depths().await?, json)?,
        Command::DeadLetters { queue, limit, json } => {
            let queue = QueueName::parse(queue)?;
            print::dead_letters(&backend.transport.dead_letters(&queue, limit).await?, json)?;
        }
        Command::Requeue {
            queue,
            message_id,
            all,
            yes,
        } => {
            let queue = QueueName::parse(queue)?;
            if all && !yes {
                let n = backend
                    .transport
                    .dead_letters(&queue, u32::MAX)
                    .await?
                    .len();
                if !confirm(&format!("requeue all {n} dead letters of {queue}?"))? {
                    bail!("nothing requeued");
                }
            }
            let n = backend
                .inspector
                .requeue_dead_letters(&queue, message_id.as_deref())
                .await?;
            if n == 0 {
                bail!("no such dead letter on {queue}");
            }
            println!("requeued {n} message(s) on {queue}");
        }
        Command::Demo { .. }
        | Command::Up { .. }
        | Command::Bench { .. }
        | Command::Config { .. }
        | Command::Dashboard { .. } => {}
    }
    Ok(())
}

/// Runs each worker role's binary (beside this one) with `--config FILE
/// --check-config`: the same layering and checks it does at start-up, nothing started.
fn check_config(file: &std::path::Path) -> anyhow::Result<()> {
    let dir = std::env::current_exe()
        .context("cannot find this executable")?
        .parent()
        .map(std::path::Path::to_path_buf)
        .context("cannot find this executable's directory")?;
    let mut failed = Vec::new();
    for role in ["submitter", "scheduler", "agent", "supervisor"] {
        let bin = dir.join(format!("orderly-{role}"));
        let out = std::process::Command::new(&bin)
            .arg("--config")
            .arg(file)
            .arg("--check-config")
            .env_remove("ORDERLY_CONFIG")
            .output()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        if out.status.success() {
            print!("{}", String::from_utf8_lossy(&out.stdout));
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            let first = err
                .lines()
                .find(|l| !l.trim().is_empty() && !l.contains(" INFO "))
                .unwrap_or("failed");
            println!("orderly-{role}: {}", first.trim_start_matches("Error: "));
            failed.push(role);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("invalid settings for: {}", failed.join(", "))
    }
}

/// Asks on the terminal; anything but y/yes is no (and so is a closed stdin).
fn confirm(question: &str) -> anyhow::Result<bool> {
    use std::io::Write;
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// A fresh SQLite file for one run, in the temporary directory.
fn scratch_sqlite(what: &str) -> String {
    let file = std::env::temp_dir().join(format!(
        "orderly-{what}-{}.db",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    format!("sqlite://{}", file.display())
}

async fn run_demo(
    orders: usize,
    faults: Faults,
    timeout_secs: u64,
    store: Option<String>,
) -> anyhow::Result<()> {
    let url = store.unwrap_or_else(|| scratch_sqlite("demo"));
    let backend = orderly_sql::connect(&url, TimeSource::Database)
        .await
        .context("cannot open the demo's state store (--store)")?;
    let mut cfg = SystemConfig::new().quick();
    cfg.sim = Some(faults.sim());
    let workflows = orderly_core::workflow::Workflows::single(cfg.workflow.clone())?;
    eprintln!(
        "orderly demo: {orders} orders, faults {}, store {}",
        if faults == Faults::On { "on" } else { "off" },
        if url.starts_with("sqlite:") {
            url.as_str()
        } else {
            "(given by --store)"
        }
    );
    let system = System::start(backend, cfg).await?;
    let batch = sample_batch(orders);
    let sent_at = demo::submit(&system, &batch).await?;
    let finished = demo::wait_done(
        &system,
        orders,
        std::time::Duration::from_secs(timeout_secs),
    )
    .await?;
    let mut report = demo::report(&system, &sent_at, &workflows, true).await?;
    system.stop(std::time::Duration::from_secs(5)).await;
    if !finished {
        report.violations.insert(
            0,
            format!("not every order finished within {timeout_secs} s"),
        );
    }
    report.print();
    if url.starts_with("sqlite:") {
        println!("inspect it: orderly --database-url {url} list --state Error");
    }
    if report.violations.is_empty() {
        Ok(())
    } else {
        bail!("{} invariant violations", report.violations.len())
    }
}

fn sample_batch(n: usize) -> Vec<NewOrder> {
    demo::sample_orders(n)
}

async fn run_bench(orders: usize, store: Option<String>) -> anyhow::Result<()> {
    let url = store.unwrap_or_else(|| scratch_sqlite("bench"));
    let backend = orderly_sql::connect(&url, TimeSource::Database)
        .await
        .context("cannot open the benchmark's state store (--store)")?;
    let dialect = if url.starts_with("sqlite:") {
        "SQLite"
    } else {
        "PostgreSQL"
    };
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(SimConfig::default());
    let workflows = orderly_core::workflow::Workflows::single(cfg.workflow.clone())?;
    let system = System::start(backend, cfg).await?;
    // Burst: everything at once; throughput at saturation.
    let burst = demo::sample_orders(orders);
    let sent_at = demo::submit(&system, &burst).await?;
    if !demo::wait_done(&system, orders, std::time::Duration::from_secs(600)).await? {
        bail!("the burst did not finish within 600 s");
    }
    let peak = demo::report(&system, &sent_at, &workflows, true).await?;
    println!(
        "== {dialect}: burst of {orders} orders (three steps each, simulator answering at once)"
    );
    peak.print();
    // Paced: half the burst's throughput, for latency under a steady load.
    let rate = (peak.throughput() / 2.0).max(1.0);
    let paced_n = orders.min((rate * 10.0) as usize).max(100);
    let paced = demo::sample_orders(paced_n);
    let mut sent_at = std::collections::HashMap::new();
    let started = std::time::Instant::now();
    for (i, chunk) in paced.chunks(10).enumerate() {
        let due = started + std::time::Duration::from_secs_f64((i * 10) as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        sent_at.extend(demo::submit(&system, chunk).await?);
    }
    let before = peak.count(ProcessState::Processed) + peak.count(ProcessState::Error);
    if !demo::wait_done(
        &system,
        before + paced_n,
        std::time::Duration::from_secs(600),
    )
    .await?
    {
        bail!("the paced run did not finish within 600 s");
    }
    let steady = demo::report(&system, &sent_at, &workflows, true).await?;
    system.stop(std::time::Duration::from_secs(5)).await;
    println!("== {dialect}: paced at {rate:.0} orders/s (half the burst's), {paced_n} orders");
    steady.print();
    if !peak.violations.is_empty() || !steady.violations.is_empty() {
        bail!("invariant violations during the benchmark");
    }
    Ok(())
}

async fn run_up(
    url: &str,
    faults: Faults,
    dashboard: std::net::SocketAddr,
    token: Option<String>,
) -> anyhow::Result<()> {
    let backend = orderly_sql::connect(url, TimeSource::Database)
        .await
        .context("cannot open the state store (--database-url / ORDERLY_DATABASE_URL)")?;
    let shutdown = orderly_runtime::shutdown_on_signals();
    // Installed before the roles start, so that none of their measurements is lost.
    let metrics = orderly_cli::ops::install_metrics()?;
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(faults.sim());
    let system = System::start(backend.clone(), cfg).await?;
    let ops =
        orderly_cli::ops::endpoints("embedded", backend.clone(), metrics, system.leaders.clone());
    let (dash_addr, dash) =
        match orderly_cli::dashboard::serve(dashboard, backend, token, ops, shutdown.clone()).await
        {
            Ok(served) => served,
            Err(e) => {
                system.stop(std::time::Duration::from_secs(10)).await;
                return Err(e);
            }
        };
    eprintln!(
        "orderly is up: post orders with `orderly post --sample 10 --wait` (through the \"orders\" queue); simulator on {}; dashboard on http://{dash_addr}/; Ctrl-C or SIGTERM stops",
        system.sim_addr.map(|a| a.to_string()).unwrap_or_default()
    );
    shutdown.cancelled().await;
    eprintln!("stopping...");
    system.stop(std::time::Duration::from_secs(10)).await;
    let _ = dash.await;
    Ok(())
}

fn read_orders(path: &str) -> anyhow::Result<Vec<NewOrder>> {
    let mut text = String::new();
    if path == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    }
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{path} is not JSON"))?;
    let items = match value {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let order: NewOrder = serde_json::from_value(item)
                .with_context(|| format!("{path}: order #{i} is invalid"))?;
            order
                .validate()
                .with_context(|| format!("{path}: order #{i} is invalid"))?;
            Ok(order)
        })
        .collect()
}
