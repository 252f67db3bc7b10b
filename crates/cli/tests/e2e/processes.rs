//! The real binaries as separate processes over one database, some of them killed
//! with SIGKILL: nothing may be lost, nothing done twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use orderly_cli::{demo, invariants};
use orderly_core::ProcessState;
use orderly_core::history::HistoryKind;
use orderly_core::store::{OrderFilter, StateStore};
use orderly_remote_sim::Effect;
use rand::Rng;

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::procs::{Proc, free_port, wait_for};

pub(crate) async fn ledger(port: u16) -> Vec<Effect> {
    crate::procs::get(format!("http://127.0.0.1:{port}/ledger"))
        .await
        .expect("the simulator answers")
        .json()
        .await
        .unwrap()
}

/// The invariants after a run against the simulator on `sim_port`: no (order, action)
/// applied twice at the service, every invariant of the demo's report holds, and (if
/// given) exactly `effects` effects applied. Returns the report.
pub(crate) async fn assert_invariants(
    store: &dyn StateStore,
    sim_port: u16,
    sent: &std::collections::HashMap<orderly_core::OrderId, chrono::DateTime<chrono::Utc>>,
    effects: Option<usize>,
) -> invariants::Report {
    let applied = ledger(sim_port).await;
    if let Some(n) = effects {
        assert_eq!(applied.len(), n, "effects applied at the service");
    }
    assert!(orderly_remote_sim::double_effects(&applied).is_empty());
    let report = invariants::report_on(
        store,
        Some(applied),
        sent,
        &orderly_core::workflow::Workflows::default(),
        true,
    )
    .await
    .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    report
}

pub(crate) async fn count(store: &dyn StateStore, state: ProcessState) -> usize {
    store
        .count_by_state()
        .await
        .unwrap()
        .into_iter()
        .find(|(s, _)| *s == state)
        .map_or(0, |(_, n)| n as usize)
}

pub(crate) fn start_sim(db: &str, port: u16, args: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec!["--listen", listen.as_str()];
    all.extend_from_slice(args);
    let sim = Proc::start("orderly-remote-sim", db, &all);
    // Wait until it listens.
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "simulator did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sim
}

both!(
    a_scheduler_killed_mid_run_has_its_orders_recovered_and_completed_by_another,
    killed_scheduler
);
async fn killed_scheduler(dialect: Dialect) {
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(&db.url, port, &[]);
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let _supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &[
            "--interval-ms",
            "200",
            "--backoff-base-ms",
            "200",
            "--backoff-max-ms",
            "1000",
        ],
    );
    let a = Proc::start(
        "orderly-scheduler",
        &db.url,
        &[
            "--instance-id",
            "scheduler-a",
            "--processing-timeout-ms",
            "2500",
        ],
    );
    let orders = demo::sample_orders(40);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();

    // Scheduler A claims every order and sends each its first step; no agent runs yet.
    wait_for(
        "scheduler A to claim every order",
        Duration::from_secs(60),
        async || {
            let page = store
                .list(&OrderFilter {
                    state: Some(ProcessState::Processing),
                    limit: 100,
                    ..OrderFilter::default()
                })
                .await
                .unwrap();
            page.orders.len() == 40
                && page
                    .orders
                    .iter()
                    .all(|o| o.locked_by.as_ref().unwrap().as_str() == "scheduler-a")
        },
    )
    .await;
    a.kill();
    // The supervisor finds A's deadlines passed and puts the orders back.
    wait_for(
        "the supervisor to recover A's orders",
        Duration::from_secs(60),
        async || count(store.as_ref(), ProcessState::Processing).await == 0,
    )
    .await;
    let _b = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--instance-id", "scheduler-b"],
    );
    let _agent = Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    wait_for(
        "every order to be Processed",
        Duration::from_secs(90),
        async || count(store.as_ref(), ProcessState::Processed).await == 40,
    )
    .await;

    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        let story: Vec<(HistoryKind, String)> = view
            .history
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    HistoryKind::Claimed | HistoryKind::Recovered | HistoryKind::Completed
                )
            })
            .map(|e| {
                (
                    e.kind,
                    e.actor.as_str().split('@').next().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            story,
            [
                (HistoryKind::Claimed, "scheduler-a".to_owned()),
                (HistoryKind::Recovered, "supervisor".to_owned()),
                (HistoryKind::Claimed, "scheduler-b".to_owned()),
                (HistoryKind::Completed, "scheduler-b".to_owned()),
            ],
            "order {}",
            o.order_id
        );
        assert_eq!(view.state.failure_count, 1, "one timeout, counted once");
        // A's step requests reached the agent after A's deadline: it stayed silent, so
        // every step was recorded under B's term only.
        let b_epoch = view.state.lock_epoch;
        assert!(
            view.history
                .iter()
                .filter(|e| e.kind == HistoryKind::StepSucceeded)
                .all(|e| e.epoch == b_epoch && e.actor.as_str() == "scheduler-b")
        );
    }
    assert_invariants(store.as_ref(), port, &sent, Some(120)).await;
}

both!(
    schedulers_and_agents_killed_at_random_points_lose_nothing_and_do_nothing_twice,
    random_kills
);
async fn random_kills(dialect: Dialect) {
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(3)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(
        &db.url,
        port,
        &[
            "--latency-ms",
            "5",
            "--transient-rate",
            "0.05",
            "--hang-rate",
            "0.03",
            "--hang-ms",
            "10000",
        ],
    );
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let sweep = [
        "--interval-ms",
        "200",
        "--backoff-base-ms",
        "200",
        "--backoff-max-ms",
        "1000",
        "--max-failures",
        "20",
    ];
    let _supervisors = [
        Proc::start("orderly-supervisor", &db.url, &sweep),
        Proc::start("orderly-supervisor", &db.url, &sweep),
    ];
    let scheduler = || {
        Proc::start(
            "orderly-scheduler",
            &db.url,
            &["--processing-timeout-ms", "3000"],
        )
    };
    let agent = || Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    let mut schedulers = vec![scheduler(), scheduler()];
    let mut agents = vec![agent(), agent()];
    let orders = demo::sample_orders(200);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();

    // Eight kills at random moments, alternating roles; each victim is replaced.
    let mut kills = 0;
    for round in 0..8 {
        let pause = rand::rng().random_range(150..700);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let pool = if round % 2 == 0 {
            &mut schedulers
        } else {
            &mut agents
        };
        let victim = rand::rng().random_range(0..pool.len());
        pool.remove(victim).kill();
        kills += 1;
        pool.push(if round % 2 == 0 { scheduler() } else { agent() });
    }
    assert_eq!(kills, 8);
    wait_for(
        "every order to finish",
        Duration::from_secs(120),
        async || {
            count(store.as_ref(), ProcessState::Processed).await
                + count(store.as_ref(), ProcessState::Error).await
                == 200
        },
    )
    .await;
    let effects = ledger(port).await;
    let report = invariants::report_on(
        store.as_ref(),
        Some(effects.clone()),
        &sent,
        &orderly_core::workflow::Workflows::default(),
        true,
    )
    .await
    .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(
        report.count(ProcessState::Processed),
        200,
        "{:?}",
        report.by_state
    );
    assert!(orderly_remote_sim::double_effects(&effects).is_empty());
    let per_order: HashMap<&str, usize> = effects.iter().fold(HashMap::new(), |mut m, e| {
        *m.entry(e.order_id.as_str()).or_default() += 1;
        m
    });
    assert!(
        per_order.values().all(|n| *n == 3),
        "three effects per order"
    );
}
