//! The pre-retry check of uncertain steps: a payment whose reply was lost after it was
//! charged, at a service that forgets idempotency keys at once, is asked about through
//! its status probe before it is sent again, and is not charged twice. The same runs
//! without the probe show the double charge, so these tests can fail.

use std::time::Duration;

use orderly_core::ProcessState;
use orderly_core::history::HistoryKind;
use orderly_core::workflow::{NotFound, StatusProbe};
use orderly_local::system::{System, SystemConfig};
use orderly_local::{demo, invariants};
use orderly_remote_sim::{Sim, SimConfig, double_effects};
use tokio_util::sync::CancellationToken;

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::procs::{Proc, wait_for};

const ORDERS: usize = 8;

/// What one run ended with.
struct Run {
    /// Orders whose payment took effect more than once.
    doubles: usize,
    /// Invariant violations found.
    violations: Vec<String>,
    /// Orders whose history records that the probe found the payment applied.
    confirmed_by_probe: usize,
    /// Orders that came back after a timeout (FailureCount > 0).
    recovered: usize,
}

/// Runs `ORDERS` orders through a payment service that loses the reply of each first
/// charge after applying it (hanging for `hang`) and forgets keys at once.
async fn run(dialect: Dialect, hang: Duration, probe: bool) -> Run {
    let db = Db::new(dialect).await;
    let sim = Sim::new(SimConfig {
        lose_reply_actions: vec!["charge-payment".into()],
        forget_keys_after: Some(Duration::ZERO),
        hang_for: hang,
        ..SimConfig::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop_sim = CancellationToken::new();
    tokio::spawn(sim.clone().serve(listener, stop_sim.clone()));

    let mut cfg = SystemConfig::new().quick();
    cfg.sim = None;
    cfg.remote_url = Some(format!("http://{addr}/actions"));
    if probe {
        let payment = cfg
            .workflow
            .steps
            .iter_mut()
            .find(|s| s.name == "charge-payment")
            .unwrap();
        payment.probe = Some(StatusProbe {
            url: format!("http://{addr}/status/{{key}}"),
            not_found: NotFound::NotApplied,
        });
    }
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let orders = demo::sample_orders(ORDERS);
    let sent = demo::submit(&system, &orders).await.unwrap();
    let store = system.backend.store.clone();
    wait_for(
        "every order Processed",
        Duration::from_secs(90),
        async || crate::processes::count(store.as_ref(), ProcessState::Processed).await == ORDERS,
    )
    .await;
    let workflows = system.workflows.clone();
    system.stop(Duration::from_secs(5)).await;
    stop_sim.cancel();
    let effects = sim.effects();
    let report = invariants::report_on(
        store.as_ref(),
        Some(effects.clone()),
        &sent,
        &workflows,
        true,
    )
    .await
    .unwrap();
    let mut confirmed_by_probe = 0;
    let mut recovered = 0;
    for id in sent.keys() {
        let view = store.get(id).await.unwrap();
        if view.state.failure_count > 0 {
            recovered += 1;
        }
        if view.history.iter().any(|h| {
            h.kind == HistoryKind::StepSucceeded
                && h.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("status probe: applied before, not called again"))
        }) {
            confirmed_by_probe += 1;
        }
    }
    Run {
        doubles: double_effects(&effects).len(),
        violations: report.violations,
        confirmed_by_probe,
        recovered,
    }
}

both!(
    a_lost_reply_retried_by_the_agent_is_asked_about_first_and_not_applied_twice,
    agent_retry
);
/// The reply is lost after 300 ms, inside the step's 1 s budget: the agent sees a
/// failure without an answer and tries again, asking the probe first.
async fn agent_retry(dialect: Dialect) {
    let hang = Duration::from_millis(300);
    let with = run(dialect, hang, true).await;
    assert_eq!(with.doubles, 0, "{:?}", with.violations);
    assert!(with.violations.is_empty(), "{:?}", with.violations);
    assert_eq!(
        with.confirmed_by_probe, ORDERS,
        "the history says the probe decided"
    );
    let without = run(dialect, hang, false).await;
    assert_eq!(
        without.doubles, ORDERS,
        "without the probe every payment is charged twice"
    );
    assert!(
        without
            .violations
            .iter()
            .any(|v| v.contains("charge-payment took effect 2 times")),
        "{:?}",
        without.violations
    );
}

both!(
    a_step_sent_again_after_a_timeout_is_asked_about_first_and_not_applied_twice,
    after_recovery
);
/// The reply is lost for longer than the step's budget: the agent gives up, the order
/// times out, the supervisor sends it back and the scheduler sends the step again as
/// uncertain; the agent asks the probe before calling.
async fn after_recovery(dialect: Dialect) {
    let hang = Duration::from_secs(5);
    let with = run(dialect, hang, true).await;
    assert_eq!(
        with.recovered, ORDERS,
        "every order came back after a timeout"
    );
    assert_eq!(with.doubles, 0, "{:?}", with.violations);
    assert!(with.violations.is_empty(), "{:?}", with.violations);
    assert_eq!(
        with.confirmed_by_probe, ORDERS,
        "the history says the probe decided"
    );
    let without = run(dialect, hang, false).await;
    assert_eq!(without.recovered, ORDERS);
    assert_eq!(
        without.doubles, ORDERS,
        "without the probe every payment is charged twice"
    );
}

both!(
    the_role_binaries_ask_a_declared_probe_before_sending_a_step_again,
    binaries
);
/// The journey as an operator sets it up: the workflow file declares the payment's
/// status probe, the simulator runs as its own process with the two faults on its
/// command line (replies lost after the charge, keys forgotten at once), and the roles
/// run as separate processes. Every order is charged once.
async fn binaries(dialect: Dialect) {
    let port = crate::procs::free_port();
    let dir = std::env::temp_dir().join(format!("orderly-probe-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("order.toml");
    std::fs::write(
        &path,
        format!(
            r#"
name = "order"
[[steps]]
name = "reserve-inventory"
queue = "agent.inventory"
timeout_ms = 10000
compensation = "release-inventory"
[[steps]]
name = "charge-payment"
queue = "agent.payment"
timeout_ms = 10000
compensation = "refund"
probe = {{ url = "http://127.0.0.1:{port}/status/{{key}}" }}
[[steps]]
name = "ship"
queue = "agent.shipping"
timeout_ms = 10000
"#
        ),
    )
    .unwrap();
    let workflow = orderly_runtime::load_workflow(Some(&path)).unwrap();
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let _sim = crate::processes::start_sim(
        &db.url,
        port,
        &[
            "--lose-reply-actions",
            "charge-payment",
            "--forget-keys-after-ms",
            "0",
            "--hang-ms",
            "300",
        ],
    );
    let workflow_arg = path.display().to_string();
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let _supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &["--interval-ms", "200", "--backoff-base-ms", "200"],
    );
    let _scheduler = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--workflow", &workflow_arg, "--shutdown-grace-ms", "0"],
    );
    let remote = format!("http://127.0.0.1:{port}/actions");
    // Every first charge hangs and fails: the agent's breaker opens and the fleet sees
    // payment down for a while (backpressure is on by default); a short wait before
    // the probe keeps this test about the status probe.
    let _agent = Proc::start(
        "orderly-agent",
        &db.url,
        &["--remote-url", &remote, "--probe-after-ms", "500"],
    );
    let orders = demo::sample_orders(ORDERS);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for(
        "every order Processed",
        Duration::from_secs(60),
        async || crate::processes::count(store.as_ref(), ProcessState::Processed).await == ORDERS,
    )
    .await;
    let effects = crate::processes::ledger(port).await;
    assert_eq!(
        double_effects(&effects),
        Vec::new(),
        "nothing charged twice"
    );
    let report = invariants::report_on(
        store.as_ref(),
        Some(effects),
        &sent,
        &orderly_core::workflow::Workflows::single(workflow).unwrap(),
        true,
    )
    .await
    .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    for id in sent.keys() {
        let view = store.get(id).await.unwrap();
        let payment = view
            .steps
            .iter()
            .find(|s| s.name == "charge-payment")
            .unwrap();
        assert!(
            payment
                .detail
                .as_deref()
                .is_some_and(|d| d.starts_with("status probe: applied before, not called again")),
            "{id}: {:?}",
            payment.detail
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
