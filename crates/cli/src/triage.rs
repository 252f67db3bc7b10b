//! The operator's actions on orders: import (`submit`), retry (`resubmit`) and
//! `cancel`, one order or every order a filter selects, after a confirmation that says
//! how many and what a retry will do.

use orderly_cli::out::json_line;
use orderly_cli::outln;
use std::io::Read;

use anyhow::{Context, bail};
use orderly_cli::sample;
use orderly_core::store::{NewOrder, OrderFilter, Pruned, Retention, StateStore, SubmitOutcome};
use orderly_core::{Actor, OrderId, ProcessState};

/// Which orders: by state, error text, step, age.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct Filter {
    /// Only this state (Pending, Processing, Processed, Error, Cancelled).
    #[arg(long)]
    pub(crate) state: Option<ProcessState>,
    /// Only orders whose last error contains this text.
    #[arg(long)]
    error: Option<String>,
    /// Only orders at this step (0-based index).
    #[arg(long)]
    step: Option<i32>,
    /// Only orders created more than this many seconds ago.
    #[arg(long, value_name = "SECS")]
    older_than: Option<u64>,
    /// Only orders waiting for this service (agent queue) to be back.
    #[arg(long, value_name = "SERVICE")]
    waiting_for: Option<String>,
}

impl Filter {
    pub(crate) fn to_store(&self, limit: u32) -> OrderFilter {
        OrderFilter {
            state: self.state,
            error_contains: self.error.clone(),
            current_step: self.step,
            // Further back than the calendar goes: no order is that old.
            created_before: self.older_than.map(|s| {
                i64::try_from(s)
                    .ok()
                    .and_then(chrono::Duration::try_seconds)
                    .and_then(|span| chrono::Utc::now().checked_sub_signed(span))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
            }),
            waiting_for: self.waiting_for.clone(),
            limit,
            ..Default::default()
        }
    }
}

/// Every order `filter` selects, page by page.
async fn select_all(store: &dyn StateStore, filter: &Filter) -> anyhow::Result<Vec<OrderId>> {
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
    store: &dyn StateStore,
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

/// `orderly submit`: orders from a file (or `-`) or samples, straight into the store.
pub(crate) async fn submit(
    store: &dyn StateStore,
    file: Option<String>,
    samples: Option<u64>,
    operator: &str,
    json: bool,
) -> anyhow::Result<()> {
    let submitter = Actor::operator(operator);
    let orders = match (file, samples) {
        (_, Some(n)) => (0..n).map(sample::order).collect(),
        (Some(path), None) => read_orders(&path)?,
        (None, None) => bail!("give a JSON file (or - for stdin), or --sample N"),
    };
    let (mut accepted, mut duplicates) = (0, 0);
    for order in &orders {
        let outcome = match store
            .submit(order, &submitter, &[])
            .await
            .with_context(|| format!("order {}", order.order_id))?
        {
            SubmitOutcome::Accepted => {
                accepted += 1;
                "accepted"
            }
            SubmitOutcome::Duplicate => {
                duplicates += 1;
                "duplicate"
            }
        };
        if json {
            json_line(&serde_json::json!({ "order_id": order.order_id, "outcome": outcome }))?;
        }
    }
    if !json {
        outln!(
            "submitted {} orders: {accepted} accepted, {duplicates} duplicates",
            orders.len()
        );
    }
    Ok(())
}

/// Why an operator acts, for the orders' histories, and who.
#[derive(Clone, Copy)]
pub(crate) struct Why<'a> {
    pub(crate) reason: &'a str,
    pub(crate) operator: &'a str,
}

/// `orderly resubmit`: Error orders back to Pending, continuing or afresh.
pub(crate) async fn resubmit(
    store: &dyn StateStore,
    order_id: Option<String>,
    mut filter: Filter,
    yes: bool,
    why: &Why<'_>,
    json: bool,
) -> anyhow::Result<()> {
    let Why { reason, operator } = *why;
    filter.state = Some(ProcessState::Error);
    let one = order_id.is_some();
    let ids = targets(store, order_id, &filter, true, "resubmit").await?;
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
        let fresh = plans.iter().filter(|(_, p)| p.runs_afresh()).count();
        let undo_first = plans
            .iter()
            .filter(|(_, p)| matches!(p, orderly_core::RetryPlan::UndoFirst { .. }))
            .count();
        let question = format!(
            "resubmit {} orders? {} continue from their failed step; {fresh} run afresh \
                 from the first step (steps of theirs were undone, so the redo gets new \
                 idempotency keys), {undo_first} of them once their undoing is finished \
                 (they stopped half undone)",
            ids.len(),
            ids.len() - fresh
        );
        if !confirm(&question)? {
            bail!("nothing done");
        }
    }
    let actor = Actor::operator(operator);
    let mut failed = 0;
    for (id, (generation, plan)) in ids.iter().zip(plans) {
        match store.resubmit(id, &actor, reason, &[]).await {
            Ok(row) => {
                let what = if row.generation > generation || row.finish_as.is_some() {
                    plan.describe()
                } else {
                    orderly_core::RetryPlan::Continue {
                        from_step: row.current_step,
                    }
                    .describe()
                };
                if json {
                    json_line(&serde_json::json!({
                        "order_id": row.order_id,
                        "state": row.process_state,
                        "generation": row.generation,
                        "from_step": row.current_step,
                        "plan": what,
                    }))?;
                } else {
                    outln!(
                        "order {} is {} again: {what}",
                        row.order_id,
                        row.process_state
                    );
                }
            }
            Err(e) => {
                failed += 1;
                refused(id, &e, json)?;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} orders not resubmitted", ids.len());
    }
    Ok(())
}

/// `orderly cancel`: undo what took effect, then Cancelled (or at once).
pub(crate) async fn cancel(
    store: &dyn StateStore,
    order_id: Option<String>,
    filter: &Filter,
    yes: bool,
    why: &Why<'_>,
    no_compensation: bool,
    json: bool,
) -> anyhow::Result<()> {
    let Why { reason, operator } = *why;
    let ids = targets(store, order_id, filter, yes, "cancel").await?;
    let actor = Actor::operator(operator);
    let mut failed = 0;
    for id in &ids {
        let row = if no_compensation {
            store.cancel(id, &actor, reason, &[]).await
        } else {
            store.request_cancel(id, &actor, reason, &[]).await
        };
        match row {
            Ok(row) if json => json_line(&serde_json::json!({
                "order_id": row.order_id,
                "state": row.process_state,
                "finish_as": row.finish_as,
            }))?,
            Ok(row) if row.finish_as == Some(ProcessState::Cancelled) => outln!(
                "order {id} will be Cancelled once its completed steps are undone (if a step \
                 that cannot be undone may have taken effect, nothing is undone and it ends \
                 in Error for repair by hand: `orderly show {id}` tells)",
                id = row.order_id
            ),
            Ok(row) => outln!("order {} is {}", row.order_id, row.process_state),
            Err(e) => {
                failed += 1;
                refused(id, &e, json)?;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} orders not cancelled", ids.len());
    }
    Ok(())
}

/// What the store refused for order `id`: on standard error, or with `json` as a line
/// of the results (`order_id`, `error`), so a script sees every order it named.
fn refused(id: &OrderId, e: &orderly_core::Error, json: bool) -> anyhow::Result<()> {
    if json {
        json_line(&serde_json::json!({ "order_id": id, "error": e.about(id).to_string() }))
    } else {
        eprintln!("{}", e.about(id));
        Ok(())
    }
}

/// Asks on the terminal (standard error: standard output holds only results); anything
/// but y/yes is no (and so is a closed stdin).
pub(crate) fn confirm(question: &str) -> anyhow::Result<bool> {
    {
        use std::io::Write;
        let mut err = std::io::stderr().lock();
        write!(err, "{question} [y/N] ")?;
        err.flush()?;
    }
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

pub(crate) fn read_orders(path: &str) -> anyhow::Result<Vec<NewOrder>> {
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

/// `orderly prune`: counts what retention would remove, then (unless `dry_run`, and
/// after asking unless `yes`) removes it and says what went.
pub(crate) async fn prune(
    store: &dyn StateStore,
    older_than: std::time::Duration,
    dry_run: bool,
    yes: bool,
    json: bool,
) -> anyhow::Result<()> {
    let retention = Retention {
        keep: older_than,
        batch: 500,
    };
    let would = store.prune(&retention, true).await?;
    let show = |what: &str, p: &Pruned| -> anyhow::Result<()> {
        if json {
            let mut v = serde_json::to_value(p)?;
            v["what"] = what.into();
            json_line(&v)?;
        } else {
            outln!(
                "{what}: {} finished orders ({} steps, {} history entries, {} alerts), \
                 {} dead letters, {} outbox rows, {} expired duplicate-detection rows",
                p.orders,
                p.steps,
                p.history,
                p.alerts,
                p.dead_letters,
                p.outbox,
                p.dedup
            );
        }
        Ok(())
    };
    let span = humane(older_than);
    show(&format!("older than {span}, would remove"), &would)?;
    if dry_run || would.is_empty() {
        return Ok(());
    }
    if !yes && !confirm("Remove them?")? {
        bail!("nothing removed");
    }
    let done = store.prune(&retention, false).await?;
    show("removed", &done)
}

/// `older_than` as it was most likely written.
fn humane(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Which orders `orderly workflows migrate` moves: pinned to `from` (`name@version`),
/// in `states` (none: Pending and Error), to `to`.
pub(crate) struct Versions<'a> {
    pub(crate) from: &'a str,
    pub(crate) to: &'a str,
    pub(crate) states: &'a [ProcessState],
}

/// `orderly workflows migrate`: moves the Pending and Error orders pinned to `from` to
/// the compatible version `to`, in batches, each recorded in the order's history. The
/// store refuses an incompatible pair before anything moves.
pub(crate) async fn move_version(
    store: &dyn StateStore,
    versions: &Versions<'_>,
    yes: bool,
    reason: &str,
    operator: &str,
    json: bool,
) -> anyhow::Result<()> {
    use orderly_core::workflow::WorkflowRef;
    let from = WorkflowRef::parse(versions.from).context("--from")?;
    let to = WorkflowRef::parse(versions.to).context("--to")?;
    let states = versions.states;
    if from.name != to.name {
        bail!(
            "--to {to} is another workflow than --from {from}: orders move only between versions of one workflow"
        );
    }
    let states: Vec<ProcessState> = if states.is_empty() {
        vec![ProcessState::Pending, ProcessState::Error]
    } else {
        states.to_vec()
    };
    let counts = store.workflows_in_flight().await?;
    let waiting: Vec<String> = states
        .iter()
        .map(|s| {
            let n: i64 = counts
                .iter()
                .filter(|c| {
                    c.workflow.as_deref() == Some(from.name.as_str())
                        && c.version.as_deref() == Some(from.version.as_str())
                        && c.state == *s
                })
                .map(|c| c.orders)
                .sum();
            format!("{n} {s}")
        })
        .collect();
    if !yes
        && !confirm(&format!(
            "move {} orders of {from} to {to}?",
            waiting.join(", ")
        ))?
    {
        bail!("nothing done");
    }
    let actor = Actor::operator(operator);
    let moved = orderly_core::store::move_version_all(
        store,
        &from,
        &to,
        &states,
        &actor,
        reason,
        &mut |so_far| {
            if json {
                eprintln!("  {so_far} moved so far");
            } else {
                outln!("  {so_far} moved so far");
            }
        },
    )
    .await?;
    if json {
        return json_line(&serde_json::json!({
            "from": from.to_string(),
            "to": to.to_string(),
            "states": states,
            "moved": moved,
        }));
    }
    outln!("{moved} orders moved from {from} to {to}");
    Ok(())
}
