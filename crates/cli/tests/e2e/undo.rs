//! Undoing is finished whatever the network does, and a retry of an order that stopped
//! half undone is correct: the real binaries as separate processes, checked against the
//! remote services' ledger (what is in force there, not what the store says).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use orderly_cli::{demo, invariants};
use orderly_core::history::HistoryKind;
use orderly_core::store::{OrderFilter, StateStore};
use orderly_core::workflow::{Workflow, Workflows};
use orderly_core::{OrderId, ProcessState};
use orderly_remote_sim::Effect;

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::processes::{count, ledger, start_sim};
use crate::procs::{Proc, bin, free_port, wait_for};

/// The order workflow with budgets short enough for a test.
const FLOW: &str = r#"
name = "order"
[[steps]]
name = "reserve-inventory"
queue = "agent.inventory"
timeout_ms = 1500
compensation = "release-inventory"
[[steps]]
name = "charge-payment"
queue = "agent.payment"
timeout_ms = 1500
compensation = "refund"
[[steps]]
name = "ship"
queue = "agent.shipping"
timeout_ms = 1500
"#;

struct Flow {
    path: PathBuf,
    workflow: Workflow,
}

impl Flow {
    fn write() -> Self {
        let path = std::env::temp_dir().join(format!(
            "orderly-undo-{}.toml",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, FLOW).unwrap();
        let workflow = orderly_runtime::load_workflow(Some(&path)).unwrap();
        Self { path, workflow }
    }

    fn arg(&self) -> String {
        self.path.display().to_string()
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The effects of `order` still in force at the services: applied and never undone.
fn in_force<'a>(effects: &'a [Effect], order: &OrderId) -> Vec<&'a Effect> {
    let undone = orderly_remote_sim::undone_keys(effects);
    effects
        .iter()
        .filter(|e| e.order_id == order.as_str() && e.kind == "do")
        .filter(|e| !undone.contains_key(e.key.as_str()))
        .collect()
}

async fn in_state(store: &dyn StateStore, state: ProcessState) -> Vec<OrderId> {
    store
        .list(&OrderFilter {
            state: Some(state),
            limit: 100,
            ..OrderFilter::default()
        })
        .await
        .unwrap()
        .orders
        .into_iter()
        .map(|s| s.order_id)
        .collect()
}

fn orderly(db: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(bin("orderly"))
        .args(args)
        .env("ORDERLY_DATABASE_URL", db)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "orderly {args:?}:\n{text}");
    text
}

both!(
    a_retry_of_an_order_left_half_undone_finishes_the_undo_then_runs_afresh,
    half_undone_retry
);
/// Shipping refuses every order for good, so each is undone; the refund takes effect
/// but its answer is lost, and with no undo budget left the order ends in Error
/// "needs manual repair", its charge's undo in doubt and its reservation in force.
/// The operator fixes shipping and retries: the retry sends the refund again under its
/// own key (the service answers "already applied"), releases the reservation, and only
/// then runs the workflow afresh. At the end each step is in force exactly once.
/// (Continuing instead, as a retry once did, ends Processed with the charge refunded;
/// running afresh at once leaves the first reservation in force beside the second.)
async fn half_undone_retry(dialect: Dialect) {
    let flow = Flow::write();
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(
        &db.url,
        port,
        &[
            "--permanent-actions",
            "ship",
            "--lose-reply-actions",
            "refund",
            "--hang-ms",
            "30000",
        ],
    );
    let _submitter = Proc::start("orderly-submitter", &db.url, &[]);
    let _supervisor = Proc::start(
        "orderly-supervisor",
        &db.url,
        &[
            "--interval-ms",
            "200",
            "--backoff-base-ms",
            "200",
            "--max-failures",
            "1",
            "--max-undo-failures",
            "0",
        ],
    );
    let _agent = Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    let _scheduler = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--workflow", &flow.arg(), "--shutdown-grace-ms", "0"],
    );
    let orders = demo::sample_orders(4);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for(
        "every order to end in Error, half undone",
        Duration::from_secs(90),
        async || count(store.as_ref(), ProcessState::Error).await == orders.len(),
    )
    .await;
    let effects = ledger(port).await;
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        let error = view.state.last_error.clone().unwrap_or_default();
        assert!(
            error.contains("needs manual repair")
                && error.contains("still in force: reserve-inventory, charge-payment"),
            "order {}: the error names the steps still in force: {error}",
            o.order_id
        );
        let left: Vec<&str> = in_force(&effects, &o.order_id)
            .iter()
            .map(|e| e.action.as_str())
            .collect();
        assert_eq!(
            left,
            ["reserve-inventory"],
            "order {}: the refund took effect (its answer was lost); the reservation stands",
            o.order_id
        );
        let plan = orderly_core::RetryPlan::for_order(
            view.state.generation,
            view.state.current_step,
            &view.steps,
        );
        assert!(
            matches!(&plan, orderly_core::RetryPlan::UndoFirst { in_doubt, .. } if in_doubt == &["charge-payment"]),
            "order {}: {plan:?}",
            o.order_id
        );
    }
    // The alert carries the same words.
    let alerts = store.alerts(true, 100).await.unwrap();
    assert!(
        alerts.iter().all(|a| a
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("still in force: reserve-inventory, charge-payment"))),
        "{alerts:?}"
    );

    // The operator fixes shipping and retries every order, as written in the runbook.
    let fix = format!("http://127.0.0.1:{port}/faults/repair");
    assert!(
        crate::procs::http()
            .put(&fix)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    let out = orderly(
        &db.url,
        &[
            "resubmit",
            "--all",
            "--state",
            "Error",
            "--yes",
            "--reason",
            "shipping fixed",
        ],
    );
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("finishes undoing first (undo of charge-payment in doubt)"))
            .count(),
        orders.len(),
        "{out}"
    );
    wait_for(
        "every retried order to be Processed",
        Duration::from_secs(90),
        async || count(store.as_ref(), ProcessState::Processed).await == orders.len(),
    )
    .await;

    let effects = ledger(port).await;
    assert!(orderly_remote_sim::double_effects(&effects).is_empty());
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        assert_eq!(view.state.generation, 1, "order {}", o.order_id);
        assert_eq!(view.state.last_error, None);
        let mut left: Vec<(&str, &str)> = in_force(&effects, &o.order_id)
            .iter()
            .map(|e| (e.action.as_str(), e.key.as_str()))
            .collect();
        left.sort_unstable();
        let id = o.order_id.as_str();
        assert_eq!(
            left,
            [
                (
                    "charge-payment",
                    format!("{id}/1/1/charge-payment").as_str()
                ),
                (
                    "reserve-inventory",
                    format!("{id}/1/0/reserve-inventory").as_str()
                ),
                ("ship", format!("{id}/1/2/ship").as_str()),
            ],
            "order {id}: each step in force once, under the fresh run's keys"
        );
        // The undo of the first run: the refund applied once (the retry's resend was
        // answered from its key), the release once.
        let undos: Vec<&str> = effects
            .iter()
            .filter(|e| e.order_id == id && e.kind == "compensate")
            .map(|e| e.action.as_str())
            .collect();
        assert_eq!(undos, ["refund", "release-inventory"], "order {id}");
        // Its history says what happened, in order: the retry, the undo finished by a
        // scheduler, the fresh run.
        let kinds: Vec<HistoryKind> = view.history.iter().map(|e| e.kind).collect();
        let retry = kinds
            .iter()
            .position(|k| *k == HistoryKind::Resubmitted)
            .unwrap();
        let afresh = kinds
            .iter()
            .position(|k| *k == HistoryKind::RetriedAfresh)
            .unwrap();
        assert!(retry < afresh, "{kinds:?}");
        assert!(
            kinds[retry..afresh].contains(&HistoryKind::StepCompensated),
            "{kinds:?}"
        );
        assert!(!view.history[afresh].actor.is_operator());
    }
    let all = Workflows::new(vec![flow.workflow.clone()]).unwrap();
    let report = invariants::report_on(store.as_ref(), Some(effects), &sent, &all, true)
        .await
        .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
}

both!(
    an_undo_that_hangs_after_a_give_up_is_retried_until_nothing_is_left_in_force,
    undo_that_hangs
);
/// Payment hangs on every call (applying nothing), so each order is given up on after
/// two timeouts and its steps undone; releasing the reservation hangs once (taking
/// effect, its answer lost), and the order's deadline passes while undoing. The undo is
/// retried under its own budget, not given up: every order ends in Error with its
/// reservation and charge undone, nothing in force at the services, and no "manual
/// repair".
async fn undo_that_hangs(dialect: Dialect) {
    let flow = Flow::write();
    let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
    let store = backend.store.clone();
    let port = free_port();
    let remote = format!("http://127.0.0.1:{port}/actions");
    let _sim = start_sim(
        &db.url,
        port,
        &[
            "--hang-actions",
            "charge-payment",
            "--lose-reply-actions",
            "release-inventory",
            "--hang-ms",
            "30000",
        ],
    );
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
            "500",
            "--max-failures",
            "2",
        ],
    );
    let _agent = Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]);
    let _scheduler = Proc::start(
        "orderly-scheduler",
        &db.url,
        &["--workflow", &flow.arg(), "--shutdown-grace-ms", "0"],
    );
    let orders = demo::sample_orders(4);
    let sent = demo::post(backend.transport.as_ref(), &orders)
        .await
        .unwrap();
    wait_for(
        "every order to end in Error",
        Duration::from_secs(120),
        async || count(store.as_ref(), ProcessState::Error).await == orders.len(),
    )
    .await;
    let effects = ledger(port).await;
    let mut by_order: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in &effects {
        by_order
            .entry(e.order_id.as_str())
            .or_default()
            .push(e.action.as_str());
    }
    for o in &orders {
        let view = store.get(&o.order_id).await.unwrap();
        let error = view.state.last_error.clone().unwrap_or_default();
        assert!(
            !error.contains("manual repair"),
            "order {}: a hang while undoing does not give the undo up: {error}",
            o.order_id
        );
        assert!(
            error.contains("undone: reserve-inventory, charge-payment"),
            "order {}: {error}",
            o.order_id
        );
        assert_eq!(
            in_force(&effects, &o.order_id).len(),
            0,
            "order {}: nothing left in force: {:?}",
            o.order_id,
            by_order.get(o.order_id.as_str())
        );
        // The deadline passed while undoing and the order went round again to undo.
        assert!(
            view.history.iter().any(|e| e.kind == HistoryKind::Recovered
                && e.reason.as_deref().is_some_and(|r| r.contains(", undoing"))),
            "order {}: {:?}",
            o.order_id,
            view.history
        );
        // The release took effect once, though it was sent twice.
        assert_eq!(
            by_order[o.order_id.as_str()]
                .iter()
                .filter(|a| **a == "release-inventory")
                .count(),
            1
        );
    }
    let all = Workflows::new(vec![flow.workflow.clone()]).unwrap();
    let report = invariants::report_on(store.as_ref(), Some(effects), &sent, &all, true)
        .await
        .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    assert!(
        in_state(store.as_ref(), ProcessState::Pending)
            .await
            .is_empty()
    );
}
