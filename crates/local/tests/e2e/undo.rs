//! Undoing is finished whatever the network does, and a retry of an order that stopped
//! half undone is correct: the real binaries as separate processes, checked against the
//! remote services' ledger (what is in force there, not what the store says).

use std::collections::HashMap;
use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::store::{NewOrder, StateStore};
use orderly_core::workflow::{Workflow, Workflows};
use orderly_core::{OrderId, ProcessState};
use orderly_local::{demo, invariants};
use orderly_remote_sim::Effect;

use crate::both;
use crate::fixtures::{Db, Dialect, Files};
use crate::processes::{count, ledger, start_sim};
use crate::procs::{Proc, free_port, orderly, repair_sim, wait_for};

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

/// Four orders of [`FLOW`] sent through every role, each a separate process, against
/// the simulator with `faults`, the supervisor recovering with `recovery`.
struct Run {
    db: Db,
    store: std::sync::Arc<dyn StateStore>,
    /// The simulator's port.
    port: u16,
    flow: Workflow,
    orders: Vec<NewOrder>,
    sent: HashMap<OrderId, chrono::DateTime<chrono::Utc>>,
    _files: Files,
    _procs: Vec<Proc>,
}

impl Run {
    async fn start(dialect: Dialect, faults: &[&str], recovery: &[&str]) -> Self {
        let files = Files::new();
        let (path, flow) = files.write("undo.toml", FLOW);
        let (db, backend) = Db::with_queues(dialect, Duration::from_secs(5)).await;
        let port = free_port();
        let remote = format!("http://127.0.0.1:{port}/actions");
        let mut faults = faults.to_vec();
        faults.extend(["--hang-ms", "30000"]);
        let mut recovery = recovery.to_vec();
        recovery.extend(["--interval-ms", "200", "--backoff-base-ms", "200"]);
        let procs = vec![
            start_sim(&db.url, port, &faults),
            Proc::start("orderly-submitter", &db.url, &[]),
            Proc::start("orderly-supervisor", &db.url, &recovery),
            Proc::start("orderly-agent", &db.url, &["--remote-url", &remote]),
            Proc::start(
                "orderly-scheduler",
                &db.url,
                &["--workflow", &path, "--shutdown-grace-ms", "0"],
            ),
        ];
        let orders = demo::sample_orders(4);
        let sent = demo::post(backend.transport.as_ref(), &orders)
            .await
            .unwrap();
        Self {
            store: backend.store.clone(),
            db,
            port,
            flow,
            orders,
            sent,
            _files: files,
            _procs: procs,
        }
    }

    /// Waits until every order is in `state`.
    async fn all(&self, state: ProcessState, what: &str, limit: Duration) {
        wait_for(what, limit, async || {
            count(self.store.as_ref(), state).await == self.orders.len()
        })
        .await;
    }

    /// The invariants, against the simulator's ledger.
    async fn assert_invariants(&self, effects: Vec<Effect>) {
        let all = Workflows::new(vec![self.flow.clone()]).unwrap();
        let report =
            invariants::report_on(self.store.as_ref(), Some(effects), &self.sent, &all, true)
                .await
                .unwrap();
        assert_eq!(report.violations, Vec::<String>::new());
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
    let run = Run::start(
        dialect,
        &[
            "--permanent-actions",
            "ship",
            "--lose-reply-actions",
            "refund",
        ],
        &["--max-failures", "1", "--max-undo-failures", "0"],
    )
    .await;
    let (store, port, orders) = (&run.store, run.port, &run.orders);
    run.all(
        ProcessState::Error,
        "every order to end in Error, half undone",
        Duration::from_secs(90),
    )
    .await;
    let effects = ledger(port).await;
    for o in orders {
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
    repair_sim(port).await;
    let (ok, out) = orderly(
        &run.db.url,
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
    assert!(ok, "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("finishes undoing first (undo of charge-payment in doubt)"))
            .count(),
        orders.len(),
        "{out}"
    );
    run.all(
        ProcessState::Processed,
        "every retried order to be Processed",
        Duration::from_secs(90),
    )
    .await;

    let effects = ledger(port).await;
    assert!(orderly_remote_sim::double_effects(&effects).is_empty());
    for o in orders {
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
    run.assert_invariants(effects).await;
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
    let run = Run::start(
        dialect,
        &[
            "--hang-actions",
            "charge-payment",
            "--lose-reply-actions",
            "release-inventory",
        ],
        &["--backoff-max-ms", "500", "--max-failures", "2"],
    )
    .await;
    let (store, port, orders) = (&run.store, run.port, &run.orders);
    run.all(
        ProcessState::Error,
        "every order to end in Error",
        Duration::from_secs(120),
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
    for o in orders {
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
    run.assert_invariants(effects).await;
    assert_eq!(count(store.as_ref(), ProcessState::Pending).await, 0);
}
