//! SQL queue benchmark: prints figures, asserts only that every message arrived once.
//!
//!     cargo bench -p orderly-sql --bench queue
//!
//! `ORDERLY_BENCH_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`)
//! names the PostgreSQL database (a scratch schema is created and dropped);
//! `ORDERLY_BENCH_DIALECTS=sqlite` or `=postgres` runs one dialect.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::Db;
use orderly_core::transport::QueueSettings;
use orderly_core::transport::{OutgoingMessage, QueueName};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// A producer sends `total` messages in sends of `batch` while a consumer (its own
/// handle) receives up to `batch` at a time and completes each. Messages per second.
async fn throughput(db: &Db, batch: usize, total: usize) -> f64 {
    let producer = db.open().await.transport();
    let consumer = db.open().await.transport();
    let q = QueueName::parse("bench").unwrap();
    producer
        .declare_queue(&q, &QueueSettings::default())
        .await
        .unwrap();
    let started = Instant::now();
    let pq = q.clone();
    let sending = tokio::spawn(async move {
        let mut n = 0;
        while n < total {
            let msgs: Vec<_> = (n..(n + batch).min(total))
                .map(|i| {
                    OutgoingMessage::new(
                        format!("m-{i}"),
                        br#"{"order_id":"o","step":"charge-payment"}"#.to_vec(),
                    )
                })
                .collect();
            n += msgs.len();
            producer.send(&pq, &msgs).await.unwrap();
        }
    });
    let mut seen = HashSet::with_capacity(total);
    while seen.len() < total {
        let got = consumer
            .receive(&q, batch as u32, Duration::from_secs(5))
            .await
            .unwrap();
        for verdict in consumer.complete_messages(&got).await.unwrap() {
            verdict.unwrap();
        }
        for m in got {
            assert!(seen.insert(m.message_id), "delivered twice");
        }
    }
    sending.await.unwrap();
    total as f64 / started.elapsed().as_secs_f64()
}

/// An idle consumer on its own handle waits; a producer sends one message at a time;
/// time from before the send to the consumer holding it. (p50, p99)
async fn wake_up(db: &Db, rounds: usize) -> (Duration, Duration) {
    let producer = db.open().await.transport();
    let consumer = db.open().await.transport();
    let q = QueueName::parse("wake").unwrap();
    producer
        .declare_queue(&q, &QueueSettings::default())
        .await
        .unwrap();
    let mut latencies = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let cq = q.clone();
        let c = consumer.clone();
        let waiting = tokio::spawn(async move {
            let got = c.receive(&cq, 1, Duration::from_secs(10)).await.unwrap();
            let at = Instant::now();
            c.complete(&got[0]).await.unwrap();
            at
        });
        // Let the consumer find the queue empty and go idle.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent = Instant::now();
        producer
            .send(&q, &[OutgoingMessage::new(format!("w-{i}"), b"x".to_vec())])
            .await
            .unwrap();
        let received = waiting.await.unwrap();
        latencies.push(received - sent);
    }
    latencies.sort();
    (percentile(&latencies, 0.5), percentile(&latencies, 0.99))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let dialects =
        std::env::var("ORDERLY_BENCH_DIALECTS").unwrap_or_else(|_| "sqlite,postgres".into());
    println!(
        "orderly SQL queue benchmark (send + receive + complete; {} cores)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    for kind in dialects.split(',').map(str::trim) {
        for batch in [1usize, 32] {
            let db = Db::fresh(kind).await;
            let total = if batch == 1 { 2_000 } else { 10_000 };
            let rate = throughput(&db, batch, total).await;
            println!(
                "{:<10} batch {batch:>2}: {rate:>8.0} messages/s ({total} messages)",
                db.name()
            );
            db.drop_all().await;
        }
        let db = Db::fresh(kind).await;
        let (p50, p99) = wake_up(&db, 200).await;
        println!(
            "{:<10} wake-up of an idle consumer on another handle: p50 {}  p99 {}",
            db.name(),
            ms(p50),
            ms(p99)
        );
        db.drop_all().await;
    }
}
