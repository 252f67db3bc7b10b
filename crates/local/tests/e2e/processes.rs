//! The real binaries as separate processes over one database, some of them killed
//! with SIGKILL: nothing may be lost, nothing done twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use orderly_core::ProcessState;
use orderly_core::history::HistoryKind;
use orderly_core::store::{OrderFilter, StateStore};
use orderly_local::{demo, invariants};
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

/// `url` with its host and port replaced by the forwarder on 127.0.0.1:`port`.
fn through(url: &str, port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap();
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let through = url.replacen(host, &format!("127.0.0.1:{port}"), 1);
    assert_ne!(through, url, "{host}");
    through
}

fn upstream_port(url: &str) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap();
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    host.rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or(5432)
}

/// A scheduler cut off from PostgreSQL by a partition (a forwarder the test cuts: no
/// byte through either way, nothing reset, its process alive) while its steps are at
/// the agent: its deadlines pass, the supervisor puts its orders back, another
/// scheduler does them; each step takes effect once at the service, the cut-off
/// scheduler records nothing after the recovery (its late writes are fenced by the
/// epoch), and healed, it drops the connections the partition killed and works again
/// instead of waiting on them for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scheduler_cut_off_from_postgres_mid_step_is_fenced_and_works_again_once_healed() {
    let (db, backend) = Db::with_queues(Dialect::Postgres, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let partition = crate::procs::Partition::to(upstream_port(&db.url)).await;
    let cut_off_url = through(&db.url, partition.port);
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    // Each call takes 1.5 s: the first steps are at the service when the cut comes.
    let _sim = start_sim(&db.url, port, &["--latency-ms", "1500"]);
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
    let _agents = [
        Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]),
        Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]),
    ];
    // A waits 3 s for any answer of the database (60 s unless set).
    let a = Proc::start_with(
        "orderly-scheduler",
        &cut_off_url,
        &[
            "--instance-id",
            "scheduler-a",
            "--processing-timeout-ms",
            "4000",
        ],
        &[(orderly_sql::postgres::ANSWER_TIMEOUT_SETTING, "3s")],
    );
    let orders = demo::sample_orders(20);
    let mut sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for(
        "scheduler A to claim every order and send its first step",
        Duration::from_secs(60),
        async || {
            let mut sent_steps = 0;
            for o in &orders {
                let Ok(view) = store.get(&o.order_id).await else {
                    return false;
                };
                if view.state.locked_by.as_ref().map(|l| l.as_str()) != Some("scheduler-a") {
                    return false;
                }
                sent_steps += view
                    .history
                    .iter()
                    .filter(|e| e.kind == HistoryKind::StepStarted)
                    .count();
            }
            sent_steps >= orders.len()
        },
    )
    .await;
    partition.cut();
    let cut = chrono::Utc::now();
    let b = Proc::start(
        "orderly-scheduler",
        &db.url,
        &[
            "--instance-id",
            "scheduler-b",
            "--processing-timeout-ms",
            "4000",
        ],
    );
    wait_for(
        "every order to be Processed by scheduler B",
        Duration::from_secs(120),
        async || count(store.as_ref(), ProcessState::Processed).await == orders.len(),
    )
    .await;
    // Healed, A's late replies (the agents answered its steps into the shared queue)
    // and its new work go through its new connections.
    partition.heal();
    let mut b = b;
    b.signal("TERM");
    assert!(b.wait(Duration::from_secs(30)).success());
    let after = demo::sample_orders(10);
    sent.extend(
        demo::post(backend.transport.as_ref(), &after)
            .await
            .unwrap(),
    );
    wait_for(
        "scheduler A, healed, to process new orders",
        Duration::from_secs(120),
        async || count(store.as_ref(), ProcessState::Processed).await == orders.len() + after.len(),
    )
    .await;

    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        let recovered = view
            .history
            .iter()
            .find(|e| e.kind == HistoryKind::Recovered)
            .unwrap_or_else(|| panic!("order {} was not recovered", o.order_id));
        assert!(recovered.at > cut, "recovered after the cut");
        // Nothing of A's is recorded after the recovery: its late writes were fenced.
        let late: Vec<_> = view
            .history
            .iter()
            .filter(|e| e.at > recovered.at && e.actor.as_str().starts_with("scheduler-a"))
            .collect();
        assert!(late.is_empty(), "order {}: {late:?}", o.order_id);
        let last = view.history.last().unwrap();
        assert_eq!(last.kind, HistoryKind::Completed);
        assert!(last.actor.as_str().starts_with("scheduler-b"), "{last:?}");
    }
    for o in &after {
        let view = store.get(&o.order_id).await.unwrap();
        let last = view.history.last().unwrap();
        assert_eq!(last.kind, HistoryKind::Completed);
        assert!(last.actor.as_str().starts_with("scheduler-a"), "{last:?}");
    }
    let report = assert_invariants(store.as_ref(), port, &sent, Some(3 * 30)).await;
    assert_eq!(report.count(ProcessState::Processed), 30);
    // A gave up on the statements the partition left unanswered, and said so.
    let log = a.output();
    assert!(
        log.contains("the database did not answer within 3000 ms"),
        "{log}"
    );
}

/// The answer timeout is checked with the rest of the settings: a value that is not a
/// whole number of milliseconds stops start-up (and `--check-config`), naming it.
#[test]
fn an_answer_timeout_that_is_not_a_duration_stops_start_up_naming_it() {
    let setting = orderly_sql::postgres::ANSWER_TIMEOUT_SETTING;
    let old = "ORDERLY_DATABASE_ANSWER_TIMEOUT_MS";
    for (name, value, ok) in [
        (setting, "2500ms", true),
        (setting, "60s", true),
        (setting, "2500", false),
        (setting, "99ms", false),
        (setting, "0", false),
        // The old name, in milliseconds, is still read (with a warning).
        (old, "2500", true),
        (old, "99", false),
    ] {
        let out = std::process::Command::new(crate::procs::bin("orderly-scheduler"))
            .arg("--check-config")
            .env("ORDERLY_DATABASE_URL", crate::fixtures::postgres_url())
            .env(name, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), ok, "{name}={value}: {stderr}");
        if name == old && ok {
            assert!(
                stderr.contains(&format!("{old} is the old name of {setting}")),
                "the old name is read with a warning: {stderr}"
            );
        } else {
            assert_eq!(stderr.contains(setting), !ok, "{name}={value}: {stderr}");
        }
    }
}
