//! `orderly-local bench console`: the operators' console on a store of production size.
//! Seeds an empty store (a new SQLite file by default) with N finished orders over seven
//! days, a tenth as many in Error across 50 causes and a hundredth in flight, serves
//! the dashboard on it, then asks every page and every read of the JSON API the same
//! number of times, one request after another, and prints each one's p50 / p95 / max.
//! Exits non-zero if a page answers with anything but 200.

use anyhow::{Context, bail};
use orderly_cli::outln;
use orderly_core::TimeSource;
use orderly_local::system::SystemConfig;
use orderly_sql::seed::{Scale, SeedWorkflow};
use std::time::{Duration, Instant};

use crate::local::scratch_sqlite;

/// The budget the issue sets every page at a million orders (p95).
const BUDGET: Duration = Duration::from_millis(200);

/// Requests before the measured ones, so caches are as a running console has them.
const WARM_UP: usize = 2;

/// One page's timings.
struct Timed {
    path: String,
    p50: Duration,
    p95: Duration,
    max: Duration,
    bytes: usize,
}

pub(crate) async fn run(orders: u64, store: Option<String>, requests: usize) -> anyhow::Result<()> {
    let url = store.unwrap_or_else(|| scratch_sqlite("console"));
    let backend = orderly_sql::connect(&url, TimeSource::Database)
        .await
        .context("cannot open the state store (--store)")?;
    let dialect = if url.starts_with("sqlite:") {
        "SQLite"
    } else {
        "PostgreSQL"
    };
    let there: i64 = backend
        .store
        .count_by_state()
        .await?
        .iter()
        .map(|(_, n)| n)
        .sum();
    if there > 0 {
        bail!(
            "the store holds {there} orders already: the console bench seeds an empty store (give --store a new database)"
        );
    }
    let workflow = SystemConfig::new().workflow;
    backend
        .store
        .record_workflows(&[std::sync::Arc::new(workflow.clone())], "bench")
        .await?;
    let scale = Scale::for_finished(orders);
    outln!(
        "== {dialect}: seeding {} orders ({} finished, {} in Error across {} causes, {} in flight)",
        scale.orders(),
        scale.finished,
        scale.errors,
        scale.causes,
        scale.in_flight
    );
    let seeded = orderly_sql::seed::console(
        &url,
        &scale,
        &SeedWorkflow {
            name: workflow.name.clone(),
            version: workflow.version(),
            steps: workflow.steps.iter().map(|s| s.name.clone()).collect(),
        },
        backend.store.store_now().await?,
    )
    .await?;
    outln!(
        "   {} rows in {:.1} s",
        seeded.rows,
        seeded.took.as_secs_f64()
    );
    // The leader tallies the finished orders as it takes the lead, and every minute
    // after: what the counts by state read instead of every finished order.
    let tallying = Instant::now();
    let tallied = backend.store.tally_finished().await?;
    outln!(
        "   the first tally of the finished orders (the leader's, as it takes the lead): {} orders in {} transactions, {:.1} s",
        tallied.orders,
        tallied.transactions,
        tallying.elapsed().as_secs_f64()
    );

    let shutdown = tokio_util::sync::CancellationToken::new();
    let ops = orderly_runtime::ops::endpoints(
        "dashboard",
        backend.clone(),
        orderly_runtime::ops::install_metrics()?,
        Vec::new(),
    );
    let (addr, served) = orderly_cli::dashboard::serve(
        "127.0.0.1:0".parse()?,
        backend,
        None,
        None,
        orderly_cli::dashboard::Access::default(),
        ops,
        shutdown.clone(),
    )
    .await?;
    orderly_tls::install_provider();
    let client = reqwest::Client::new();
    let base = format!("http://{addr}");
    // The first reading of the error groups computes every Error order's cause (kept
    // for the next readings): what a console pays once after an upgrade to a store
    // with many Error orders.
    let first = Instant::now();
    let group = first_group(&client, &base).await?;
    outln!(
        "   the first reading of the error groups (each Error order's cause computed and kept): {:.1} s",
        first.elapsed().as_secs_f64()
    );
    let mut timed = Vec::new();
    for path in pages(&group, &scale) {
        timed.push(time_page(&client, &base, &path, requests).await?);
    }
    shutdown.cancel();
    let _ = served.await;

    outln!(
        "== {dialect}: {} orders, {requests} requests a page, one at a time",
        scale.orders()
    );
    outln!(
        "{:<53} {:>9} {:>9} {:>9} {:>9}",
        "page",
        "p50 ms",
        "p95 ms",
        "max ms",
        "kB"
    );
    for t in &timed {
        // The group's query is long: its start says which page it is.
        let label = match t.path.char_indices().nth(50) {
            Some((at, _)) => format!("{}...", &t.path[..at]),
            None => t.path.clone(),
        };
        outln!(
            "{:<53} {:>9.1} {:>9.1} {:>9.1} {:>9.1}{}",
            label,
            ms(t.p50),
            ms(t.p95),
            ms(t.max),
            t.bytes as f64 / 1000.0,
            if t.p95 > BUDGET { "  over 200 ms" } else { "" }
        );
    }
    let over = timed.iter().filter(|t| t.p95 > BUDGET).count();
    outln!(
        "{} of {} pages within 200 ms at p95",
        timed.len() - over,
        timed.len()
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The query that opens the largest error group's confirmation.
async fn first_group(client: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let groups: serde_json::Value = client
        .get(format!("{base}/api/errors"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let Some(key) = groups
        .get("groups")
        .and_then(|g| g.as_array())
        .and_then(|g| g.first())
    else {
        return Ok(String::new());
    };
    let text = |k: &str| {
        key.get(k)
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .unwrap_or_default()
    };
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("workflow", &text("workflow"));
    q.append_pair("step", &text("step"));
    q.append_pair("pattern", &text("pattern"));
    Ok(q.finish())
}

/// Every page and every read of the API, with the filters an operator uses most.
fn pages(group: &str, scale: &Scale) -> Vec<String> {
    let done = format!("done-{:07}", scale.finished / 2);
    let err = format!("err-{:07}", scale.errors / 2);
    let mut pages: Vec<String> = [
        "/",
        "/api/overview",
        "/charts",
        "/?range=24h",
        "/?range=7d",
        "/charts?range=7d",
        "/api/activity?range=24h",
        "/api/activity?range=7d",
        "/orders",
        "/orders?state=Error",
        "/orders?state=Processed",
        "/orders?state=Pending",
        "/orders?customer=customer-0042",
        "/orders?q=declined-ab",
        "/orders?id=err-00001",
        "/errors",
        "/alerts",
        "/workflows",
        "/dead-letters",
        "/metrics",
        "/api/orders",
        "/api/orders?state=Error",
        "/api/errors",
        "/api/alerts",
        "/api/workflows",
        "/api/queues",
        "/api/leader",
        "/api/services",
        "/api/dead-letters?queue=orders",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    pages.push(format!("/orders/{done}"));
    pages.push(format!("/orders/{err}"));
    pages.push(format!("/api/orders/{err}"));
    if !group.is_empty() {
        pages.push(format!("/errors/group?action=retry&{group}"));
    }
    pages
}

async fn time_page(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    requests: usize,
) -> anyhow::Result<Timed> {
    let mut took = Vec::with_capacity(requests);
    let mut bytes = 0;
    for i in 0..WARM_UP + requests {
        let start = Instant::now();
        let response = client.get(format!("{base}{path}")).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        let elapsed = start.elapsed();
        if !status.is_success() {
            bail!(
                "{path} answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        if i >= WARM_UP {
            took.push(elapsed);
            bytes = body.len();
        }
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q).ceil() as usize).clamp(1, took.len()) - 1];
    Ok(Timed {
        path: path.to_owned(),
        p50: at(0.5),
        p95: at(0.95),
        max: *took.last().unwrap_or(&Duration::ZERO),
        bytes,
    })
}
