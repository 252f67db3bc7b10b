//! `orderly-local bench`: three-step orders through the whole system, the simulator
//! answering at once. A burst (everything at once: throughput at saturation), then a
//! steady load at half the burst's throughput (or the rate asked for), then a low load
//! of 100 orders/s (the latency floor). In process by default; with `--processes`,
//! the same phases again with every role its own process (as deployed), and the two
//! side by side.

use anyhow::{Context, bail};
use orderly_cli::outln;
use orderly_core::store::StateStore;
use orderly_core::workflow::Workflows;
use orderly_core::{ProcessState, TimeSource};
use orderly_local::demo;
use orderly_local::fleet::Fleet;
use orderly_local::invariants::{self, Report};
use orderly_local::limits::Limits;
use orderly_local::measure::{Cost, Meter};
use orderly_local::system::{System, SystemConfig};
use orderly_local::wire::Relay;
use orderly_remote_sim::{Effect, SimConfig};
use std::sync::Arc;

use crate::local::scratch_sqlite;

/// The rate of the low-load phase, in orders per second.
const LOW_LOAD: f64 = 100.0;

/// How long any phase may take to finish.
const PHASE_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Where the orders go and how the run is read back: the system in this process, or
/// the roles' processes.
enum Under {
    InProcess(System),
    Processes(Fleet),
}

/// One run of the phases on one store.
struct Run {
    under: Under,
    /// The roles' store handle (in process); orders are posted through its queue.
    backend: orderly_sql::Backend,
    /// The handle the bench reads the run through: the roles' own, or in a counters run
    /// one of its own whose statements are not counted.
    observer: orderly_sql::Backend,
    workflows: Workflows,
    pg_url: Option<String>,
}

/// When each order of a phase was posted.
type SentAt = std::collections::HashMap<orderly_core::OrderId, chrono::DateTime<chrono::Utc>>;

/// What a phase measured.
struct Figures {
    phase: String,
    report: Report,
    cost: Cost,
}

impl Run {
    fn store(&self) -> &dyn StateStore {
        self.observer.store.as_ref()
    }

    fn pids(&self) -> Vec<u32> {
        match &self.under {
            Under::InProcess(_) => Vec::new(),
            Under::Processes(fleet) => fleet.pids(),
        }
    }

    async fn ledger(&self) -> anyhow::Result<Option<Vec<Effect>>> {
        Ok(match &self.under {
            Under::InProcess(system) => system.sim.as_ref().map(|s| s.effects()),
            Under::Processes(fleet) => Some(fleet.ledger().await?),
        })
    }

    /// Orders finished so far.
    async fn done(&self) -> anyhow::Result<usize> {
        let counts = self.store().count_by_state().await?;
        Ok(counts
            .iter()
            .filter(|(s, _)| {
                matches!(
                    s,
                    ProcessState::Processed | ProcessState::Error | ProcessState::Cancelled
                )
            })
            .map(|(_, n)| usize::try_from(*n).unwrap_or(0))
            .sum())
    }

    /// Posts `n` orders (all at once without `rate`, else at `rate` per second in
    /// tens) and waits for them; the phase's report and cost.
    async fn phase(
        &mut self,
        name: String,
        n: usize,
        rate: Option<f64>,
    ) -> anyhow::Result<Figures> {
        let meter = Meter::start_with(
            self.backend.stats.clone(),
            self.pg_url.as_deref(),
            self.pids(),
        )
        .await;
        let sent_at = self.drive(&name, n, rate).await?;
        let cost = meter.finish(n).await;
        if let Under::Processes(fleet) = &mut self.under {
            fleet.check_running()?;
        }
        let report = self.report(&sent_at).await?;
        Ok(Figures {
            phase: name,
            report,
            cost,
        })
    }

    /// Posts `n` orders (all at once without `rate`, else at `rate` per second in
    /// tens) and waits for them to finish; when each was posted.
    async fn drive(&self, name: &str, n: usize, rate: Option<f64>) -> anyhow::Result<SentAt> {
        let before = self.done().await?;
        let orders = demo::sample_orders(n);
        let transport = self.backend.transport.clone();
        let mut sent_at = std::collections::HashMap::with_capacity(n);
        match rate {
            None => sent_at.extend(demo::post(transport.as_ref(), &orders).await?),
            Some(rate) => {
                let started = std::time::Instant::now();
                for (i, chunk) in orders.chunks(10).enumerate() {
                    let due = started + std::time::Duration::from_secs_f64((i * 10) as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                    sent_at.extend(demo::post(transport.as_ref(), chunk).await?);
                }
            }
        }
        if !demo::wait_done_on(self.store(), before + n, PHASE_LIMIT).await? {
            bail!(
                "the {name} did not finish within {} s",
                PHASE_LIMIT.as_secs()
            );
        }
        Ok(sent_at)
    }

    /// The invariants of the run's end state and its figures for the orders posted at
    /// `sent_at`.
    async fn report(&self, sent_at: &SentAt) -> anyhow::Result<Report> {
        let effects = self.ledger().await?;
        invariants::report_on(self.store(), effects, sent_at, &self.workflows, true).await
    }

    fn stop_processes(self) {
        if let Under::Processes(fleet) = self.under {
            fleet.stop();
        }
    }
}

/// Opens the store at `url` (migrated) and starts the system on it: in this process,
/// or as the roles' processes.
async fn start(url: &str, processes: bool) -> anyhow::Result<Run> {
    let backend = orderly_sql::connect(url, TimeSource::Database)
        .await
        .context("cannot open the benchmark's state store (--store)")?;
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(SimConfig::default());
    let workflows = Workflows::single(cfg.workflow.clone())?;
    let pg_url = (!url.starts_with("sqlite:")).then(|| url.to_owned());
    let under = if processes {
        let queues: Vec<String> = cfg
            .workflow
            .queues()
            .iter()
            .map(|q| q.as_str().to_owned())
            .collect();
        orderly_local::system::declare_queues(&backend, &cfg.workflow, cfg.request_lock).await?;
        Under::Processes(Fleet::start(url, &queues).await?)
    } else {
        Under::InProcess(System::start(backend.clone(), cfg).await?)
    };
    Ok(Run {
        under,
        observer: backend.clone(),
        backend,
        workflows,
        pg_url,
    })
}

/// The three phases on `run`; the steady rate is `paced_rate` or half the burst's.
async fn phases(
    run: &mut Run,
    orders: usize,
    paced_rate: Option<f64>,
) -> anyhow::Result<Vec<Figures>> {
    let burst = run
        .phase(format!("burst of {orders} orders"), orders, None)
        .await?;
    let rate = paced_rate.unwrap_or((burst.report.throughput() / 2.0).max(1.0));
    let pace = if paced_rate.is_some() {
        "as asked"
    } else {
        "half the burst's"
    };
    let mut all = vec![burst];
    for (rate, pace) in [(rate, pace), (LOW_LOAD, "low load")] {
        let n = orders.min((rate * 10.0) as usize).max(100);
        let name = format!("paced at {rate:.0} orders/s ({pace}), {n} orders");
        all.push(run.phase(name, n, Some(rate)).await?);
    }
    Ok(all)
}

fn print(dialect: &str, mode: &str, figures: &[Figures]) {
    for f in figures {
        outln!("== {dialect}{mode}: {}", f.phase);
        f.report.print();
        f.report.print_hops();
        f.cost.print();
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The in-process and deployed figures of each phase, side by side.
fn side_by_side(dialect: &str, here: &[Figures], deployed: &[Figures]) {
    outln!("== {dialect}: in process | as deployed (one process per role)");
    outln!(
        "{:<50} {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10}",
        "phase",
        "orders/s",
        "p50 ms",
        "p99 ms",
        "orders/s",
        "p50 ms",
        "p99 ms"
    );
    for (a, b) in here.iter().zip(deployed) {
        outln!(
            "{:<50} {:>10.0} {:>10.1} {:>10.1} | {:>10.0} {:>10.1} {:>10.1}",
            a.phase,
            a.report.throughput(),
            ms(a.report.percentile(50.0)),
            ms(a.report.percentile(99.0)),
            b.report.throughput(),
            ms(b.report.percentile(50.0)),
            ms(b.report.percentile(99.0)),
        );
    }
}

/// What a bench runs.
pub(crate) enum Mode {
    /// The burst, the paced phase (at `paced_rate`, or half the burst's throughput)
    /// and the low-load phase, in process and then, with `processes`, as deployed.
    Full {
        paced_rate: Option<f64>,
        processes: bool,
    },
    /// A burst and a short low-load phase, for the counters only.
    Counters,
}

/// Orders in the low-load phase of a counters run.
const COUNTERS_LOW_ORDERS: usize = 500;

pub(crate) async fn run_bench(
    orders: Option<usize>,
    store: Option<String>,
    mode: Mode,
    limits: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let limits = match &limits {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --limits {}", path.display()))?;
            Some(
                Limits::parse(&text)
                    .map_err(|e| anyhow::anyhow!("--limits {}: {e}", path.display()))?,
            )
        }
        None => None,
    };
    let url = store.clone().unwrap_or_else(|| scratch_sqlite("bench"));
    let (dialect, key) = if url.starts_with("sqlite:") {
        ("SQLite", "sqlite")
    } else {
        ("PostgreSQL", "postgres")
    };
    let (paced_rate, processes) = match mode {
        Mode::Full {
            paced_rate,
            processes,
        } => (paced_rate, processes),
        Mode::Counters => {
            let pg = !url.starts_with("sqlite:");
            let outcome = async {
                let figures = counters_run(&url, orders.unwrap_or(1_000)).await?;
                print_counters(dialect, &figures);
                // The idle phase is printed, not checked: after the limits, which may
                // end the run.
                judge(&figures, key, limits.as_ref())?;
                let idle = counters_idle(&url, pg).await?;
                print_idle(dialect, &idle);
                anyhow::Ok(())
            }
            .await;
            if pg {
                // Automatic vacuuming back on, whatever became of the run.
                if let Err(e) = orderly_sql::postgres::end_counting(&url).await {
                    eprintln!(
                        "warning: automatic vacuuming of the benchmark's tables stays off: {e}"
                    );
                }
            }
            return outcome;
        }
    };
    let orders = orders.unwrap_or(5_000);
    let mut run = start(&url, false).await?;
    let here = phases(&mut run, orders, paced_rate).await?;
    if let Under::InProcess(system) = run.under {
        system.stop(std::time::Duration::from_secs(5)).await;
    }
    print(dialect, "", &here);
    let mut deployed_clean = true;
    if processes {
        // A new SQLite file; on PostgreSQL the same database, counted from where the
        // in-process run left it. The same steady rate as in process.
        let url = store.unwrap_or_else(|| scratch_sqlite("bench-processes"));
        let rate = paced_rate.unwrap_or((here[0].report.throughput() / 2.0).max(1.0));
        let mut run = start(&url, true).await?;
        let deployed = phases(&mut run, orders, Some(rate)).await;
        run.stop_processes();
        let deployed = deployed?;
        print(dialect, ", as deployed", &deployed);
        side_by_side(dialect, &here, &deployed);
        deployed_clean = deployed.iter().all(|f| f.report.violations.is_empty());
    }
    // The invariants of every run; the limits on the in-process phases (the store's
    // own count is read there).
    judge(&here, key, limits.as_ref())?;
    if !deployed_clean {
        bail!("invariant violations during the benchmark");
    }
    Ok(())
}

/// A counters run: the burst of `orders`, then the low-load phase, each with the roles
/// started afresh in this process and stopped at its end. On PostgreSQL the roles reach
/// the server through a counting relay of the phase's own (statements, round trips and
/// commits on the wire), the bench reads the run through another, and both are closed
/// at the phase's end: every session ends, so the server publishes its counts at once
/// (no wait for its statistics). The bench's own reads count only in the server's
/// transactions. A phase's counts hold one start and stop of the roles.
async fn counters_run(url: &str, orders: usize) -> anyhow::Result<Vec<Figures>> {
    let pg = !url.starts_with("sqlite:");
    if !pg && (url.contains(":memory:") || url.contains("mode=memory")) {
        bail!(
            "--counters reads the run through a store handle of its own, which an in-memory SQLite database cannot share: give a file (sqlite://FILE), or no --store for a new one"
        );
    }
    // Migrated first, through a handle of the bench's own, then left alone.
    let setup = Handle::open(url, pg, false)
        .await
        .context("cannot open the benchmark's state store (--store)")?;
    Handle::close(url, &[&setup]).await?;
    if pg {
        // No vacuum by the clock inside a phase (each is vacuumed after it, apart), and
        // the log read back, so that a phase counts its own database's work alone.
        let readable = orderly_sql::postgres::begin_counting(url).await?;
        if !readable {
            outln!(
                "log counted          the whole server's: this role cannot read the log (pg_walinspect), so other databases' work and vacuums count too"
            );
        }
        vacuum_apart(url).await?;
    }
    let low = format!("paced at {LOW_LOAD:.0} orders/s (low load), {COUNTERS_LOW_ORDERS} orders");
    let mut figures = Vec::new();
    for (name, n, rate) in [
        (format!("burst of {orders} orders"), orders, None),
        (low, COUNTERS_LOW_ORDERS, Some(LOW_LOAD)),
    ] {
        figures.push(counters_phase(url, pg, name, n, rate).await?);
    }
    Ok(figures)
}

/// A store handle of a counters run, on PostgreSQL through a relay of its own.
struct Handle {
    backend: orderly_sql::Backend,
    relay: Option<Arc<Relay>>,
}

impl Handle {
    /// The roles' handle (`counted`: its statements are logged, so counted) or the
    /// bench's own.
    async fn open(url: &str, pg: bool, counted: bool) -> anyhow::Result<Self> {
        let relay = match pg {
            true => Some(Arc::new(Relay::start(url).await?)),
            false => None,
        };
        let url = match &relay {
            Some(r) => r.url(url)?,
            None => url.to_owned(),
        };
        let backend = if counted {
            orderly_sql::connect(&url, TimeSource::Database).await?
        } else {
            orderly_sql::connect_unlogged(&url, TimeSource::Database).await?
        };
        Ok(Self { backend, relay })
    }

    /// On PostgreSQL: closes the handles' relays, so every session of theirs ends, and
    /// waits until the server has ended them all (and so published their counts).
    async fn close(url: &str, handles: &[&Handle]) -> anyhow::Result<()> {
        let relays: Vec<&Arc<Relay>> = handles.iter().filter_map(|h| h.relay.as_ref()).collect();
        if relays.is_empty() {
            return Ok(());
        }
        for relay in relays {
            relay.close();
        }
        if !orderly_sql::postgres::wait_quiet(url, QUIET_LIMIT).await? {
            bail!(
                "other clients are connected to the benchmark's database after {} s: its counts would not be the roles' alone",
                QUIET_LIMIT.as_secs()
            );
        }
        Ok(())
    }
}

/// How long the server may take to end the sessions of a counters phase.
const QUIET_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Vacuums the benchmark's database between phases, so that the next starts with no
/// dead rows of the last (automatic vacuuming is off while counting), and what that
/// wrote to the log, where it can be read.
async fn vacuum_apart(url: &str) -> anyhow::Result<Option<orderly_sql::postgres::DatabaseLog>> {
    let (from, to) = orderly_sql::postgres::vacuum(url).await?;
    Ok(orderly_local::measure::read_database_log(url, from, to).await)
}

/// One phase of a counters run (see [`counters_run`]).
async fn counters_phase(
    url: &str,
    pg: bool,
    name: String,
    n: usize,
    rate: Option<f64>,
) -> anyhow::Result<Figures> {
    let roles = Handle::open(url, pg, true).await?;
    let observer = Handle::open(url, pg, false).await?;
    let pg_url = pg.then_some(url);
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(SimConfig::default());
    let workflows = Workflows::single(cfg.workflow.clone())?;
    let meter =
        Meter::start_counting(roles.backend.stats.clone(), pg_url, roles.relay.clone()).await;
    let system = System::start(roles.backend.clone(), cfg).await?;
    let sim = system.sim.clone();
    let run = Run {
        under: Under::InProcess(system),
        backend: roles.backend.clone(),
        observer: observer.backend.clone(),
        workflows,
        pg_url: pg_url.map(str::to_owned),
    };
    let sent_at = run.drive(&name, n, rate).await;
    if let Under::InProcess(system) = run.under {
        system.stop(std::time::Duration::from_secs(5)).await;
    }
    let sent_at = sent_at?;
    Handle::close(url, &[&roles, &observer]).await?;
    let mut cost = meter.finish(n).await;
    if pg {
        cost.vacuum_log = vacuum_apart(url).await?;
    }
    // The end state, read through a handle of its own, closed before the next phase.
    let reader = Handle::open(url, pg, false).await?;
    let report = invariants::report_on(
        reader.backend.store.as_ref(),
        sim.map(|s| s.effects()),
        &sent_at,
        &run.workflows,
        true,
    )
    .await;
    Handle::close(url, &[&reader]).await?;
    Ok(Figures {
        phase: name,
        report: report?,
        cost,
    })
}

/// The statements a phase ran most, by text, `per` (orders or seconds).
fn print_statement_texts(cost: &Cost, over: f64, per: &str) {
    let Some(texts) = &cost.statement_texts else {
        return;
    };
    let mut most: Vec<(&String, &u64)> = texts.iter().collect();
    most.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    outln!(
        "statements by text, {per} (the {} most run)",
        most.len().min(STATEMENT_TEXTS_SHOWN)
    );
    for (text, n) in most.into_iter().take(STATEMENT_TEXTS_SHOWN) {
        outln!("  {:>8.2}  {text}", *n as f64 / over);
    }
}

/// How many statement texts a counters phase lists.
const STATEMENT_TEXTS_SHOWN: usize = 12;

/// How long the idle phase of a counters run lasts.
const IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The idle phase of a counters run: the roles started with no orders for [`IDLE`],
/// and what they cost a second while waiting (see [`counters_run`]).
async fn counters_idle(url: &str, pg: bool) -> anyhow::Result<Cost> {
    let roles = Handle::open(url, pg, true).await?;
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(SimConfig::default());
    let pg_url = pg.then_some(url);
    let meter =
        Meter::start_counting(roles.backend.stats.clone(), pg_url, roles.relay.clone()).await;
    let system = System::start(roles.backend.clone(), cfg).await?;
    tokio::time::sleep(IDLE).await;
    system.stop(std::time::Duration::from_secs(5)).await;
    Handle::close(url, &[&roles]).await?;
    Ok(meter.finish(0).await)
}

fn print_idle(dialect: &str, cost: &Cost) {
    let seconds = cost.elapsed.as_secs_f64().max(1e-9);
    outln!(
        "== {dialect}, counters: idle, the roles waiting for {:.0} s with no orders (their start and stop included)",
        seconds
    );
    for (figure, value) in cost.per_order() {
        let figure = figure.replace("_per_order", "_per_second");
        outln!("{figure:<32} {:>10.2}", value / seconds);
    }
    print_statement_texts(cost, seconds, "per second");
}

/// The phase's name in a limits file: `burst`, `low`, or none (the paced phase).
fn limits_phase(name: &str) -> Option<&'static str> {
    if name.starts_with("burst") {
        Some("burst")
    } else if name.contains("(low load)") {
        Some("low")
    } else {
        None
    }
}

fn print_counters(dialect: &str, figures: &[Figures]) {
    for f in figures {
        outln!("== {dialect}, counters: {}", f.phase);
        for (figure, value) in f.cost.per_order() {
            outln!("{figure:<32} {value:>10.2}");
        }
        if f.cost.server.is_some() {
            outln!(
                "log counted                      {}",
                match f.cost.database_log {
                    Some(log) => format!(
                        "this database's relations and transactions, read from the log ({:.2} full-page images per order); vacuum apart",
                        log.full_page_images as f64 / f.cost.orders.max(1) as f64
                    ),
                    None =>
                        "the whole server's (pg_stat_wal): other databases and vacuums included"
                            .to_owned(),
                }
            );
        }
        if let Some(rows) = orderly_local::measure::rows_by_table(&f.cost) {
            outln!("rows by table                    {rows}");
        }
        if let Some(wire) = &f.cost.wire {
            outln!(
                "connections opened               {} (through the relay; their start-up exchanges are round trips too)",
                wire.connections
            );
        }
        print_statement_texts(&f.cost, f.cost.orders.max(1) as f64, "per order");
        outln!(
            "invariants                       {}",
            if f.report.violations.is_empty() {
                "all hold".to_owned()
            } else {
                format!("{} violated", f.report.violations.len())
            }
        );
    }
}

/// The invariants of every phase, and the counters against `limits` if given.
fn judge(figures: &[Figures], store: &str, limits: Option<&Limits>) -> anyhow::Result<()> {
    if figures.iter().any(|f| !f.report.violations.is_empty()) {
        bail!("invariant violations during the benchmark");
    }
    let Some(limits) = limits else {
        return Ok(());
    };
    if !limits.covers(store) {
        bail!("--limits has no limits for {store}: nothing would be checked");
    }
    let over: Vec<String> = figures
        .iter()
        .filter_map(|f| limits_phase(&f.phase).map(|phase| (phase, f)))
        .flat_map(|(phase, f)| limits.check(store, phase, &f.cost.per_order()))
        .collect();
    if !over.is_empty() {
        bail!("work per order over its limits:\n  {}", over.join("\n  "));
    }
    outln!("counters             within the limits ({store})");
    Ok(())
}
