//! The whole system in this process: `orderly demo`, `orderly bench`, `orderly up`.

use anyhow::{Context, bail};
use orderly_cli::outln;
use orderly_core::TimeSource;
use orderly_core::store::NewOrder;
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
pub(crate) fn scratch_sqlite(what: &str) -> String {
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
