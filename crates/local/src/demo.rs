//! `orderly demo` and `orderly bench`: submit orders through the orders queue to a
//! running [`System`] and watch them to the end; the checks of the end state are in
//! [`crate::invariants`].

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use orderly_core::messages::queues;
use orderly_core::store::NewOrder;
use orderly_core::transport::QueueName;
use orderly_core::{OrderId, ProcessState};

use crate::system::System;

/// Posts `orders` to the orders queue in batches; returns when each was sent.
pub async fn submit(
    system: &System,
    orders: &[NewOrder],
) -> anyhow::Result<HashMap<OrderId, DateTime<Utc>>> {
    post(system.backend.transport.as_ref(), orders).await
}

/// Posts `orders` to the orders queue of `transport` in batches of 100.
pub async fn post(
    transport: &dyn orderly_core::transport::Transport,
    orders: &[NewOrder],
) -> anyhow::Result<HashMap<OrderId, DateTime<Utc>>> {
    let queue = QueueName::parse(queues::ORDERS)?;
    let mut sent_at = HashMap::with_capacity(orders.len());
    for chunk in orders.chunks(100) {
        // The message every client sends (the order id is its message id).
        let messages = chunk
            .iter()
            .map(orderly_core::messages::order_submitted)
            .collect::<Result<Vec<_>, _>>()
            .context("invalid order")?;
        let now = Utc::now();
        transport
            .send(&queue, &messages)
            .await
            .context("cannot post to the orders queue")?;
        for o in chunk {
            sent_at.insert(o.order_id.clone(), now);
        }
    }
    Ok(sent_at)
}

/// Waits until every order in `ids` is Processed, Error or Cancelled (or `limit`
/// passes), drawing progress on stderr.
pub async fn wait_done(system: &System, total: usize, limit: Duration) -> anyhow::Result<bool> {
    wait_done_on(system.backend.store.as_ref(), total, limit).await
}

/// [`wait_done`] on a store.
pub async fn wait_done_on(
    store: &dyn orderly_core::store::StateStore,
    total: usize,
    limit: Duration,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    loop {
        let counts = store.count_by_state().await?;
        let get = |s| {
            counts
                .iter()
                .find(|(st, _)| *st == s)
                .map_or(0, |(_, n)| *n as usize)
        };
        let done =
            get(ProcessState::Processed) + get(ProcessState::Error) + get(ProcessState::Cancelled);
        let line = format!(
            "{} {done}/{total}  Processed {}  Error {}  Cancelled {}  in progress {}",
            bar(done, total),
            get(ProcessState::Processed),
            get(ProcessState::Error),
            get(ProcessState::Cancelled),
            get(ProcessState::Pending) + get(ProcessState::Processing),
        );
        if tty {
            eprint!("\r{line}\x1b[K");
            let _ = std::io::stderr().flush();
        } else if last_line.elapsed() >= Duration::from_secs(2) || done >= total {
            eprintln!("{line}");
            last_line = Instant::now();
        }
        if done >= total {
            if tty {
                eprintln!();
            }
            return Ok(true);
        }
        if started.elapsed() > limit {
            if tty {
                eprintln!();
            }
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn bar(done: usize, total: usize) -> String {
    const WIDTH: usize = 30;
    let filled = (done * WIDTH)
        .checked_div(total)
        .map_or(WIDTH, |f| f.min(WIDTH));
    format!("[{}{}]", "#".repeat(filled), ".".repeat(WIDTH - filled))
}

/// Builds `n` sample orders with ids unique to this run.
pub fn sample_orders(n: usize) -> Vec<NewOrder> {
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    (0..n as u64)
        .map(|i| {
            let mut o = orderly_cli::sample::order(i);
            o.order_id = OrderId::parse(format!("demo-{run}-{i:06}")).unwrap_or(o.order_id);
            o
        })
        .collect()
}

/// Ids of a set of orders.
pub fn ids(orders: &[NewOrder]) -> HashSet<OrderId> {
    orders.iter().map(|o| o.order_id.clone()).collect()
}
