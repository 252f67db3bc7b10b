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
use orderly_core::history::HistoryKind;
use orderly_core::service::{OutagePolicy, ServiceAlert};
use orderly_core::store::NewOrder;
use orderly_core::transport::QueueName;
use orderly_core::workflow::Workflow;
use orderly_core::{OrderId, ProcessState};
use orderly_local::system::{System, SystemConfig};
use orderly_local::{demo, invariants};

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

both!(
    an_operator_sees_orders_waiting_for_a_service_that_is_down_and_resumes_them,
    operator_journey
);
/// The roles as separate processes on a new database, the operator at the command
/// line: payment goes down, the orders wait at their payment step (nothing counted,
/// nothing in Error), `orderly services` shows the outage and `orderly list
/// --waiting-for` each order waiting and why; once payment is back the operator
/// resumes them with `orderly services --resume` (before any probe would), and every
/// order ends Processed with each step in effect once. The leading supervisor
/// announces the outage once, and its end once.
async fn operator_journey(dialect: Dialect) {
    use crate::newcomer::orderly;
    use crate::processes::{assert_invariants, start_sim};
    use crate::procs::{Proc, free_port, wait_for};

    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(&db.url, port, &[]);
    let http = crate::procs::http();
    let fault = format!("http://127.0.0.1:{port}/faults/down/{PAYMENT}");
    assert!(http.put(&fault).send().await.unwrap().status().is_success());
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let _scheduler = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--processing-timeout-ms", "5000"],
    );
    let _agent = Proc::start(
        "orderly-agent",
        &db.url,
        &[
            "--remote-url",
            &remote,
            "--breaker-failures",
            "3",
            // No probe within the test: the operator brings it back.
            "--probe-after-ms",
            "600000",
            "--probe-max-ms",
            "600000",
        ],
    );
    let supervisor = Proc::start("orderly-supervisor", &db.url, &["--interval-ms", "200"]);
    let orders = demo::sample_orders(20);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for(
        "20 orders waiting for payment",
        Duration::from_secs(60),
        async || {
            store
                .services()
                .await
                .unwrap()
                .iter()
                .any(|h| h.service == "agent.payment" && h.waiting == 20)
        },
    )
    .await;
    for o in &orders {
        let r = store.get(&o.order_id).await.unwrap().state;
        assert_eq!(
            (r.process_state, r.failure_count, r.current_step),
            (ProcessState::Pending, 0, 1),
            "{} waits at its payment step, uncounted",
            o.order_id
        );
    }

    let (ok, out, err) = orderly(&db.url, &["services"], &[]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("agent.payment"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("Down") && line.contains(" 20 ") && line.contains("503"),
        "{out}"
    );
    let (ok, out, err) = orderly(&db.url, &["list", "--waiting-for", "agent.payment"], &[]);
    assert!(ok, "{err}");
    assert_eq!(
        out.matches("waiting: agent.payment down since").count(),
        20,
        "{out}"
    );
    assert!(out.contains("20 orders"), "{out}");

    // The dashboard shows the outage, with a Resume button.
    let dash_port = free_port();
    let listen = format!("127.0.0.1:{dash_port}");
    let _dashboard = Proc::start("orderly", &db.url, &["dashboard", "--listen", &listen]);
    let base = format!("http://{listen}");
    wait_for("the dashboard", Duration::from_secs(20), async || {
        http.get(&base).send().await.is_ok()
    })
    .await;
    let page = http.get(&base).send().await.unwrap();
    let csrf = crate::procs::csrf_cookie(&page);
    let html = page.text().await.unwrap();
    assert!(
        html.contains(r#"id="service-agent.payment" class="Error">Down"#)
            && html.contains(r#"id="waiting-agent.payment">20<"#)
            && html.contains("Resume its 20 waiting orders"),
        "{html}"
    );
    // A forged form (no CSRF token) is refused and changes nothing.
    let forged = http
        .post(format!("{base}/services/agent.payment/resume"))
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(
        store
            .services()
            .await
            .unwrap()
            .iter()
            .any(|h| h.service == "agent.payment" && h.waiting == 20),
        "a refused form resumes nothing"
    );

    assert!(
        http.delete(&fault)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    match dialect {
        // At the command line...
        Dialect::Sqlite => {
            let (ok, out, err) = orderly(
                &db.url,
                &[
                    "services",
                    "--resume",
                    "agent.payment",
                    "--operator",
                    "erin",
                ],
                &[],
            );
            assert!(ok, "{err}");
            assert!(
                out.contains("agent.payment marked up by operator:erin: 20 waiting orders resume"),
                "{out}"
            );
        }
        // ... or with the dashboard's button.
        Dialect::Postgres => {
            let resumed = http
                .post(format!("{base}/services/agent.payment/resume"))
                .header("cookie", format!("orderly_csrf={csrf}"))
                .form(&[("csrf", csrf.as_str())])
                .send()
                .await
                .unwrap();
            assert!(resumed.status().is_success(), "{resumed:?}");
        }
    }
    wait_for("20 orders processed", Duration::from_secs(60), async || {
        crate::processes::count(store.as_ref(), ProcessState::Processed).await == 20
    })
    .await;
    assert_invariants(store.as_ref(), port, &sent, Some(60)).await;
    let view = store.get(&orders[0].order_id).await.unwrap();
    let kinds: Vec<HistoryKind> = view.history.iter().map(|h| h.kind).collect();
    assert!(
        kinds.contains(&HistoryKind::Waiting) && kinds.contains(&HistoryKind::WaitEnded),
        "{kinds:?}"
    );
    wait_for(
        "the outage's end announced",
        Duration::from_secs(10),
        async || supervisor.output().contains("ALERT RESOLVED"),
    )
    .await;
    let log = supervisor.output();
    assert_eq!(
        log.matches("ALERT: remote service down").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("ALERT RESOLVED").count(), 1, "{log}");
}
