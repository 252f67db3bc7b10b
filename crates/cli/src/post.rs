//! `orderly post`: orders onto the orders queue as a client application posts them
//! (through the submitter, its checks and its dead-lettering), with the client library,
//! on either transport; `--wait` follows each order's status notices to its end.

use orderly_cli::outln;
use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;
use orderly_client::{Client, ClientConfig, Target};
use orderly_core::OrderId;
use orderly_core::messages::OrderStatus;
use orderly_core::store::NewOrder;
use orderly_runtime::{ServiceBusArgs, TransportKind};

/// What to post and where.
#[derive(Debug, clap::Args)]
pub struct PostArgs {
    /// A JSON file (`-` for stdin) of one order or an array:
    /// `{"order_id": ..., "details": {...}, "reply_to": ...}`.
    pub file: Option<String>,
    /// Post N generated sample orders instead.
    #[arg(long, conflicts_with = "file")]
    pub sample: Option<u64>,
    /// The client's queue for status notices (orders without a reply_to of their own
    /// name it). With --wait on the SQL transport a fresh one is made if not given.
    #[arg(long)]
    pub reply_to: Option<String>,
    /// The workflow to run them under, by name (orders without a workflow of their own
    /// get it); default: the one the schedulers start orders that name none on.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Follow each posted order's notices until it completes, fails or is cancelled;
    /// exit non-zero unless all completed.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long.
    #[arg(long = "timeout", default_value = "60s", value_name = orderly_runtime::settings::DURATION, value_parser = orderly_runtime::duration)]
    pub timeout: Duration,
    /// Where messages travel: `sql` (the queue in the state store's database,
    /// --database-url) or `servicebus`.
    #[arg(long, env = "ORDERLY_TRANSPORT", value_enum, default_value = "sql")]
    pub transport: TransportKind,
    #[command(flatten)]
    pub servicebus: ServiceBusArgs,
}

/// Runs `orderly post`.
/// With `json`, one line per order posted (`order_id`, `queue`) and, with `--wait`,
/// one per notice (`order_id`, `status`, `step`, `detail`).
pub async fn run(args: PostArgs, database_url: &str, json: bool) -> anyhow::Result<()> {
    let mut orders: Vec<NewOrder> = match (&args.file, args.sample) {
        (_, Some(n)) => (0..n).map(orderly_cli::sample::order).collect(),
        (Some(path), None) => crate::triage::read_orders(path)?,
        (None, None) => anyhow::bail!("give a JSON file (or - for stdin), or --sample N"),
    };
    if let Some(name) = &args.workflow {
        orderly_core::workflow::check_workflow_name("--workflow", name)?;
        for o in orders.iter_mut().filter(|o| o.workflow.is_none()) {
            o.workflow = Some(name.clone());
        }
    }
    let (target, on) = match args.transport {
        TransportKind::Sql => (
            Target::Sql {
                database_url: database_url.to_owned(),
                password: orderly_runtime::backend::database_password_from_env(database_url)?,
            },
            "the SQL queue",
        ),
        TransportKind::Servicebus => (
            Target::ServiceBus(orderly_runtime::backend::servicebus_settings(
                &args.servicebus,
            )?),
            "Service Bus",
        ),
    };
    let reply_to = match (&args.reply_to, args.wait, args.transport) {
        (Some(q), _, _) => Some(q.clone()),
        (None, true, TransportKind::Sql) => Some(format!("client-{}", OrderId::random())),
        (None, true, TransportKind::Servicebus) => anyhow::bail!(
            "--wait on Service Bus needs --reply-to QUEUE (a queue provisioned for this client)"
        ),
        (None, false, _) => None,
    };
    let mut cfg = ClientConfig::new(target);
    if let Some(q) = &reply_to {
        cfg = cfg.with_reply_queue(q).context("invalid --reply-to")?;
    }
    let client = Client::connect(cfg)
        .await
        .with_context(|| format!("cannot post to {on}"))?;
    let ids: Vec<OrderId> = orders.iter().map(|o| o.order_id.clone()).collect();
    let taken = client
        .post_many(orders)
        .await
        .with_context(|| format!("cannot post to {on}"))?;
    let repeats = ids.len().saturating_sub(taken);
    if json {
        for id in &ids {
            orderly_cli::out::json_line(&serde_json::json!({ "order_id": id, "posted_to": on }))?;
        }
    } else {
        said_posted(&ids, repeats, on);
    }
    if !args.wait {
        return Ok(());
    }
    follow(&client, &ids, args.timeout, json).await
}

/// What was posted, for people.
fn said_posted(ids: &[OrderId], repeats: usize, on: &str) {
    outln!(
        "posted {} order(s) to the orders queue on {on}{}",
        ids.len(),
        if repeats > 0 {
            format!(" ({repeats} already there: absorbed)")
        } else {
            String::new()
        }
    );
    if ids.len() <= 20 {
        for id in ids {
            outln!("  {id}");
        }
    }
}

/// Prints each notice as it arrives until every order in `ids` has ended.
async fn follow(
    client: &Client,
    ids: &[OrderId],
    limit: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut open: HashSet<&OrderId> = ids.iter().collect();
    let (mut completed, mut failed) = (0usize, 0usize);
    while !open.is_empty() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            anyhow::bail!(
                "{} order(s) not finished within {} s (completed {completed}, failed or cancelled {failed}); \
                 are the roles running? (`orderly up`, or the role binaries)",
                open.len(),
                limit.as_secs()
            );
        }
        for n in client.notices(left.min(Duration::from_millis(500))).await? {
            if !open.contains(&n.order_id) {
                continue;
            }
            if json {
                orderly_cli::out::json_line(&serde_json::json!({
                    "order_id": n.order_id,
                    "status": n.status.as_str(),
                    "step": n.step,
                    "detail": n.detail,
                }))?;
            }
            let step = n
                .step
                .as_deref()
                .map(|s| format!(" {s}"))
                .unwrap_or_default();
            let detail = n
                .detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            if !json {
                outln!("{}  {}{step}{detail}", n.order_id, n.status.as_str());
            }
            match n.status {
                OrderStatus::Completed => completed += 1,
                OrderStatus::Failed | OrderStatus::Cancelled => failed += 1,
                _ => continue,
            }
            open.remove(&n.order_id);
        }
    }
    if !json {
        outln!("completed {completed}, failed or cancelled {failed}");
    }
    if failed > 0 {
        anyhow::bail!("{failed} order(s) did not complete: `orderly list --state Error` shows why");
    }
    Ok(())
}
