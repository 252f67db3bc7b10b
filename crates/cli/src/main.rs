//! `orderly`: the operator and developer command line. Thin: parse, connect, call the
//! store (or start the embedded system), print.

use anyhow::Context;
use clap::{Parser, Subcommand};
use orderly_core::ProcessState;

mod commands;
mod config;
mod outbox;
mod post;
mod print;
mod provision;
mod triage;

use config::ConfigCommand;
use triage::Filter;

/// orderly: Scheduler-Agent-Supervisor order processing.
#[derive(Parser)]
#[command(
    name = "orderly",
    version = orderly_runtime::VERSION,
    about,
    after_help = EXIT_CODES
)]
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

    /// Log as JSON lines instead of text (`up` and `dashboard` log what they do; every
    /// command's error comes as one JSON line).
    #[arg(long, env = "ORDERLY_LOG_JSON", global = true)]
    log_json: bool,

    /// Print for tools: one JSON object a line on standard output (NDJSON): one per
    /// item of a list, per order or message acted on, or the one thing shown, and
    /// nothing else there; questions and progress go to standard error, and so does an
    /// error, as one JSON line.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

/// What every command's exit code means (docs/running.md, "Exit codes").
const EXIT_CODES: &str = "Exit codes: 0 done; 1 the command failed (why on stderr: a store \
    or broker that cannot be reached, an operation refused, orders posted with --wait that \
    did not complete); 2 the command line or a setting was refused (named on stderr). \
    demo, up and bench exit as orderly-local does.";

/// Which transport's queues a queue command looks at.
#[derive(clap::Args, Debug)]
struct QueueTransport {
    /// `sql` (the queue in the state store's database, --database-url) or `servicebus`.
    #[arg(long, env = "ORDERLY_TRANSPORT", value_enum, default_value = "sql")]
    transport: orderly_runtime::TransportKind,
    #[command(flatten)]
    servicebus: orderly_runtime::ServiceBusArgs,
}

impl QueueTransport {
    /// The transport and its operations.
    async fn open(
        &self,
        database_url: &str,
    ) -> anyhow::Result<(
        std::sync::Arc<dyn orderly_core::transport::Transport>,
        std::sync::Arc<dyn orderly_core::transport::QueueInspector>,
    )> {
        match self.transport {
            orderly_runtime::TransportKind::Sql => {
                let backend = orderly_runtime::backend::connect_store(database_url)
                    .await
                    .context(
                        "cannot open the state store named by --database-url / ORDERLY_DATABASE_URL",
                    )?;
                Ok((backend.transport, backend.inspector))
            }
            orderly_runtime::TransportKind::Servicebus => {
                orderly_runtime::backend::servicebus_operator(&self.servicebus).await
            }
        }
    }

    fn is_servicebus(&self) -> bool {
        self.transport == orderly_runtime::TransportKind::Servicebus
    }
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending migrations, declare the queues of the SQL transport (both also
    /// happen when a role starts): orders, replies, alerts and each workflow step's queue,
    /// created with the defaults if missing, left as they are if present; and store the
    /// workflows' versions, which every scheduler then runs.
    Migrate {
        /// The workflow files whose step queues to declare (repeat or separate with
        /// commas; default: the built-in order workflow).
        #[arg(long, env = "ORDERLY_WORKFLOW", value_delimiter = ',')]
        workflow: Vec<std::path::PathBuf>,
    },
    /// Print what a deployment on Azure needs for these workflows (Service Bus queues
    /// with their lock, deliveries and duplicate detection; the lease's storage; the
    /// PostgreSQL server; the identity and the Kubernetes Secret), as commands to review
    /// and run. Changes nothing.
    Provision {
        /// The format: `az` (Azure CLI commands, a bash script).
        #[arg(long, value_enum)]
        print: provision::Format,
        /// The workflow files the schedulers will run (default: the built-in order workflow).
        #[arg(long, env = "ORDERLY_WORKFLOW", value_delimiter = ',')]
        workflow: Vec<std::path::PathBuf>,
        #[command(flatten)]
        names: provision::Names,
    },
    /// Remove finished orders (Processed or Cancelled) older than --older-than, with
    /// their steps, history and alerts, and old dead letters, relayed outbox rows and
    /// expired duplicate-detection rows. Orders in Error and live orders are never
    /// removed. The leading supervisor does this by itself (--retain-finished).
    Prune {
        /// Keep what finished (or was sent or dead-lettered) within this span: 7d, 36h, ...
        #[arg(long, default_value = "7d", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::span)]
        older_than: std::time::Duration,
        /// Only count what would go.
        #[arg(long)]
        dry_run: bool,
        /// Remove without asking first.
        #[arg(long)]
        yes: bool,
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
    },
    /// Show one order: state, details, steps and its full history.
    Show {
        /// The order id.
        order_id: String,
    },
    /// Count orders by state.
    Counts,
    /// The workflow versions: every stored one (which any scheduler runs) with its
    /// orders not finished (Pending, Processing, Error), and orders pinned to a version
    /// that is not stored (which no scheduler can run until it is). `orderly workflows
    /// migrate` moves orders to a compatible version.
    Workflows {
        #[command(subcommand)]
        action: Option<WorkflowsAction>,
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
    /// List operator alerts (orders that ended in Error), newest first; with `--system`,
    /// the alerts about the system (the oldest Pending order waiting too long, dead
    /// letters growing, no supervisor leading, a service down).
    Alerts {
        /// Include acknowledged alerts (with --system: resolved ones).
        #[arg(long)]
        all: bool,
        /// The alerts about the system instead of the orders'.
        #[arg(long)]
        system: bool,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Acknowledge this alert ("seen, being handled") instead of listing.
        #[arg(long, value_name = "ALERT_ID")]
        ack: Option<i64>,
        /// Who is acknowledging.
        #[arg(long, env = "ORDERLY_OPERATOR", default_value = "cli")]
        operator: String,
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
        /// A file holding the token (a mounted secret), instead of --token.
        #[arg(long, env = "ORDERLY_DASHBOARD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        /// The URL operators reach it by (behind a proxy or ingress): requests to any
        /// other host name than it, an IP address or localhost are refused.
        #[arg(long, env = "ORDERLY_DASHBOARD_PUBLIC_URL")]
        public_url: Option<reqwest::Url>,
        /// Operators, one a line: NAME ROLE TOKEN (role operate or read; token `-` for
        /// one who signs in through the proxy only). Each signs in with their own
        /// token and acts under their own name.
        #[arg(long, env = "ORDERLY_DASHBOARD_OPERATORS_FILE")]
        operators_file: Option<std::path::PathBuf>,
        /// The authenticating proxy in front (oauth2-proxy, App Service Easy Auth):
        /// from this address, and only from it, --proxy-header names the operator.
        #[arg(long, env = "ORDERLY_DASHBOARD_TRUSTED_PROXY")]
        trusted_proxy: Option<std::net::IpAddr>,
        /// The one header the proxy sets to the operator's name: X-Forwarded-User or
        /// X-Forwarded-Email (oauth2-proxy), X-MS-CLIENT-PRINCIPAL-NAME (App Service
        /// Easy Auth). Given more than once, or holding a list, it names nobody.
        #[arg(long, env = "ORDERLY_DASHBOARD_PROXY_HEADER")]
        proxy_header: Option<String>,
        /// The queues it shows and acts on: the SQL queue, or Service Bus's.
        #[command(flatten)]
        on: QueueTransport,
    },
    /// Settings files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// The remote services as the fleet sees them: up, down (since when, next probe)
    /// or probing, and how many orders wait for each. `--resume SERVICE` marks one up
    /// (you know it is back): the orders waiting for it resume at its rate.
    Services {
        /// Mark this service (agent queue) up and resume the orders waiting for it.
        #[arg(long, value_name = "SERVICE")]
        resume: Option<String>,
        /// Who is acting.
        #[arg(long, env = "ORDERLY_OPERATOR", default_value = "cli")]
        operator: String,
    },
    /// Show the supervisors' current leader: holder, term (epoch), lease.
    Leader,
    /// Show every queue's depth: ready, locked, scheduled, dead-lettered.
    Queues {
        #[command(flatten)]
        on: QueueTransport,
    },
    /// List a queue's dead-lettered messages with why, oldest first.
    DeadLetters {
        /// The queue, e.g. orders.
        queue: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        on: QueueTransport,
    },
    /// Put dead-lettered messages back on their queue once the cause is fixed (on
    /// Service Bus each goes back under a new message id, ID~requeued-SEQ, so the
    /// queue's duplicate detection keeps it).
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
        #[command(flatten)]
        on: QueueTransport,
    },
    /// Remove dead-lettered messages for good (judged not worth processing).
    Discard {
        /// The queue.
        queue: String,
        /// The message id to discard.
        #[arg(required_unless_present = "all")]
        message_id: Option<String>,
        /// Discard every dead letter of the queue.
        #[arg(long, conflicts_with = "message_id")]
        all: bool,
        /// Confirm --all without asking.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        on: QueueTransport,
    },
    /// Run the whole system in this process on one store and check the invariants: the
    /// local runner's `demo` (`orderly-local demo --help` for its flags).
    #[command(disable_help_flag = true)]
    Demo {
        /// The local runner's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run the whole system in this process until Ctrl-C / SIGTERM: the local runner's
    /// `up` (`orderly-local up --help` for its flags).
    #[command(disable_help_flag = true)]
    Up {
        /// The local runner's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Measure throughput and latency of the whole system in this process: the local
    /// runner's `bench` (`orderly-local bench --help` for its flags).
    #[command(disable_help_flag = true)]
    Bench {
        /// The local runner's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Print the shell's completion script for orderly: `orderly completions bash >
    /// /etc/bash_completion.d/orderly`, or `source <(orderly completions zsh)`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print orderly's manual page (roff: `orderly man | man -l -`), or with --dir
    /// write one page per command there (orderly.1, orderly-list.1, ...) for `man`'s
    /// path.
    Man {
        /// Where to write the pages (created if missing).
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

/// Prints `shell`'s completion script for every command and flag of `orderly`.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use clap::CommandFactory;
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "orderly",
        &mut std::io::stdout(),
    );
    Ok(())
}

/// Prints the manual page of `orderly`, or writes a page per command into `dir`: each
/// page from the same definitions as `--help`, so they cannot drift apart.
fn manual(dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let command = Cli::command().version(orderly_runtime::VERSION);
    let Some(dir) = dir else {
        let mut out = std::io::stdout().lock();
        clap_mangen::Man::new(command)
            .render(&mut out)
            .context("cannot write the manual page")?;
        return Ok(());
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create --dir {}", dir.display()))?;
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("cannot write the manual pages to {}", dir.display()))?;
    Ok(())
}

/// What `orderly workflows` does besides listing.
#[derive(Subcommand)]
enum WorkflowsAction {
    /// Move orders pinned to one version of a workflow to a compatible version of it
    /// (the same steps, queues, order and compensations; budgets, retry policies and
    /// probes may differ), each move recorded in the order's history. Pending and
    /// Error orders move; one in Processing finishes on the version it runs. An
    /// incompatible pair is refused, the differences named.
    Migrate {
        /// The version the orders are pinned to, `name@version`.
        #[arg(long)]
        from: String,
        /// The version to move them to, `name@version` (stored: `orderly migrate
        /// --workflow FILE` stores a file's version).
        #[arg(long)]
        to: String,
        /// Only orders in this state (Pending or Error; repeat for both, the default).
        #[arg(long = "state")]
        states: Vec<ProcessState>,
        /// Move without asking first.
        #[arg(long)]
        yes: bool,
        /// Why, for the history.
        #[arg(long)]
        reason: String,
        /// Who is acting.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // Deep stacks: the dashboard serves on them.
    orderly_runtime::run_with_deep_stacks("orderly", run())
}

async fn run() -> anyhow::Result<()> {
    let cli: Cli = orderly_runtime::settings::parse_command_line("orderly");
    if cli.json {
        not_json(&cli.command);
    }
    if cli.json || cli.log_json {
        orderly_runtime::errors_as_json();
    }
    init_logging(&cli)?;
    commands::run(cli.command, &cli.database_url, cli.log_json, cli.json).await
}

/// Refuses `--json` (exit code 2) for a command whose output is not results: a script,
/// manual pages, the local runner's (which has its own flags).
fn not_json(command: &Command) {
    use clap::CommandFactory;
    let (name, prints) = match command {
        Command::Provision { .. } => ("provision", "a script of Azure CLI commands"),
        Command::Completions { .. } => ("completions", "a shell's completion script"),
        Command::Man { .. } => ("man", "manual pages"),
        Command::Demo { .. } | Command::Up { .. } | Command::Bench { .. } => (
            "demo, up and bench",
            "what the local runner prints (its own flags follow the command)",
        ),
        _ => return,
    };
    let e = Cli::command().error(
        clap::error::ErrorKind::ArgumentConflict,
        format!("--json: `orderly {name}` prints {prints}, not results"),
    );
    orderly_runtime::settings::refused("orderly", e)
}

/// Logs for `cli`'s command: the dashboard runs as a service, its logs say what it
/// does, and come as JSON lines with ORDERLY_LOG_JSON (as every role's do); the rest
/// log warnings only.
fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = |default: &str| {
        tracing_subscriber::EnvFilter::try_from_env("ORDERLY_LOG")
            .unwrap_or_else(|_| default.into())
    };
    let service = matches!(cli.command, Command::Dashboard { .. });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(if service { "info" } else { "warn" }))
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
