//! Failover of the supervisors' leadership, measured between real `orderly-supervisor`
//! processes, per elector (SQL lease on SQLite, blob lease on Azurite): the time from
//! stopping the leader (SIGTERM: graceful, or SIGKILL) until the follower logs that it
//! leads, median and worst over `--runs` runs (default 10); and the latency of single
//! lease calls (acquire, renew, release) against Azurite and the SQL stores.
//!
//! `cargo bench -p orderly-local --bench failover [-- --runs N] [-- --only sql|blob]`
//! Needs Azurite's npm package (`npm ci --prefix tests/azurite`) and, for the PostgreSQL
//! lease calls, PostgreSQL (`ORDERLY_TEST_POSTGRES_URL`, skipped with a note if absent).
//! Timings: production defaults but for a 15 s lease (the shortest a blob allows) and a
//! 10 s renew deadline.

#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/support/procs.rs"]
mod procs;

use std::sync::Arc;
use std::time::{Duration, Instant};

use orderly_azure::{BlobLease, BlobLocation};
use orderly_core::leader::{Lease, StoreLease};
use orderly_core::{InstanceId, TimeSource};
use orderly_testkit::azurite::Azurite;
use procs::{Election, changes, wait_change};

fn temp_db() -> (String, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!(
        "orderly-failover-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    (format!("sqlite://{}", path.display()), path)
}

fn summary(label: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = if v.len() % 2 == 1 {
        ms(v[v.len() / 2])
    } else {
        (ms(v[v.len() / 2 - 1]) + ms(v[v.len() / 2])) / 2.0
    };
    println!(
        "{label:<44} runs {:>3}  median {:>8.0} ms  best {:>8.0} ms  worst {:>8.0} ms",
        v.len(),
        median,
        ms(v[0]),
        ms(v[v.len() - 1])
    );
}

/// One failover: a leads, b follows; a is stopped with `signal`; the time until b leads.
async fn failover(election: &Election, signal: &str) -> Duration {
    let (db, path) = temp_db();
    let a = election.start(&db, "supervisor-a");
    wait_change(&a, 1, Duration::from_secs(30)).await;
    let b = election.start(&db, "supervisor-b");
    // Let b settle into following, and a into a random point of its renewal cycle.
    tokio::time::sleep(Duration::from_millis(1000 + rand::random::<u64>() % 5000)).await;
    assert!(changes(&b).is_empty());
    let stopped = Instant::now();
    if signal == "KILL" {
        a.kill();
    } else {
        a.signal(signal);
    }
    let (seen, c) = wait_change(&b, 1, election.lease() + Duration::from_secs(30)).await;
    assert!(c.acquired);
    drop(b);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    seen - stopped
}

async fn lease_calls(label: &str, a: &dyn Lease, b: &dyn Lease, n: usize) {
    let mut acquire = Vec::new();
    let mut renew = Vec::new();
    let mut release = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        a.try_acquire().await.unwrap();
        acquire.push(t.elapsed());
        let t = Instant::now();
        b.try_acquire().await.unwrap();
        acquire.push(t.elapsed());
        for _ in 0..4 {
            let t = Instant::now();
            a.renew().await.unwrap();
            renew.push(t.elapsed());
        }
        let t = Instant::now();
        a.release().await.unwrap();
        release.push(t.elapsed());
    }
    let pct = |mut v: Vec<Duration>, p: f64| {
        v.sort();
        v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0
    };
    for (what, v) in [("acquire", acquire), ("renew", renew), ("release", release)] {
        println!(
            "{label:<28} {what:<8} calls {:>5}  p50 {:>6.2} ms  p99 {:>6.2} ms",
            v.len(),
            pct(v.clone(), 0.5),
            pct(v, 0.99)
        );
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let runs: usize = value("--runs").map_or(10, |v| v.parse().unwrap());
    let only = value("--only");
    let lease = Duration::from_secs(15);

    println!("lease-call latency, 1 instance acquiring/renewing, 1 told 'held' (sequential)");
    let azurite = Azurite::start();
    let location =
        BlobLocation::from_connection_string(&azurite.connection_string(), "bench", "leader")
            .unwrap();
    let (a, b) = (
        BlobLease::new(&location, lease, Duration::from_secs(3)).unwrap(),
        BlobLease::new(&location, lease, Duration::from_secs(3)).unwrap(),
    );
    lease_calls("blob lease (Azurite)", &a, &b, 100).await;
    drop(azurite);
    let (db, path) = temp_db();
    let store: Arc<dyn orderly_core::store::StateStore> = Arc::new(
        orderly_sql::SqliteStore::open(&db, TimeSource::Database)
            .await
            .unwrap(),
    );
    let sql = |n: &str| {
        StoreLease::new(
            store.clone(),
            "supervisor",
            InstanceId::parse(n).unwrap(),
            lease,
        )
    };
    lease_calls("SQL lease (SQLite)", &sql("a"), &sql("b"), 100).await;
    let _ = std::fs::remove_file(&path);
    let pg_url = std::env::var("ORDERLY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match orderly_sql::connect(&pg_url, TimeSource::Database).await {
        Ok(backend) => {
            let store = backend.store;
            let name = format!("bench-{}", uuid::Uuid::new_v4().simple());
            let pg = |n: &str| {
                StoreLease::new(
                    store.clone(),
                    name.clone(),
                    InstanceId::parse(n).unwrap(),
                    lease,
                )
            };
            lease_calls("SQL lease (PostgreSQL)", &pg("a"), &pg("b"), 100).await;
        }
        Err(e) => println!("SQL lease (PostgreSQL): skipped, PostgreSQL unreachable: {e}"),
    }

    println!();
    println!(
        "failover between two orderly-supervisor processes ({runs} runs each; lease 15 s, renew every 5 s, deadline 10 s, acquire retry 2 s + <=20%)"
    );
    for kind in ["sql", "blob"] {
        if only.as_deref().is_some_and(|o| o != kind) {
            continue;
        }
        for (signal, label) in [("TERM", "graceful (SIGTERM)"), ("KILL", "SIGKILL")] {
            let mut v = Vec::new();
            for _ in 0..runs {
                let election = if kind == "blob" {
                    Election::production(Some(Azurite::start()))
                } else {
                    Election::production(None)
                };
                v.push(failover(&election, signal).await);
            }
            summary(&format!("{kind} lease, {label}"), v);
        }
    }
}
