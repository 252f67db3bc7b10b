//! What a benchmark phase cost besides time: write transactions and the batch sizes
//! each stage reached (the store's own counters); on PostgreSQL the transactions the
//! server committed (`pg_stat_database`), the write-ahead log it wrote and the rows it
//! wrote by table (counts that, unlike time, a busy machine does not change); CPU
//! seconds of this process and of the local PostgreSQL server's processes; and how busy
//! the machine's cores were.

use orderly_cli::outln;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use orderly_sql::postgres::{
    DatabaseLog, ServerCounters, TableWrites, database_log, server_counters,
};
use orderly_sql::stats::{Stats, StatsSnapshot};

use crate::wire::{Relay, WireCounts};

/// Statements sqlx ran in this process, as its `sqlx::query` events tell, once
/// [`statement_counter`] is in the subscriber.
static STATEMENTS: AtomicU64 = AtomicU64::new(0);

/// A tracing layer that counts every statement sqlx runs in this process (one
/// `sqlx::query` event each, whatever the other layers log), for the bench's counters.
/// Handles opened with `orderly_sql::connect_unlogged` are not counted.
pub fn statement_counter<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    StatementCounter.with_filter(tracing_subscriber::filter::filter_fn(|meta| {
        meta.target() == "sqlx::query"
    }))
}

struct StatementCounter;

/// The statements of [`STATEMENTS`] by their text (as [`crate::wire::shown`]).
static STATEMENT_TEXTS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StatementCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        // sqlx gives the statement's start as `summary` and, when that is not all of
        // it, the whole text as `db.statement`.
        #[derive(Default)]
        struct Text {
            summary: String,
            statement: String,
        }
        impl tracing::field::Visit for Text {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                match field.name() {
                    "summary" => self.summary = value.to_owned(),
                    "db.statement" => self.statement = value.to_owned(),
                    _ => {}
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "summary" && self.summary.is_empty() {
                    self.summary = format!("{value:?}");
                }
            }
        }
        let mut text = Text::default();
        event.record(&mut text);
        let text = crate::wire::shown(if text.statement.trim().is_empty() {
            &text.summary
        } else {
            &text.statement
        });
        STATEMENTS.fetch_add(1, Ordering::Relaxed);
        let mut texts = STATEMENT_TEXTS.lock().unwrap_or_else(|e| e.into_inner());
        *texts.entry(text).or_default() += 1;
    }
}

fn statement_texts() -> std::collections::BTreeMap<String, u64> {
    STATEMENT_TEXTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The readings at the start of a phase.
pub struct Meter {
    stats: std::sync::Arc<Stats>,
    pg_url: Option<String>,
    store: StatsSnapshot,
    own_cpu: Option<Duration>,
    pg_cpu: Option<Duration>,
    machine: Option<MachineCpu>,
    server: Option<ServerCounters>,
    started: std::time::Instant,
    /// The role processes whose CPU time counts with this one's (none in process).
    pids: Vec<u32>,
    /// A counters run's readings, if this is one.
    counting: Option<Counting>,
}

/// What a counters run reads besides the rest: the statements counted, and on
/// PostgreSQL what crossed the relay the roles connect through.
struct Counting {
    statements: u64,
    texts: std::collections::BTreeMap<String, u64>,
    relay: Option<(Arc<Relay>, WireCounts)>,
}

/// CPU time of this process and of `pids`.
fn orderly_cpu(pids: &[u32]) -> Option<Duration> {
    let mut total = process_cpu("self")?;
    for pid in pids {
        total += process_cpu(&pid.to_string()).unwrap_or_default();
    }
    Some(total)
}

/// What one phase cost.
#[derive(Debug, Clone)]
pub struct Cost {
    /// Orders the phase finished.
    pub orders: usize,
    /// How long the phase took.
    pub elapsed: Duration,
    /// The store's counters over the phase.
    pub store: StatsSnapshot,
    /// CPU time of orderly: this process (all its threads) and the role processes, if any.
    pub own_cpu: Option<Duration>,
    /// CPU time of the PostgreSQL server's processes on this machine, if it runs here.
    pub pg_cpu: Option<Duration>,
    /// The share of the machine's CPU time that was busy (every process's), and the
    /// cores it has: near 100%, the phase waited for the cores.
    pub machine_busy: Option<(f64, usize)>,
    /// What the PostgreSQL server did over the phase: transactions committed in the
    /// database (reads included), its log written, rows written by table.
    pub server: Option<ServerCounters>,
    /// Whether the roles ran in other processes: the store's own counts (transactions,
    /// the write lock, batch sizes) are then theirs, not read here.
    pub roles_elsewhere: bool,
    /// Statements the roles ran but transaction control (a counters run: sqlx's
    /// statement events).
    pub statements: Option<u64>,
    /// What crossed the wire between the roles and the PostgreSQL server (a counters
    /// run on PostgreSQL).
    pub wire: Option<WireCounts>,
    /// The statements by text (a counters run): PostgreSQL's off the wire, SQLite's
    /// from sqlx's events (transaction control apart).
    pub statement_texts: Option<std::collections::BTreeMap<String, u64>>,
    /// The log the phase's work wrote in its own database, read from the log (a
    /// counters run on PostgreSQL where the log can be read): unlike the server's
    /// counts, without other databases' work and the server's periodic records.
    pub database_log: Option<DatabaseLog>,
    /// The log that vacuuming the database wrote after the phase: the cost of the rows
    /// the phase left dead (a counters run, as [`Cost::database_log`]).
    pub vacuum_log: Option<DatabaseLog>,
}

/// How long the server may take to publish a backend's transaction counts: a backend
/// publishes them at most once a second while busy and, once idle, within its idle
/// flush interval (ten seconds).
pub const PG_STATS_SETTLE: Duration = Duration::from_secs(11);

impl Meter {
    /// Starts measuring; `pg_url` when the store is PostgreSQL. There it first waits
    /// [`PG_STATS_SETTLE`], so that what the connections did before (start-up, the last
    /// phase's checks of every order) is published before the server's counts are
    /// read, and not counted in this phase.
    pub async fn start(stats: std::sync::Arc<Stats>, pg_url: Option<&str>) -> Self {
        Self::start_with(stats, pg_url, Vec::new()).await
    }

    /// [`Meter::start`] that counts the CPU time of the role processes `pids` as
    /// orderly's too (the roles deployed as processes).
    pub async fn start_with(
        stats: std::sync::Arc<Stats>,
        pg_url: Option<&str>,
        pids: Vec<u32>,
    ) -> Self {
        let server = match pg_url {
            Some(url) => {
                tokio::time::sleep(PG_STATS_SETTLE).await;
                server_counters(url).await.ok()
            }
            None => None,
        };
        Self {
            store: stats.snapshot(),
            stats,
            pg_url: pg_url.map(str::to_owned),
            own_cpu: orderly_cpu(&pids),
            pg_cpu: pg_url.and_then(|_| postgres_cpu()),
            machine: machine_cpu(),
            server,
            started: std::time::Instant::now(),
            pids,
            counting: None,
        }
    }

    /// Starts measuring a counters run's phase on a quiet database: no connection of an
    /// earlier phase is open, so every count the server keeps is published and read at
    /// once (and read at once at the end, after [`quiet`] with the roles stopped).
    /// Counts the statements ([`statement_counter`]) and, on PostgreSQL, what crosses
    /// `relay`.
    pub async fn start_counting(
        stats: Arc<Stats>,
        pg_url: Option<&str>,
        relay: Option<Arc<Relay>>,
    ) -> Self {
        let server = match pg_url {
            Some(url) => server_counters(url).await.ok(),
            None => None,
        };
        let counting = Counting {
            statements: STATEMENTS.load(Ordering::Relaxed),
            texts: statement_texts(),
            relay: relay.map(|r| {
                let now = r.counts();
                (r, now)
            }),
        };
        Self {
            store: stats.snapshot(),
            stats,
            pg_url: pg_url.map(str::to_owned),
            own_cpu: orderly_cpu(&[]),
            pg_cpu: pg_url.and_then(|_| postgres_cpu()),
            machine: machine_cpu(),
            server,
            started: std::time::Instant::now(),
            pids: Vec::new(),
            counting: Some(counting),
        }
    }

    /// The cost since [`Meter::start`] of a phase that finished `orders`. On
    /// PostgreSQL the log's position is read at once, the server's counts after
    /// [`PG_STATS_SETTLE`] (and count what the idle system did meanwhile).
    pub async fn finish(self, orders: usize) -> Cost {
        let elapsed = self.started.elapsed();
        let store = self.stats.snapshot().since(&self.store);
        let own_cpu = orderly_cpu(&self.pids)
            .zip(self.own_cpu)
            .map(|(now, then)| now.saturating_sub(then));
        let pg_cpu = self
            .pg_url
            .as_ref()
            .and_then(|_| postgres_cpu())
            .zip(self.pg_cpu)
            .map(|(now, then)| now.saturating_sub(then));
        let machine_busy = machine_cpu()
            .zip(self.machine)
            .and_then(|(now, then)| now.busy_since(then).map(|busy| (busy, now.cores)));
        let mut own_log = None;
        let server = match (&self.pg_url, &self.server) {
            (Some(url), Some(before)) if self.counting.is_some() => {
                let now = server_counters(url).await.ok();
                if let Some(now) = &now {
                    own_log = read_database_log(url, before.wal_position, now.wal_position).await;
                }
                now.map(|now| now.since(before))
            }
            (Some(url), Some(before)) => {
                let at_end = server_counters(url).await.ok();
                tokio::time::sleep(PG_STATS_SETTLE).await;
                server_counters(url)
                    .await
                    .ok()
                    .zip(at_end)
                    .map(|(settled, at_end)| {
                        ServerCounters {
                            wal_position: at_end.wal_position,
                            ..settled
                        }
                        .since(before)
                    })
            }
            _ => None,
        };
        let (statements, wire, statement_texts) = match &self.counting {
            Some(c) => {
                let wire = c
                    .relay
                    .as_ref()
                    .map(|(relay, then)| relay.counts().since(then));
                let texts = match &wire {
                    Some(wire) => wire.by_text.clone(),
                    None => crate::wire::since(&statement_texts(), &c.texts),
                };
                (
                    Some(STATEMENTS.load(Ordering::Relaxed) - c.statements),
                    wire,
                    Some(texts),
                )
            }
            None => (None, None, None),
        };
        Cost {
            orders,
            elapsed,
            store,
            own_cpu,
            pg_cpu,
            machine_busy,
            server,
            roles_elsewhere: !self.pids.is_empty(),
            statements,
            wire,
            statement_texts,
            database_log: own_log,
            vacuum_log: None,
        }
    }
}

/// [`database_log`] between two positions, or `None` with the reason logged where the
/// log could not be read.
pub async fn read_database_log(url: &str, from: i64, to: i64) -> Option<DatabaseLog> {
    match database_log(url, from, to).await {
        Ok(log) => log,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the database's own log records; counting the whole server's");
            None
        }
    }
}

impl Cost {
    /// The counters that do not move with the machine, per order, by the names
    /// [`crate::limits::FIGURES`] gives them: the store's write transactions (when the
    /// roles ran here) and, on PostgreSQL, the server's transactions, log and rows.
    pub fn per_order(&self) -> std::collections::BTreeMap<&'static str, f64> {
        let per = |n: f64| n / self.orders.max(1) as f64;
        let mut figures = std::collections::BTreeMap::new();
        if !self.roles_elsewhere {
            figures.insert(
                "write_transactions_per_order",
                per(self.store.transactions as f64),
            );
        }
        if let Some(logged) = self.statements {
            // Transaction control (begin, savepoints, commit) counts as statements.
            // PostgreSQL's are read off the wire, with the waits for the server (pings
            // and prepares too). On SQLite sqlx logs the others, and each statement is
            // one hand-off to a connection's thread and back: one wait.
            let (statements, round_trips) = match &self.wire {
                Some(wire) => (wire.statements, wire.round_trips),
                None => {
                    let all = logged + self.store.control_round_trips;
                    (all, all)
                }
            };
            figures.insert("statements_per_order", per(statements as f64));
            figures.insert("round_trips_per_order", per(round_trips as f64));
        }
        if let Some(wire) = &self.wire {
            figures.insert("commits_per_order", per(wire.commits as f64));
        }
        if self.server.is_none() && !self.roles_elsewhere && self.store.commits > 0 {
            figures.insert("commits_per_order", per(self.store.commits as f64));
            let rows: u64 = self.store.rows.values().map(|r| r.total()).sum();
            figures.insert("rows_per_order", per(rows as f64));
        }
        if let Some(server) = &self.server {
            figures.insert("server_transactions_per_order", per(server.commits as f64));
            match &self.database_log {
                Some(log) => {
                    figures.insert("log_bytes_per_order", per(log.bytes as f64));
                    figures.insert("log_records_per_order", per(log.records as f64));
                }
                None => {
                    figures.insert("log_bytes_per_order", per(server.wal_position as f64));
                    if let Some((records, _)) = server.wal_records {
                        figures.insert("log_records_per_order", per(records as f64));
                    }
                }
            }
            if let Some(log) = &self.vacuum_log {
                figures.insert("vacuum_log_records_per_order", per(log.records as f64));
            }
            let rows: i64 = server.tables.iter().map(TableWrites::total).sum();
            figures.insert("rows_per_order", per(rows as f64));
        }
        figures
    }

    /// Prints the figures, per order where that is how they are compared.
    pub fn print(&self) {
        let per = |n: f64| n / self.orders.max(1) as f64;
        if self.roles_elsewhere {
            self.print_server_and_cpu();
            outln!("store's own counts   in the roles' processes (not read here)");
            return;
        }
        outln!(
            "write transactions   {:.2} per order ({} in all for {} writes, store's count)",
            per(self.store.transactions as f64),
            self.store.transactions,
            self.store.writes
        );
        if !self.store.write_held.is_zero() {
            outln!(
                "write lock held      {:.1} s of {:.1} s ({:.0}%; SQLite has one writer at a time): beginning {:.1} s, committing {:.1} s, {:.2} ms per transaction, {:.2} per write, {:.2} round trips of transaction control per write",
                self.store.write_held.as_secs_f64(),
                self.elapsed.as_secs_f64(),
                100.0 * self.store.write_held.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9),
                self.store.beginning.as_secs_f64(),
                self.store.committing.as_secs_f64(),
                1e3 * self.store.write_held.as_secs_f64() / (self.store.transactions.max(1) as f64),
                1e3 * self.store.write_held.as_secs_f64() / (self.store.writes.max(1) as f64),
                self.store.control_round_trips as f64 / (self.store.writes.max(1) as f64)
            );
        }
        self.print_server_and_cpu();
        let stages: Vec<String> = self
            .store
            .batches
            .iter()
            .map(|(stage, b)| format!("{stage} {:.1} (max {}, {} empty)", b.mean(), b.max, b.empty))
            .collect();
        outln!("batch sizes, mean    {}", stages.join(", "));
    }

    /// What the server wrote and the CPU time spent, by orderly, the server and the
    /// machine.
    fn print_server_and_cpu(&self) {
        let per = |n: f64| n / self.orders.max(1) as f64;
        if let Some(server) = &self.server {
            let n = server.commits;
            outln!(
                "server transactions  {:.2} per order ({n}, pg_stat_database.xact_commit, reads included)",
                per(n as f64)
            );
            let records = server.wal_records.map_or(String::new(), |(records, fpi)| {
                format!(
                    "; {:.1} records and {:.2} full-page images per order",
                    per(records as f64),
                    per(fpi as f64)
                )
            });
            outln!(
                "server log written   {:.0} bytes per order ({:.1} MB{records}; the whole server's)",
                per(server.wal_position as f64),
                server.wal_position as f64 / 1e6
            );
            if let Some(log) = &self.database_log {
                outln!(
                    "log of the database  {:.0} bytes per order in {:.1} records, {:.2} full-page images (its own relations and transactions, read from the log; no vacuum)",
                    per(log.bytes as f64),
                    per(log.records as f64),
                    per(log.full_page_images as f64)
                );
            }
            if let Some(log) = &self.vacuum_log {
                outln!(
                    "vacuum afterwards    {:.0} bytes per order in {:.1} records of log (clearing the rows the phase left dead)",
                    per(log.bytes as f64),
                    per(log.records as f64)
                );
            }
            outln!(
                "rows written         {}",
                rows_per_order(&server.tables, self.orders, true)
            );
        }
        let per_k = |d: Duration| d.as_secs_f64() * 1000.0 / self.orders.max(1) as f64;
        match self.own_cpu {
            Some(cpu) => outln!(
                "cpu, orderly         {:.2} s per 1,000 orders ({:.1} s)",
                per_k(cpu),
                cpu.as_secs_f64()
            ),
            None => outln!("cpu, orderly         n/a (no /proc)"),
        }
        if let Some(cpu) = self.pg_cpu {
            outln!(
                "cpu, postgres        {:.2} s per 1,000 orders ({:.1} s, server processes on this machine)",
                per_k(cpu),
                cpu.as_secs_f64()
            );
        }
        if let Some((busy, cores)) = self.machine_busy {
            outln!(
                "cpu, machine         {:.0}% of {cores} cores busy (every process on this machine)",
                100.0 * busy
            );
        }
    }
}

/// The rows written per order table by table, most first: PostgreSQL's as the server
/// counts them, SQLite's as its update hook told the store.
pub fn rows_by_table(cost: &Cost) -> Option<String> {
    if let Some(server) = &cost.server {
        return Some(rows_per_order(&server.tables, cost.orders, true));
    }
    if cost.roles_elsewhere || cost.store.rows.is_empty() {
        return None;
    }
    let mut tables: Vec<TableWrites> = cost
        .store
        .rows
        .iter()
        .map(|(table, r)| TableWrites {
            table: table.clone(),
            inserted: r.inserted as i64,
            updated: r.updated as i64,
            in_place: 0,
            deleted: r.deleted as i64,
        })
        .collect();
    tables.sort_by(|a, b| {
        b.total()
            .cmp(&a.total())
            .then_with(|| a.table.cmp(&b.table))
    });
    Some(rows_per_order(&tables, cost.orders, false))
}

/// The rows written per order, in all and table by table as `tables` lists them:
/// inserted, updated (with the share made in place) and deleted.
fn rows_per_order(tables: &[TableWrites], orders: usize, in_place_known: bool) -> String {
    let per = |n: i64| n as f64 / orders.max(1) as f64;
    let all: i64 = tables.iter().map(TableWrites::total).sum();
    // Tables written less than once in twenty orders (heartbeats, leases) are left out.
    let each: Vec<String> = tables
        .iter()
        .filter(|t| per(t.total()) >= 0.05)
        .map(|t| {
            let mut parts = Vec::new();
            if t.inserted > 0 {
                parts.push(format!("{:.1} inserted", per(t.inserted)));
            }
            if t.updated > 0 && !in_place_known {
                parts.push(format!("{:.1} updated", per(t.updated)));
            } else if t.updated > 0 {
                parts.push(format!(
                    "{:.1} updated ({:.0}% in place)",
                    per(t.updated),
                    100.0 * t.in_place as f64 / t.updated as f64
                ));
            }
            if t.deleted > 0 {
                parts.push(format!("{:.1} deleted", per(t.deleted)));
            }
            let name = t.table.strip_prefix("public.").unwrap_or(&t.table);
            format!("{name} {}", parts.join(", "))
        })
        .collect();
    match (all, each.is_empty()) {
        (0, _) => "none".into(),
        (_, true) => format!(
            "{:.1} per order (tables written less than once in twenty orders)",
            per(all)
        ),
        _ => format!("{:.1} per order: {}", per(all), each.join("; ")),
    }
}

/// The machine's CPU time so far, from the first line of `/proc/stat`, in ticks: busy
/// (user, nice, system, interrupts, and time the hypervisor gave to other machines) and
/// idle (idle and waiting for the disk), summed over its `cores` (the `cpuN` lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MachineCpu {
    busy: u64,
    idle: u64,
    cores: usize,
}

impl MachineCpu {
    /// The busy share of the time since `then` (None when no time passed).
    fn busy_since(self, then: Self) -> Option<f64> {
        let busy = self.busy.saturating_sub(then.busy);
        let all = busy + self.idle.saturating_sub(then.idle);
        (all > 0).then(|| busy as f64 / all as f64)
    }
}

fn machine_cpu() -> Option<MachineCpu> {
    parse_machine_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_machine_cpu(stat: &str) -> Option<MachineCpu> {
    let mut fields = stat.lines().next()?.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is counted in user).
    let t: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = t[..] else {
        return None;
    };
    let cores = stat
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Some(MachineCpu {
        busy: user + nice + system + irq + softirq + steal,
        idle: idle + iowait,
        cores: cores.max(1),
    })
}

/// User plus system CPU time of process `pid` ("self" for this one), from
/// `/proc/<pid>/stat` (in the kernel's fixed 100 ticks a second).
fn process_cpu(pid: &str) -> Option<Duration> {
    parse_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_cpu(stat: &str) -> Option<Duration> {
    // The command name may hold spaces: count fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// CPU time of every `postgres` process on this machine (None when there is none).
fn postgres_cpu() -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut seen = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if comm.trim() != "postgres" {
            continue;
        }
        if let Some(cpu) = process_cpu(pid) {
            total += cpu;
            seen = true;
        }
    }
    seen.then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(orders: usize) -> Cost {
        Cost {
            orders,
            elapsed: Duration::from_secs(1),
            store: StatsSnapshot::default(),
            own_cpu: None,
            pg_cpu: None,
            machine_busy: None,
            server: None,
            roles_elsewhere: false,
            statements: None,
            wire: None,
            statement_texts: None,
            database_log: None,
            vacuum_log: None,
        }
    }

    /// Statements and round trips come off the wire on PostgreSQL; on SQLite they are
    /// sqlx's logged statements and the transaction control the store counted, each one
    /// wait. SQLite's commits and rows come from its hooks.
    #[test]
    fn statements_round_trips_and_commits_per_order_by_store() {
        let mut sqlite = cost(10);
        sqlite.statements = Some(30);
        sqlite.store.control_round_trips = 20;
        sqlite.store.commits = 10;
        sqlite.store.rows.insert(
            "orders".into(),
            orderly_sql::stats::RowWrites {
                inserted: 10,
                updated: 0,
                deleted: 0,
            },
        );
        let f = sqlite.per_order();
        assert_eq!(f["statements_per_order"], 5.0);
        assert_eq!(f["round_trips_per_order"], 5.0);
        assert_eq!(f["commits_per_order"], 1.0);
        assert_eq!(f["rows_per_order"], 1.0);
        assert_eq!(
            rows_by_table(&sqlite).unwrap(),
            "1.0 per order: orders 1.0 inserted"
        );

        let mut pg = cost(10);
        pg.statements = Some(30);
        pg.wire = Some(WireCounts {
            connections: 2,
            round_trips: 120,
            statements: 70,
            commits: 12,
            by_text: Default::default(),
        });
        pg.server = Some(ServerCounters::default());
        let f = pg.per_order();
        assert_eq!(f["statements_per_order"], 7.0);
        assert_eq!(f["round_trips_per_order"], 12.0);
        assert_eq!(f["commits_per_order"], 1.2);

        let full = cost(10);
        assert!(
            !full.per_order().contains_key("statements_per_order"),
            "not counted outside a counters run"
        );
    }

    #[test]
    fn reads_user_and_system_ticks_after_a_name_with_spaces() {
        let line =
            "4242 (tokio worker) S 1 4242 4242 0 -1 4194560 9000 0 3 0 250 37 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu(line), Some(Duration::from_millis(2_870)));
        assert_eq!(parse_cpu("4242 (cut short) S 1"), None);
        assert!(process_cpu("self").is_some(), "Linux has /proc/self/stat");
    }

    #[test]
    fn the_machine_busy_share_counts_every_busy_kind_against_idle_and_disk_waits() {
        let before = parse_machine_cpu(
            "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8\ncpu1 1 2 3 4 5 6 7 8\nintr 9\n",
        )
        .expect("a cpu line");
        assert_eq!(before.cores, 2, "one cpuN line per core");
        let after = parse_machine_cpu("cpu  400 10 100 900 150 5 15 20 0 0\n").expect("a cpu line");
        // busy 150 -> 550 (+400), idle 850 -> 1050 (+200)
        assert_eq!(after.busy_since(before), Some(400.0 / 600.0));
        assert_eq!(before.busy_since(before), None, "no time passed");
        assert_eq!(
            parse_machine_cpu("cpu0 1 2 3 4 5 6 7 8\n"),
            None,
            "not the machine's line"
        );
        assert_eq!(parse_machine_cpu("cpu  1 2 3\n"), None, "cut short");
        assert!(machine_cpu().is_some(), "Linux has /proc/stat");
    }

    #[test]
    fn rows_written_are_told_per_order_with_the_share_of_updates_made_in_place() {
        let tables = [
            TableWrites {
                table: "public.queue_messages".into(),
                inserted: 70,
                updated: 70,
                in_place: 0,
                deleted: 70,
            },
            TableWrites {
                table: "other.order_state".into(),
                inserted: 10,
                updated: 50,
                in_place: 25,
                deleted: 0,
            },
            TableWrites {
                table: "public.leadership".into(),
                updated: 0,
                in_place: 0,
                inserted: 0,
                deleted: 0,
            },
        ];
        assert_eq!(
            rows_per_order(&tables, 10, true),
            "27.0 per order: queue_messages 7.0 inserted, 7.0 updated (0% in place), 7.0 deleted; \
             other.order_state 1.0 inserted, 5.0 updated (50% in place)"
        );
        let mut rare = tables.clone();
        rare[2].updated = 4;
        rare[2].in_place = 4;
        assert_eq!(
            rows_per_order(&rare[..], 100, true),
            "2.7 per order: queue_messages 0.7 inserted, 0.7 updated (0% in place), 0.7 deleted; \
             other.order_state 0.1 inserted, 0.5 updated (50% in place)",
            "a table written less than once in twenty orders is counted, not listed"
        );
        assert_eq!(rows_per_order(&[], 0, true), "none");
        assert_eq!(
            rows_per_order(&rare[2..], 100, true),
            "0.0 per order (tables written less than once in twenty orders)",
            "rows written only to rarely written tables are still counted"
        );
    }
}
