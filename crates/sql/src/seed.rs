//! A store of production size for the console's benchmark, written set-based in a few
//! statements per table (a million orders in a minute or two, not the hours the roles
//! would take): finished orders spread over the last seven days (one in a hundred
//! Cancelled, the rest Processed), Error orders across a number of causes, and orders in
//! flight (Pending and Processing) created in the last ten minutes; every order with its
//! step records and history as the roles write them, every Error order with its alert
//! (raised by the store's own trigger, as an order that fails raises it).
//!
//! Only for an empty, migrated store: ids are `done-N`, `err-N` and `live-N`.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use orderly_core::{Error, Result};
use sqlx::{Connection, Executor};

/// How many orders of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    /// Processed and Cancelled orders, over the last seven days.
    pub finished: u64,
    /// Orders in Error, over the same days.
    pub errors: u64,
    /// Orders Pending or Processing (half each), created in the last ten minutes.
    pub in_flight: u64,
    /// Distinct causes of the Error orders (each message also names its order, as a
    /// real one does, so only the grouping by cause brings them together).
    pub causes: u32,
}

impl Scale {
    /// The production figures for `finished` orders: a tenth as many in Error
    /// across 50 causes, a hundredth in flight.
    pub fn for_finished(finished: u64) -> Self {
        Self {
            finished,
            errors: finished / 10,
            in_flight: finished / 100,
            causes: 50,
        }
    }

    /// Every order.
    pub fn orders(&self) -> u64 {
        self.finished + self.errors + self.in_flight
    }
}

/// The workflow the orders ran: its name, version and step names.
#[derive(Debug, Clone)]
pub struct SeedWorkflow {
    /// Its name.
    pub name: String,
    /// Its version (as `Workflow::version` gives it).
    pub version: String,
    /// Its steps' names, in order.
    pub steps: Vec<String>,
}

/// What was written.
#[derive(Debug, Clone, Copy)]
pub struct Seeded {
    /// Rows written, all tables.
    pub rows: u64,
    /// How long it took.
    pub took: Duration,
}

/// Seven days, in seconds.
const WEEK: f64 = 7.0 * 86_400.0;
/// In-flight orders were created in this many seconds before now.
const RECENT: f64 = 600.0;

/// The SQL that differs between the dialects.
struct Dialect {
    postgres: bool,
}

impl Dialect {
    /// A source of rows `g.i` = 0 .. n-1.
    fn numbers(&self, n: u64) -> String {
        if self.postgres {
            format!("generate_series(0, {n} - 1) AS g(i)")
        } else {
            format!(
                "(WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i + 1 < {n}) \
                 SELECT i FROM g) AS g"
            )
        }
    }

    /// The timestamp `secs` (an expression, seconds since the epoch) as stored.
    fn time(&self, secs: &str) -> String {
        if self.postgres {
            format!("to_timestamp({secs})")
        } else {
            // The stored text form, with microseconds (SQLite gives milliseconds).
            format!("(strftime('%Y-%m-%dT%H:%M:%f', {secs}, 'unixepoch') || '000Z')")
        }
    }

    /// `s.col` (a timestamp) plus `secs` seconds, as stored.
    fn plus(&self, col: &str, secs: &str) -> String {
        if self.postgres {
            format!("({col} + ({secs}) * interval '1 second')")
        } else {
            format!(
                "(strftime('%Y-%m-%dT%H:%M:%f', julianday({col}) + ({secs}) / 86400.0) || '000Z')"
            )
        }
    }

    /// `g.i` as seven digits.
    fn padded(&self) -> &'static str {
        if self.postgres {
            "lpad(g.i::text, 7, '0')"
        } else {
            "substr('0000000' || g.i, -7)"
        }
    }

    /// The letter `a` + `n` (an expression below 26).
    fn letter(&self, n: &str) -> String {
        if self.postgres {
            format!("chr(97 + {n})")
        } else {
            format!("char(97 + {n})")
        }
    }

    fn json(&self, text: &str) -> String {
        if self.postgres {
            format!("CAST({text} AS json)")
        } else {
            text.to_owned()
        }
    }
}

/// One kind of order: its id prefix, how many, and over which seconds they were
/// created (`from`, then `every` seconds apart).
struct Kind {
    prefix: &'static str,
    n: u64,
    from: f64,
    every: f64,
}

/// Writes `scale`'s orders into the empty, migrated store at `url` as if `wf` had run
/// them, the newest finishing just before `now`.
pub async fn console(
    url: &str,
    scale: &Scale,
    wf: &SeedWorkflow,
    now: DateTime<Utc>,
) -> Result<Seeded> {
    let started = Instant::now();
    let d = Dialect {
        postgres: !url.starts_with("sqlite:"),
    };
    let statements = statements(&d, scale, wf, now.timestamp_micros() as f64 / 1e6);
    let fail = |e: sqlx::Error| Error::Unavailable(format!("seeding the store: {e}").into());
    let mut rows = 0;
    if d.postgres {
        let mut conn = sqlx::PgConnection::connect(url).await.map_err(fail)?;
        for s in &statements {
            rows += conn
                .execute(sqlx::AssertSqlSafe(s.clone()))
                .await
                .map_err(fail)?
                .rows_affected();
        }
        conn.execute("VACUUM ANALYZE").await.map_err(fail)?;
    } else {
        let mut conn = sqlx::SqliteConnection::connect(url).await.map_err(fail)?;
        conn.execute("BEGIN").await.map_err(fail)?;
        for s in &statements {
            rows += conn
                .execute(sqlx::AssertSqlSafe(s.clone()))
                .await
                .map_err(fail)?
                .rows_affected();
        }
        conn.execute("COMMIT").await.map_err(fail)?;
        conn.execute("ANALYZE").await.map_err(fail)?;
    }
    Ok(Seeded {
        rows,
        took: started.elapsed(),
    })
}

/// The statements, in order.
fn statements(d: &Dialect, scale: &Scale, wf: &SeedWorkflow, now: f64) -> Vec<String> {
    let span = WEEK - RECENT;
    let kinds = [
        Kind {
            prefix: "done-",
            n: scale.finished,
            from: now - WEEK,
            every: span / scale.finished.max(1) as f64,
        },
        Kind {
            prefix: "err-",
            n: scale.errors,
            from: now - WEEK,
            every: span / scale.errors.max(1) as f64,
        },
        Kind {
            prefix: "live-",
            n: scale.in_flight,
            from: now - RECENT,
            every: RECENT / scale.in_flight.max(1) as f64,
        },
    ];
    let steps = wf.steps.len().max(1);
    let step_name = |index: &str| {
        let mut case = format!("CASE {index}");
        for (i, s) in wf.steps.iter().enumerate() {
            case.push_str(&format!(" WHEN {i} THEN '{}'", s.replace('\'', "''")));
        }
        case.push_str(" END");
        case
    };
    let mut out = Vec::new();
    for k in kinds.iter().filter(|k| k.n > 0) {
        let id = format!("'{}' || {}", k.prefix, d.padded());
        let created = d.time(&format!("{} + g.i * {}", k.from, k.every));
        let details = d.json(&format!(
            "'{{\"customer_id\":\"customer-' || substr('0000' || (g.i % 5000), -4) || \
             '\",\"currency\":\"EUR\",\"lines\":[{{\"sku\":\"KEYBOARD-01\",\"quantity\":' || \
             (1 + g.i % 3) || ',\"unit_price_minor\":1999}}]}}'"
        ));
        out.push(format!(
            "INSERT INTO orders (order_id, details, created_at) \
             SELECT {id}, {details}, {created} FROM {}",
            d.numbers(k.n)
        ));
        let cause = format!("(g.i % {})", scale.causes.max(1));
        // (state, locked_by, complete_by, failure_count, current_step, last_error,
        // updated_at): Error orders are written Processing, then moved to Error below,
        // so the store's trigger raises their alerts.
        let (state, locked, deadline, failures, step, error, updated) = match k.prefix {
            "done-" => (
                "CASE WHEN g.i % 100 = 99 THEN 'Cancelled' ELSE 'Processed' END".to_owned(),
                "NULL".to_owned(),
                "NULL".to_owned(),
                "0".to_owned(),
                format!("CASE WHEN g.i % 100 = 99 THEN 0 ELSE {steps} END"),
                "NULL".to_owned(),
                d.time(&format!(
                    "{} + g.i * {} + CASE WHEN g.i % 100 = 99 THEN 60 ELSE 0.05 + (g.i % 400) * 0.001 END",
                    k.from, k.every
                )),
            ),
            "err-" => (
                "'Processing'".to_owned(),
                "'scheduler-seed'".to_owned(),
                d.time(&format!("{} + g.i * {} + 30", k.from, k.every)),
                "1".to_owned(),
                format!("{cause} % {steps}"),
                format!(
                    "'step ' || {} || ' failed: HTTP 422 from the service: declined-' || {} || {} || \
                     ' for order ' || {id}",
                    step_name(&format!("{cause} % {steps}")),
                    d.letter(&format!("{cause} % 26")),
                    d.letter(&format!("{cause} / 26 % 26")),
                ),
                d.time(&format!("{} + g.i * {} + 2", k.from, k.every)),
            ),
            _ => (
                "CASE WHEN g.i % 2 = 0 THEN 'Pending' ELSE 'Processing' END".to_owned(),
                "CASE WHEN g.i % 2 = 0 THEN NULL ELSE 'scheduler-seed' END".to_owned(),
                format!(
                    "CASE WHEN g.i % 2 = 0 THEN NULL ELSE {} END",
                    d.time(&format!("{now} + 300"))
                ),
                "0".to_owned(),
                format!("CASE WHEN g.i % 2 = 0 THEN 0 ELSE g.i / 2 % {steps} END"),
                "NULL".to_owned(),
                created.clone(),
            ),
        };
        out.push(format!(
            "INSERT INTO order_state (order_id, locked_by, complete_by, process_state, \
             failure_count, lock_epoch, current_step, next_attempt_at, last_error, \
             created_at, updated_at, generation, workflow, workflow_version) \
             SELECT {id}, {locked}, {deadline}, {state}, {failures}, 1, {step}, {created}, \
             {error}, {created}, {updated}, 0, '{name}', '{version}' FROM {g}",
            name = wf.name.replace('\'', "''"),
            version = wf.version.replace('\'', "''"),
            g = d.numbers(k.n),
        ));
    }
    // An order's steps: those before its current step succeeded; a Processed order's
    // all; an Error order's current one failed, a Processing order's started.
    out.push(format!(
        "INSERT INTO order_steps (order_id, step_index, name, status, idempotency_key, \
         attempts, detail, epoch, updated_at) \
         SELECT s.order_id, g.i, {name}, \
         CASE WHEN s.process_state = 'Processed' OR g.i < s.current_step THEN 'Succeeded' \
              WHEN s.last_error IS NOT NULL THEN 'Failed' \
              ELSE 'Started' END, \
         s.order_id || '/' || g.i || '/' || {name}, 1, \
         CASE WHEN g.i = s.current_step AND s.last_error IS NOT NULL THEN s.last_error END, \
         1, s.updated_at \
         FROM order_state s CROSS JOIN {numbers} \
         WHERE s.process_state = 'Processed' OR g.i < s.current_step \
            OR (g.i = s.current_step AND s.process_state = 'Processing')",
        name = step_name("g.i"),
        numbers = d.numbers(steps as u64),
    ));
    let history = |at: &str,
                   actor: &str,
                   kind: &str,
                   from: &str,
                   to: &str,
                   step: &str,
                   reason: &str,
                   filter: &str| {
        format!(
            "INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch, \
             step, reason) \
             SELECT s.order_id, {at}, '{actor}', '{kind}', {from}, {to}, 1, {step}, {reason} \
             FROM order_state s WHERE {filter}"
        )
    };
    let not_pending = "s.process_state <> 'Pending' AND s.process_state <> 'Cancelled'";
    out.push(history(
        "s.created_at",
        "submitter-seed",
        "Submitted",
        "NULL",
        "'Pending'",
        "NULL",
        "NULL",
        "1 = 1",
    ));
    out.push(history(
        &d.plus("s.created_at", "0.01"),
        "scheduler-seed",
        "Claimed",
        "'Pending'",
        "'Processing'",
        "NULL",
        "NULL",
        not_pending,
    ));
    for i in 0..steps {
        out.push(history(
            &d.plus("s.created_at", &format!("0.02 + {i} * 0.01")),
            "scheduler-seed",
            "StepSucceeded",
            "'Processing'",
            "'Processing'",
            &i.to_string(),
            "NULL",
            &format!("{not_pending} AND (s.process_state = 'Processed' OR {i} < s.current_step)"),
        ));
    }
    out.push(history(
        "s.updated_at",
        "scheduler-seed",
        "Completed",
        "'Processing'",
        "'Processed'",
        "NULL",
        "NULL",
        "s.process_state = 'Processed'",
    ));
    out.push(history(
        "s.updated_at",
        "operator:seed",
        "Cancelled",
        "'Pending'",
        "'Cancelled'",
        "NULL",
        "'a duplicate order'",
        "s.process_state = 'Cancelled'",
    ));
    let failing = "s.process_state = 'Processing' AND s.last_error IS NOT NULL";
    out.push(history(
        "s.updated_at",
        "scheduler-seed",
        "StepFailed",
        "'Processing'",
        "'Processing'",
        "s.current_step",
        "s.last_error",
        failing,
    ));
    out.push(history(
        "s.updated_at",
        "scheduler-seed",
        "Failed",
        "'Processing'",
        "'Error'",
        "NULL",
        "s.last_error",
        failing,
    ));
    // Into Error, as a failing order goes: the trigger raises each one's alert.
    out.push(format!(
        "UPDATE order_state SET process_state = 'Error', locked_by = NULL, complete_by = NULL \
         WHERE process_state = 'Processing' AND last_error IS NOT NULL"
    ));
    out
}
