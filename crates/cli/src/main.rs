//! `orderly`: the operator and developer command line. Thin: parse, connect, call the
//! store, print. Until the worker roles exist it submits, lists and triages orders.

use std::io::Read;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use orderly_core::store::{NewOrder, OrderFilter, SubmitOutcome};
use orderly_core::{Actor, OrderId, ProcessState, TimeSource};

mod print;
mod sample;

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
    /// Apply pending migrations (they also run on every start).
    Migrate,
    /// Submit orders: a JSON file (`-` for stdin) of one order or an array, or samples.
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
        /// Only this state (Pending, Processing, Processed, Error, Cancelled).
        #[arg(long)]
        state: Option<ProcessState>,
        /// Only orders whose last error contains this text.
        #[arg(long)]
        error: Option<String>,
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
    /// Send an Error order round again (Pending, fresh failure budget).
    Resubmit {
        /// The order id.
        order_id: String,
        /// Why, for the history.
        #[arg(long)]
        reason: String,
        /// Who is acting.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
    /// Cancel a Pending, Processing or Error order.
    Cancel {
        /// The order id.
        order_id: String,
        /// Why, for the history.
        #[arg(long)]
        reason: String,
        /// Who is acting.
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
    },
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ORDERLY_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let store = orderly_sql::open(&cli.database_url, TimeSource::Database)
        .await
        .context("cannot open the state store named by --database-url / ORDERLY_DATABASE_URL")?;

    match cli.command {
        Command::Migrate => println!("migrations applied; the store is up to date"),
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
            state,
            error,
            limit,
            json,
        } => {
            let page = store
                .list(&OrderFilter {
                    state,
                    error_contains: error,
                    limit,
                    ..Default::default()
                })
                .await?;
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
        Command::Resubmit {
            order_id,
            reason,
            operator,
        } => {
            let row = store
                .resubmit(
                    &OrderId::parse(order_id)?,
                    &Actor::operator(&operator),
                    &reason,
                    &[],
                )
                .await?;
            println!("order {} is {} again", row.order_id, row.process_state);
        }
        Command::Cancel {
            order_id,
            reason,
            operator,
        } => {
            let row = store
                .cancel(
                    &OrderId::parse(order_id)?,
                    &Actor::operator(&operator),
                    &reason,
                    &[],
                )
                .await?;
            println!("order {} is {}", row.order_id, row.process_state);
        }
    }
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
