//! The whole system in this process: `orderly demo`, `orderly bench`, `orderly up`.

use anyhow::{Context, bail};
use orderly_cli::outln;
use orderly_core::store::NewOrder;
use orderly_core::{ProcessState, TimeSource};
use orderly_local::measure::Meter;
use orderly_local::system::{System, SystemConfig};
use orderly_local::{demo, invariants};
use orderly_remote_sim::SimConfig;

/// Fault injection presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Faults {
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

/// A fresh SQLite file for one run, in the temporary directory.
fn scratch_sqlite(what: &str) -> String {
    let file = std::env::temp_dir().join(format!(
        "orderly-{what}-{}.db",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    format!("sqlite://{}", file.display())
}

pub(crate) async fn run_demo(
    orders: usize,
    faults: Faults,
    timeout: std::time::Duration,
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
    let finished = demo::wait_done(&system, orders, timeout).await?;
    let mut report = invariants::report(&system, &sent_at, &workflows, true).await?;
    system.stop(std::time::Duration::from_secs(5)).await;
    if !finished {
        report.violations.insert(
            0,
            format!(
                "not every order finished within {}",
                orderly_core::duration::format(timeout)
            ),
        );
    }
    report.print();
    if url.starts_with("sqlite:") {
        outln!("inspect it: orderly --database-url {url} list --state Error");
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

pub(crate) async fn run_bench(
    orders: usize,
    store: Option<String>,
    paced_rate: Option<f64>,
) -> anyhow::Result<()> {
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
    let stats = backend.stats.clone();
    let pg_url = (!url.starts_with("sqlite:")).then_some(url.as_str());
    let system = System::start(backend, cfg).await?;
    // Burst: everything at once; throughput at saturation.
    let burst = demo::sample_orders(orders);
    let meter = Meter::start(stats.clone(), pg_url).await;
    let sent_at = demo::submit(&system, &burst).await?;
    if !demo::wait_done(&system, orders, std::time::Duration::from_secs(600)).await? {
        bail!("the burst did not finish within 600 s");
    }
    let burst_cost = meter.finish(orders).await;
    let peak = invariants::report(&system, &sent_at, &workflows, true).await?;
    outln!(
        "== {dialect}: burst of {orders} orders (three steps each, simulator answering at once)"
    );
    peak.print();
    peak.print_hops();
    burst_cost.print();
    // Paced: half the burst's throughput (or the rate asked for), for latency under a
    // steady load; then a low load, for the latency floor users see.
    let rate = paced_rate.unwrap_or((peak.throughput() / 2.0).max(1.0));
    let pace = if paced_rate.is_some() {
        "as asked"
    } else {
        "half the burst's"
    };
    let mut done = peak.count(ProcessState::Processed) + peak.count(ProcessState::Error);
    let mut clean = peak.violations.is_empty();
    for (rate, pace) in [(rate, pace), (LOW_LOAD, "low load")] {
        let phase = Phase {
            system: &system,
            workflows: &workflows,
            stats: &stats,
            pg_url,
        };
        let n = orders.min((rate * 10.0) as usize).max(100);
        let steady = phase.paced(rate, n, done).await?;
        outln!("== {dialect}: paced at {rate:.0} orders/s ({pace}), {n} orders");
        steady.report.print();
        steady.report.print_hops();
        steady.cost.print();
        done += n;
        clean &= steady.report.violations.is_empty();
    }
    system.stop(std::time::Duration::from_secs(5)).await;
    if !clean {
        bail!("invariant violations during the benchmark");
    }
    Ok(())
}

/// The rate of the bench's low-load phase, in orders per second.
const LOW_LOAD: f64 = 100.0;

/// What a paced phase of the bench runs on.
struct Phase<'a> {
    system: &'a System,
    workflows: &'a orderly_core::workflow::Workflows,
    stats: &'a std::sync::Arc<orderly_sql::stats::Stats>,
    pg_url: Option<&'a str>,
}

/// A paced phase's end state and what it cost.
struct Steady {
    report: invariants::Report,
    cost: orderly_local::measure::Cost,
}

impl Phase<'_> {
    /// Submits `n` orders at `rate` per second, in tens, and waits for them (`before`
    /// orders were done already).
    async fn paced(&self, rate: f64, n: usize, before: usize) -> anyhow::Result<Steady> {
        let paced = demo::sample_orders(n);
        let mut sent_at = std::collections::HashMap::new();
        let meter = Meter::start(self.stats.clone(), self.pg_url).await;
        let started = std::time::Instant::now();
        for (i, chunk) in paced.chunks(10).enumerate() {
            let due = started + std::time::Duration::from_secs_f64((i * 10) as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            sent_at.extend(demo::submit(self.system, chunk).await?);
        }
        if !demo::wait_done(self.system, before + n, std::time::Duration::from_secs(600)).await? {
            bail!("the paced run at {rate:.0} orders/s did not finish within 600 s");
        }
        let cost = meter.finish(n).await;
        let report = invariants::report(self.system, &sent_at, self.workflows, true).await?;
        Ok(Steady { report, cost })
    }
}

pub(crate) async fn run_up(
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
    let metrics = orderly_runtime::ops::install_metrics()?;
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(faults.sim());
    let system = System::start(backend.clone(), cfg).await?;
    let ops = orderly_runtime::ops::endpoints(
        "embedded",
        backend.clone(),
        metrics,
        system.leaders.clone(),
    );
    let (dash_addr, dash) = match orderly_cli::dashboard::serve(
        dashboard,
        backend,
        token,
        None,
        orderly_cli::dashboard::Access::default(),
        ops,
        shutdown.clone(),
    )
    .await
    {
        Ok(served) => served,
        Err(e) => {
            system.stop(std::time::Duration::from_secs(10)).await;
            return Err(e);
        }
    };
    let sim = system.sim_addr.map(|a| a.to_string()).unwrap_or_default();
    // With JSON logs (a container) the news is a log event like every other line.
    if orderly_runtime::log_json_from_env() {
        tracing::info!(simulator = %sim, dashboard = %format!("http://{dash_addr}/"), "orderly is up: post orders with `orderly post`; SIGTERM stops");
    } else {
        eprintln!(
            "orderly is up: post orders with `orderly post --sample 10 --wait` (through the \"orders\" queue); simulator on {sim}; dashboard on http://{dash_addr}/; Ctrl-C or SIGTERM stops"
        );
    }
    shutdown.cancelled().await;
    if orderly_runtime::log_json_from_env() {
        tracing::info!("stopping");
    } else {
        eprintln!("stopping...");
    }
    system.stop(std::time::Duration::from_secs(10)).await;
    let _ = dash.await;
    Ok(())
}
