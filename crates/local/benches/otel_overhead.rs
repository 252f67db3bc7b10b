//! What OpenTelemetry export costs: the same run of real role processes (a submitter,
//! a scheduler, an agent and the simulator on a fresh SQLite store, no faults) with
//! export off and on (to a real OTLP/HTTP receiver in this process, the batch
//! processor on its defaults), rounds alternating so both see the same machine. Prints
//! the time from posting `--orders` orders until all are Processed, per mode (median,
//! best, worst), the on/off ratio of the medians, and the spans received.
//!
//! `cargo bench -p orderly-local --features otel --bench otel_overhead [-- --orders N] [-- --rounds R]`
//! (defaults 500 orders, 5 rounds per mode). Compare the ratio, on an idle machine.

#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/support/procs.rs"]
mod procs;

use std::time::{Duration, Instant};

use orderly_core::ProcessState;
use orderly_core::TimeSource;
use orderly_local::demo;
use orderly_testkit::otlp::OtlpReceiver;
use procs::{Proc, free_port};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn processed(store: &dyn orderly_core::store::StateStore) -> usize {
    store
        .count_by_state()
        .await
        .unwrap()
        .into_iter()
        .find(|(s, _)| *s == ProcessState::Processed)
        .map_or(0, |(_, n)| n as usize)
}

/// One run; the time from the first post until every order is Processed.
async fn run(orders: usize, endpoint: Option<&str>) -> Duration {
    let path = std::env::temp_dir().join(format!(
        "orderly-otel-bench-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let db = format!("sqlite://{}", path.display());
    let backend = orderly_sql::connect(&db, TimeSource::Database)
        .await
        .unwrap();
    orderly_local::system::declare_queues(
        &backend,
        &orderly_core::workflow::Workflow::default(),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let remote = format!("http://{listen}/actions");
    let env: Vec<(&str, &str)> = match endpoint {
        Some(e) => vec![("ORDERLY_OTEL_ENDPOINT", e), ("ORDERLY_LOG", "warn")],
        None => vec![("ORDERLY_LOG", "warn")],
    };
    let sim = Proc::start_with("orderly-remote-sim", &db, &["--listen", &listen], &env);
    while std::net::TcpStream::connect(&listen).is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let roles = [
        Proc::start_with("orderly-submitter", &db, &[], &env),
        Proc::start_with("orderly-scheduler", &db, &[], &env),
        Proc::start_with("orderly-agent", &db, &["--remote-url", &remote], &env),
    ];
    // Let them start (and open the store) before the clock starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    demo::post(backend.transport.as_ref(), &demo::sample_orders(orders))
        .await
        .unwrap();
    while processed(backend.store.as_ref()).await < orders {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "not all Processed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    for mut p in roles {
        p.signal("TERM");
        p.wait(Duration::from_secs(30));
    }
    drop(sim);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    took
}

fn summary(label: &str, v: &mut [Duration]) -> f64 {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = ms(v[v.len() / 2]);
    println!(
        "{label:<28} runs {:>2}  median {:>7.0} ms  best {:>7.0} ms  worst {:>7.0} ms",
        v.len(),
        median,
        ms(v[0]),
        ms(v[v.len() - 1])
    );
    median
}

#[tokio::main]
async fn main() {
    let orders = arg("--orders", 500);
    let rounds = arg("--rounds", 5);
    let receiver = OtlpReceiver::start().await.unwrap();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so neither always meets a warmer machine.
        if round % 2 == 0 {
            off.push(run(orders, None).await);
            on.push(run(orders, Some(receiver.endpoint())).await);
        } else {
            on.push(run(orders, Some(receiver.endpoint())).await);
            off.push(run(orders, None).await);
        }
    }
    println!("{orders} orders, 3 steps each, submitter + scheduler + agent on SQLite");
    let a = summary("export off", &mut off);
    let b = summary("export on (OTLP/HTTP)", &mut on);
    println!(
        "on/off ratio of medians: {:.2}; spans received: {} in {} exports ({:.1} per order per run); refused: {}",
        b / a,
        receiver.spans().len(),
        receiver.exports(),
        receiver.spans().len() as f64 / (orders * rounds) as f64,
        receiver.rejected().len()
    );
}
