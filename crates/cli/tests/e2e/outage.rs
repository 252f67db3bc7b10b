//! A remote service down for 30 s in the middle of a 2-minute run of 2,000 orders, run
//! twice at once on two databases: with backpressure (the fleet sees the service down,
//! the orders that need it wait) and without (each agent's breaker is its own). With
//! it, no order ends in Error because of the outage, orders that do not need the
//! service keep flowing through it, and every order finishes once the service is back;
//! each outage is announced once. Without it, the same outage sends orders to Error:
//! that count is the figure the test prints, and it must not be zero (so the test
//! shows what backpressure changes, and fails without it).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use orderly_cli::system::{System, SystemConfig};
use orderly_cli::{demo, invariants};
use orderly_core::history::HistoryKind;
use orderly_core::service::{OutagePolicy, ServiceAlert};
use orderly_core::store::NewOrder;
use orderly_core::transport::QueueName;
use orderly_core::workflow::Workflow;
use orderly_core::{OrderId, ProcessState};

use crate::both;
use crate::fixtures::{Db, Dialect};

const ORDERS: usize = 2_000;
const RUN: Duration = Duration::from_secs(120);
const DOWN_AT: Duration = Duration::from_secs(30);
const DOWN_FOR: Duration = Duration::from_secs(30);
const PAYMENT: &str = "charge-payment";

/// Every fourth order only reserves stock (its workflow never calls payment).
fn orders() -> Vec<NewOrder> {
    let mut orders = demo::sample_orders(ORDERS);
    for (i, o) in orders.iter_mut().enumerate() {
        if i % 4 == 3 {
            o.workflow = Some("reserve".into());
        }
    }
    orders
}

fn reserve_only() -> Workflow {
    let mut w = Workflow {
        name: "reserve".into(),
        ..Workflow::default()
    };
    w.steps.truncate(1);
    w
}

fn config(backpressure: bool) -> SystemConfig {
    let mut cfg = SystemConfig::new().quick();
    cfg.more_workflows = vec![reserve_only()];
    for s in &mut cfg.more_workflows[0].steps {
        s.timeout_ms = 1_000;
        s.retry.initial_backoff_ms = 10;
        s.retry.max_backoff_ms = 200;
    }
    // The agents' default: five transient failures in a row open a breaker.
    cfg.breaker_threshold = 5;
    cfg.outages = backpressure.then(|| OutagePolicy {
        probe_after: Duration::from_secs(5),
        probe_max: Duration::from_secs(10),
        resume_per_second: 200,
    });
    cfg
}

/// What one run saw.
struct Run {
    system: System,
    orders: Vec<NewOrder>,
    sent: HashMap<OrderId, DateTime<Utc>>,
    /// When the service went down and came back (wall clock, as the stores' clocks).
    down: (DateTime<Utc>, DateTime<Utc>),
}

/// Posts the orders evenly over two minutes, the payment service down from 30 s to
/// 60 s, then waits (at most two more minutes) for every order to finish.
async fn run(db: &Db, backpressure: bool) -> Run {
    let system = System::start(db.backend().await, config(backpressure))
        .await
        .unwrap();
    let orders = orders();
    let started = Instant::now();
    let mut sent = HashMap::with_capacity(ORDERS);
    let mut down = (Utc::now(), Utc::now());
    let sim = system.sim.clone().unwrap();
    let per_tick = 5;
    let tick = RUN / (ORDERS / per_tick) as u32;
    let mut state = 0;
    for (n, chunk) in orders.chunks(per_tick).enumerate() {
        let due = tick * n as u32;
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        if state == 0 && started.elapsed() >= DOWN_AT {
            sim.set_down(PAYMENT, true);
            down.0 = Utc::now();
            state = 1;
        }
        if state == 1 && started.elapsed() >= DOWN_AT + DOWN_FOR {
            sim.set_down(PAYMENT, false);
            down.1 = Utc::now();
            state = 2;
        }
        sent.extend(demo::submit(&system, chunk).await.unwrap());
    }
    assert_eq!(state, 2, "the outage began and ended within the run");
    let done = demo::wait_done(&system, ORDERS, Duration::from_secs(120))
        .await
        .unwrap();
    assert!(
        done,
        "every order finishes (backpressure {backpressure}) within 2 minutes of the last"
    );
    Run {
        system,
        orders,
        sent,
        down,
    }
}

async fn count(system: &System, state: ProcessState) -> usize {
    crate::processes::count(system.backend.store.as_ref(), state).await
}

both!(
    a_service_down_for_30_s_pauses_only_the_orders_that_need_it_and_none_ends_in_error,
    outage
);
async fn outage(dialect: Dialect) {
    let (with_db, without_db) = (Db::new(dialect).await, Db::new(dialect).await);
    let (with, without) = tokio::join!(run(&with_db, true), run(&without_db, false));

    // Without backpressure: the figure, and the reason the feature exists.
    let lost_without = count(&without.system, ProcessState::Error).await;
    let store = without.system.backend.store.clone();
    let report = invariants::report_on(
        store.as_ref(),
        Some(without.system.sim.as_ref().unwrap().effects()),
        &without.sent,
        &without.system.workflows,
        true,
    )
    .await
    .unwrap();
    assert_eq!(
        report.violations,
        Vec::<String>::new(),
        "without backpressure"
    );
    without.system.stop(Duration::from_secs(5)).await;

    // With backpressure: nothing in Error, every order Processed, the ledger agrees.
    let system = &with.system;
    let store = system.backend.store.clone();
    let in_error = count(system, ProcessState::Error).await;
    let processed = count(system, ProcessState::Processed).await;
    let report = invariants::report_on(
        store.as_ref(),
        Some(system.sim.as_ref().unwrap().effects()),
        &with.sent,
        &system.workflows,
        true,
    )
    .await
    .unwrap();
    assert_eq!(report.violations, Vec::<String>::new(), "with backpressure");

    // Who waited, and who kept flowing while payment was down.
    let (down_at, up_at) = with.down;
    let mut waited = 0;
    let mut failures = 0;
    let mut reserve_during = 0;
    let mut reserve_done_during = 0;
    for o in &with.orders {
        let view = store.get(&o.order_id).await.unwrap();
        if view.history.iter().any(|h| h.kind == HistoryKind::Waiting) {
            waited += 1;
        }
        failures += view.state.failure_count;
        let sent = with.sent[&o.order_id];
        // Reserve-only orders posted in the first two thirds of the outage.
        if o.workflow.as_deref() == Some("reserve")
            && sent >= down_at
            && sent < down_at + chrono::Duration::seconds(20)
        {
            reserve_during += 1;
            let completed = view
                .history
                .iter()
                .find(|h| h.kind == HistoryKind::Completed)
                .map(|h| h.at);
            if completed.is_some_and(|at| at < up_at) {
                reserve_done_during += 1;
            }
        }
    }
    // One announcement of the outage's start and one of its end.
    let alerts = QueueName::parse(orderly_core::messages::queues::ALERTS).unwrap();
    let got = system
        .backend
        .transport
        .receive(&alerts, 100, Duration::from_millis(200))
        .await
        .unwrap();
    let outages: Vec<ServiceAlert> = got
        .iter()
        .filter_map(|m| serde_json::from_slice::<ServiceAlert>(&m.body).ok())
        .collect();
    let kinds: Vec<(String, String)> = outages
        .iter()
        .map(|a| (a.kind.clone(), a.service.clone()))
        .collect();
    let store_services = store.services().await.unwrap();
    with.system.stop(Duration::from_secs(5)).await;

    eprintln!(
        "outage of {PAYMENT} for {} s in a {} s run of {ORDERS} orders ({dialect:?}): \
         with backpressure {processed} Processed, {in_error} in Error, {waited} orders waited \
         for it (failures counted in all: {failures}), reserve-only orders posted during it \
         done before it ended: {reserve_done_during}/{reserve_during}; \
         without backpressure: {lost_without} orders in Error",
        DOWN_FOR.as_secs(),
        RUN.as_secs(),
    );
    assert_eq!(in_error, 0, "no order ends in Error because of the outage");
    assert_eq!(
        processed, ORDERS,
        "every order finishes once the service is back"
    );
    assert!(waited > 0, "orders that needed payment waited for it");
    assert!(reserve_during > 0);
    assert_eq!(
        reserve_done_during, reserve_during,
        "orders that do not need payment keep flowing during its outage"
    );
    assert_eq!(
        kinds,
        vec![
            ("service_down".to_owned(), "agent.payment".to_owned()),
            ("service_up".to_owned(), "agent.payment".to_owned())
        ],
        "one alert when it went down, one when it came back: {outages:?}"
    );
    assert!(
        store_services
            .iter()
            .any(|h| h.service == "agent.payment" && h.outage == 1),
        "{store_services:?}"
    );
    assert!(
        lost_without > 0,
        "without backpressure the same outage sends orders to Error"
    );
}
