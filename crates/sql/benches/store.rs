#![allow(missing_docs, clippy::unwrap_used)]
//! State-store benchmark: prints figures, asserts nothing. Run on an idle machine:
//!
//!     cargo bench -p orderly-sql --bench store
//!
//! `ORDERLY_BENCH_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! names the PostgreSQL database (a scratch schema is created and dropped);
//! `ORDERLY_BENCH_BIG=0` skips the 1M-row part; `ORDERLY_BENCH_DIALECTS=sqlite` or
//! `=postgres` runs one dialect.

mod common;

use std::str::FromStr;
use std::time::{Duration, Instant};

use common::Db;
use orderly_core::step::StepStatus;
use orderly_core::store::{ClaimRequest, Completion, StepUpdate, StepWrite};
use orderly_core::{InstanceId, TimeSource};
use orderly_sql::{PgStore, SqliteStore};
use sqlx::postgres::PgConnectOptions;

const DETAILS: &str = r#"{"customer_id":"c-1","currency":"EUR","lines":[{"sku":"SKU-1","quantity":1,"unit_price_minor":1999}]}"#;
const TIMEOUT: Duration = Duration::from_secs(600);

/// Inserts orders `from..=to` named `{prefix}-{n}` directly in `state`; Processing
/// rows get a deadline one minute in the past (expired).
async fn seed(db: &Db, prefix: &str, from: i64, to: i64, state: &str) {
    match db {
        Db::Sqlite { path } => {
            let store = SqliteStore::open(&format!("sqlite://{path}"), TimeSource::Database)
                .await
                .expect("open");
            let now = chrono::Utc::now();
            let fmt =
                |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
            let (locked, deadline) = if state == "Processing" {
                (
                    Some("bench-dead-owner"),
                    Some(fmt(now - chrono::Duration::minutes(1))),
                )
            } else {
                (None, None)
            };
            let series =
                "WITH RECURSIVE g(n) AS (SELECT $1 UNION ALL SELECT n + 1 FROM g WHERE n < $2) ";
            let mut tx = store.pool().begin().await.expect("begin");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                    "{series} INSERT INTO orders (order_id, details, created_at) SELECT $3 || '-' || n, $4, $5 FROM g"
                )))
                .bind(from)
                .bind(to)
                .bind(prefix)
                .bind(DETAILS)
                .bind(fmt(now))
                .execute(&mut *tx)
                .await
                .expect("seed orders");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                    "{series} INSERT INTO order_state (order_id, process_state, locked_by, complete_by, lock_epoch, \
                     next_attempt_at, created_at, updated_at) SELECT $3 || '-' || n, $4, $5, $6, 1, $7, $7, $7 FROM g"
                )))
                .bind(from)
                .bind(to)
                .bind(prefix)
                .bind(state)
                .bind(locked)
                .bind(deadline)
                .bind(fmt(now))
                .execute(&mut *tx)
                .await
                .expect("seed states");
            tx.commit().await.expect("commit");
            sqlx::query("ANALYZE")
                .execute(store.pool())
                .await
                .expect("analyze");
        }
        Db::Postgres { url, schema } => {
            let options = PgConnectOptions::from_str(url)
                .expect("url")
                .options([("search_path", schema.as_str())]);
            let store = PgStore::connect(options, 2, TimeSource::Database)
                .await
                .expect("connect and migrate");
            let pool = store.pool();
            let mut tx = pool.begin().await.expect("begin");
            sqlx::query(
                    "INSERT INTO orders (order_id, details, created_at) \
                     SELECT $3 || '-' || g, $4::json, now() FROM generate_series($1::bigint, $2::bigint) g",
                )
                .bind(from)
                .bind(to)
                .bind(prefix)
                .bind(DETAILS)
                .execute(&mut *tx)
                .await
                .expect("seed orders");
            sqlx::query(
                    "INSERT INTO order_state (order_id, process_state, locked_by, complete_by, lock_epoch, \
                     next_attempt_at, created_at, updated_at) \
                     SELECT $3 || '-' || g, $4, CASE WHEN $4 = 'Processing' THEN 'bench-dead-owner' END, \
                     CASE WHEN $4 = 'Processing' THEN now() - interval '1 minute' END, 1, now(), now(), now() \
                     FROM generate_series($1::bigint, $2::bigint) g",
                )
                .bind(from)
                .bind(to)
                .bind(prefix)
                .bind(state)
                .execute(&mut *tx)
                .await
                .expect("seed states");
            tx.commit().await.expect("commit");
            sqlx::query("ANALYZE").execute(pool).await.expect("analyze");
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// `claimers` handles claim `limit` at a time until `total` orders are claimed; each
/// claim call is timed. Returns (orders/s, p50, p99 of one call).
async fn claim_run(
    db: &Db,
    claimers: usize,
    limit: u32,
    total: usize,
) -> (f64, Duration, Duration) {
    let mut handles = Vec::new();
    for _ in 0..claimers {
        handles.push(db.open().await.state_store());
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, store) in handles.into_iter().enumerate() {
        let owner = InstanceId::parse(format!("bench-claimer-{i}")).expect("id");
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut got = 0;
            loop {
                let t = Instant::now();
                let batch = store
                    .claim(&ClaimRequest {
                        workflows: Default::default(),
                        owner: owner.clone(),
                        limit,
                        timeout: TIMEOUT,
                    })
                    .await
                    .expect("claim");
                lat.push(t.elapsed());
                if batch.is_empty() {
                    lat.pop();
                    break (got, lat);
                }
                got += batch.len();
            }
        }));
    }
    let mut lat = Vec::new();
    let mut got = 0;
    for t in tasks {
        let (n, l) = t.await.expect("claimer");
        got += n;
        lat.extend(l);
    }
    let elapsed = started.elapsed();
    assert_eq!(got, total, "every seeded order claimed once");
    lat.sort();
    (
        got as f64 / elapsed.as_secs_f64(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
    )
}

/// Queue core: `workers` loops of claim(batch) then complete_many(batch) until `total`
/// ready orders are Processed, with `steps` batches of step writes in between (each
/// order's step `r` succeeds and step `r + 1` starts, as a reply does). Returns orders/s.
async fn queue_core(db: &Db, workers: usize, batch: u32, total: usize, steps: i32) -> f64 {
    let mut handles = Vec::new();
    for _ in 0..workers {
        handles.push(db.open().await.state_store());
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, store) in handles.into_iter().enumerate() {
        let owner = InstanceId::parse(format!("bench-worker-{i}")).expect("id");
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            loop {
                let claimed = store
                    .claim(&ClaimRequest {
                        workflows: Default::default(),
                        owner: owner.clone(),
                        limit: batch,
                        timeout: TIMEOUT,
                    })
                    .await
                    .expect("claim");
                if claimed.is_empty() {
                    break done;
                }
                for r in 0..steps {
                    let writes: Vec<StepWrite> = claimed
                        .iter()
                        .map(|c| StepWrite {
                            complete: false,
                            fence: c.fence.clone(),
                            expect_step: Some(r),
                            updates: vec![
                                step(r, StepStatus::Succeeded),
                                step(r + 1, StepStatus::Started),
                            ],
                            sends: Vec::new(),
                        })
                        .collect();
                    let verdicts = store.record_steps(&writes).await.expect("record");
                    assert!(verdicts.iter().all(Result::is_ok), "refused: {verdicts:?}");
                }
                let completions: Vec<Completion> = claimed
                    .into_iter()
                    .map(|c| Completion::from(c.fence))
                    .collect();
                let outcome = store.complete_many(&completions).await.expect("complete");
                assert!(outcome.refused.is_empty(), "refused: {:?}", outcome.refused);
                done += outcome.completed.len();
            }
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await.expect("worker");
    }
    assert_eq!(done, total);
    total as f64 / started.elapsed().as_secs_f64()
}

fn step(index: i32, status: StepStatus) -> StepUpdate {
    StepUpdate {
        index,
        name: format!("step-{index}"),
        status,
        detail: None,
        idempotency_key: format!("key-{index}"),
        irreversible: false,
    }
}

/// Claim (one order per call) and sweep (`find_expired(100)`) latency with `finished`
/// Processed rows in the store, 2,000 Pending and 100 expired Processing.
async fn at_scale(db: &Db, finished: i64) -> (Duration, Duration, Duration, Duration) {
    seed(db, "done", 1, finished, "Processed").await;
    seed(db, "ready", 1, 2_000, "Pending").await;
    seed(db, "stuck", 1, 100, "Processing").await;
    let store = db.open().await.state_store();
    let owner = InstanceId::parse("bench-scale").expect("id");
    let mut claim = Vec::new();
    for _ in 0..1_000 {
        let t = Instant::now();
        let got = store
            .claim(&ClaimRequest {
                workflows: Default::default(),
                owner: owner.clone(),
                limit: 1,
                timeout: TIMEOUT,
            })
            .await
            .expect("claim");
        claim.push(t.elapsed());
        assert_eq!(got.len(), 1);
    }
    let mut sweep = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let expired = store.find_expired(100).await.expect("sweep");
        sweep.push(t.elapsed());
        assert_eq!(expired.len(), 100);
    }
    claim.sort();
    sweep.sort();
    (
        percentile(&claim, 0.5),
        percentile(&claim, 0.99),
        percentile(&sweep, 0.5),
        percentile(&sweep, 0.99),
    )
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let dialects =
        std::env::var("ORDERLY_BENCH_DIALECTS").unwrap_or_else(|_| "sqlite,postgres".into());
    let big = std::env::var("ORDERLY_BENCH_BIG")
        .map(|v| v != "0")
        .unwrap_or(true);
    println!(
        "orderly state-store benchmark ({} cores)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    for kind in dialects.split(',') {
        let kind = kind.trim();
        for (claimers, limit) in [(1usize, 1u32), (4, 1), (1, 100), (4, 100)] {
            let db = Db::fresh(kind).await;
            let total = 5_000;
            seed(&db, "o", 1, total, "Pending").await;
            let (rate, p50, p99) = claim_run(&db, claimers, limit, total as usize).await;
            println!(
                "{:<10} claim  {claimers} claimer(s), {limit:>3}/call: {rate:>9.0} orders/s   call p50 {}  p99 {}",
                db.name(),
                ms(p50),
                ms(p99)
            );
            db.drop_all().await;
        }
        // The queue core, then the same with a three-step order's writes in between.
        for (steps, total, batch) in [(0, 20_000, 500), (3, 10_000, 100)] {
            for workers in [1usize, 4] {
                let db = Db::fresh(kind).await;
                seed(&db, "q", 1, total, "Pending").await;
                let rate = queue_core(&db, workers, batch, total as usize, steps).await;
                let what = if steps == 0 {
                    "queue core: claim+complete"
                } else {
                    "with steps: claim, 3 step writes, complete"
                };
                println!(
                    "{:<10} {what} {total} ready orders, {workers} worker(s), batches of {batch}: {rate:>9.0} orders/s",
                    db.name()
                );
                db.drop_all().await;
            }
        }
        let sizes: &[i64] = if big { &[10_000, 1_000_000] } else { &[10_000] };
        for &finished in sizes {
            let db = Db::fresh(kind).await;
            let (c50, c99, s50, s99) = at_scale(&db, finished).await;
            println!(
                "{:<10} with {finished:>9} finished rows: claim p50 {} p99 {}   sweep(100) p50 {} p99 {}",
                db.name(),
                ms(c50),
                ms(c99),
                ms(s50),
                ms(s99)
            );
            db.drop_all().await;
        }
    }
}
