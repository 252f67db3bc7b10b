//! The order lifecycle under operator actions and give-ups, checked against the
//! simulator's ledger of remote effects: whatever happens, the final state agrees with
//! what is in effect at the remote services (invariant 8 in docs/architecture.md).

use std::collections::HashMap;
use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::{ProcessState, StepStatus};
use orderly_local::system::{System, SystemConfig};
use orderly_local::{demo, invariants};
use orderly_remote_sim::{Effect, SimConfig};

use crate::both;
use crate::fixtures::{Db, Dialect};
use crate::newcomer::orderly;
use crate::procs::wait_for;

async fn count(system: &System, state: ProcessState) -> usize {
    crate::processes::count(system.backend.store.as_ref(), state).await
}

both!(
    an_operator_retry_after_compensation_runs_afresh_and_ends_with_each_step_in_effect_once,
    retry_after_compensation
);
/// The journey that broke: shipping declines, the completed steps are undone, the
/// order ends in Error; the operator fixes shipping and retries with `orderly
/// resubmit`. The retry must run the whole workflow again under new idempotency keys
/// (the undone inventory hold and payment are redone, not answered from the undone
/// results) and end Processed with every step in effect exactly once.
async fn retry_after_compensation(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new().quick();
    cfg.sim = Some(SimConfig {
        permanent_actions: vec!["ship".into()],
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg.clone())
        .await
        .unwrap();
    let orders = demo::sample_orders(6);
    let sent = demo::submit(&system, &orders).await.unwrap();
    wait_for("6 orders in Error", Duration::from_secs(60), async || {
        count(&system, ProcessState::Error).await == 6
    })
    .await;
    let mut ledger: Vec<Effect> = system.sim.as_ref().unwrap().effects();
    system.stop(Duration::from_secs(5)).await;

    // The operator retries them all with the CLI; it says what each retry will do.
    let (ok, stdout, stderr) = orderly(
        &db.url,
        &["resubmit", "--all", "--yes", "--reason", "shipping fixed"],
        &[],
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(
        stdout
            .matches("fresh run from the first step (generation 1): reserve-inventory, charge-payment had been undone")
            .count(),
        6,
        "{stdout}"
    );

    // Shipping works again.
    cfg.sim = Some(SimConfig::default());
    let system = System::start(db.backend().await, cfg).await.unwrap();
    wait_for("6 orders Processed", Duration::from_secs(60), async || {
        count(&system, ProcessState::Processed).await == 6
    })
    .await;
    ledger.extend(system.sim.as_ref().unwrap().effects());
    let store = system.backend.store.clone();
    let workflows = system.workflows.clone();
    system.stop(Duration::from_secs(5)).await;

    // The operator's list shows the current run's error only: none, since the retry
    // succeeded; the first run's error is in the order's history.
    let (ok, stdout, stderr) = orderly(&db.url, &["list", "--state", "Processed"], &[]);
    assert!(ok, "{stdout}\n{stderr}");
    for o in &orders {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(o.order_id.as_str()))
            .unwrap_or_else(|| panic!("{} not listed:\n{stdout}", o.order_id.as_str()));
        assert!(
            !line.contains("earlier") && !line.contains("ship"),
            "{line}"
        );
    }
    let (ok, stdout, stderr) = orderly(&db.url, &["show", orders[0].order_id.as_str()], &[]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("last error   -\n"), "{stdout}");
    let view = store.get(&orders[0].order_id).await.unwrap();
    assert_eq!(view.state.last_error, None);
    assert!(
        view.history
            .iter()
            .any(|e| e.reason.as_deref().is_some_and(|r| r.contains("ship"))),
        "the first run's error stays in the history: {:?}",
        view.history
    );

    let report = invariants::report_on(
        store.as_ref(),
        Some(ledger.clone()),
        &sent,
        &workflows,
        true,
    )
    .await
    .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    for o in &orders {
        let id = o.order_id.as_str();
        let view = store.get(&o.order_id).await.unwrap();
        assert_eq!(view.state.generation, 1);
        for s in &view.steps {
            assert_eq!(s.status, StepStatus::Succeeded);
            assert_eq!(s.idempotency_key, format!("{id}/1/{}/{}", s.index, s.name));
        }
        for action in ["reserve-inventory", "charge-payment", "ship"] {
            let live = orderly_remote_sim::in_force(&ledger, id, action);
            assert_eq!(
                live.len(),
                1,
                "{id}: {action} in effect {} times",
                live.len()
            );
            assert!(
                live[0].key.contains("/1/"),
                "the redo is in effect: {}",
                live[0].key
            );
        }
        // The first run's hold and charge were undone exactly once each.
        for (action, undo) in [
            ("reserve-inventory", "release-inventory"),
            ("charge-payment", "refund"),
        ] {
            let first = format!(
                "{id}/{}/{action}",
                if action == "reserve-inventory" { 0 } else { 1 }
            );
            let undone = ledger
                .iter()
                .filter(|e| e.action == undo && e.compensates.as_deref() == Some(first.as_str()))
                .count();
            assert_eq!(undone, 1, "{first} undone {undone} times");
        }
        let resubmitted = view
            .history
            .iter()
            .find(|e| e.kind == HistoryKind::RetriedAfresh)
            .unwrap();
        assert!(
            resubmitted
                .reason
                .as_deref()
                .unwrap_or_default()
                .contains("fresh run"),
            "the history says how it was retried: {:?}",
            resubmitted.reason
        );
    }
}

both!(
    an_operators_cancel_while_ship_takes_effect_is_refused_and_the_order_runs_to_its_end,
    cancel_past_the_point_of_no_return
);
/// The journey that went wrong: an operator cancels, with `orderly cancel`, orders
/// whose ship (which cannot be undone) has taken effect but not yet answered. Undoing
/// the payment and the stock hold would leave each order half undone, and cancelled
/// orders that were shipped: the cancel is refused at once, saying why, and the orders
/// run on to Processed, each step in effect once.
async fn cancel_past_the_point_of_no_return(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new();
    cfg.sim = Some(SimConfig {
        // Ship takes effect, then its answer hangs for a while.
        lose_reply_actions: vec!["ship".into()],
        hang_for: Duration::from_secs(4),
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let orders = demo::sample_orders(2);
    let sent = demo::submit(&system, &orders).await.unwrap();
    let store = system.backend.store.clone();
    let sim = system.sim.clone().unwrap();
    let ids: Vec<&str> = orders.iter().map(|o| o.order_id.as_str()).collect();
    wait_for(
        "ship in effect for both orders",
        Duration::from_secs(30),
        async || {
            let effects = sim.effects();
            ids.iter()
                .all(|id| !orderly_remote_sim::in_force(&effects, id, "ship").is_empty())
        },
    )
    .await;
    for id in &ids {
        let (ok, stdout, stderr) = orderly(
            &db.url,
            &["cancel", id, "--reason", "customer changed their mind"],
            &[],
        );
        assert!(!ok, "refused: {stdout}\n{stderr}");
        // One line, naming the order once.
        assert!(
            stderr.lines().any(|line| line.starts_with(&format!(
                "order {id} cannot be undone: ship may have taken effect and cannot be undone"
            ))),
            "the operator is told why: {stderr}"
        );
    }
    wait_for(
        "both orders Processed",
        Duration::from_secs(30),
        async || count(&system, ProcessState::Processed).await == 2,
    )
    .await;
    let ledger = sim.effects();
    let workflows = system.workflows.clone();
    system.stop(Duration::from_secs(5)).await;
    for id in &ids {
        assert!(
            ledger.iter().all(|e| e.order_id != *id || e.kind == "do"),
            "{id}: nothing undone"
        );
        let history = store
            .get(&orderly_core::OrderId::parse(*id).unwrap())
            .await
            .unwrap()
            .history;
        assert!(
            !history
                .iter()
                .any(|e| e.kind == HistoryKind::CancelRequested),
            "a refused cancel leaves no trace in the order's history"
        );
    }
    let report = invariants::report_on(store.as_ref(), Some(ledger), &sent, &workflows, true)
        .await
        .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
}

both!(
    giving_up_while_ship_may_have_taken_effect_undoes_nothing_and_a_retry_finishes_the_order,
    give_up_past_the_point_of_no_return
);
/// Ship hangs until the supervisor gives up on its orders. Ship may have taken effect
/// and cannot be undone, so nothing is undone: each order ends in Error saying so,
/// with an alert. The operator gets shipping going again and retries them with
/// `orderly resubmit`; they carry on from ship and end Processed, each step in effect
/// once across both runs.
async fn give_up_past_the_point_of_no_return(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new().quick();
    cfg.policy.max_failures = 2;
    cfg.sim = Some(SimConfig {
        hang_actions: vec!["ship".into()],
        hang_for: Duration::from_secs(20),
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg.clone())
        .await
        .unwrap();
    let orders = demo::sample_orders(2);
    let sent = demo::submit(&system, &orders).await.unwrap();
    wait_for("2 orders in Error", Duration::from_secs(90), async || {
        count(&system, ProcessState::Error).await == 2
    })
    .await;
    let mut ledger: Vec<Effect> = system.sim.as_ref().unwrap().effects();
    let store = system.backend.store.clone();
    system.stop(Duration::from_secs(5)).await;
    assert!(
        ledger.iter().all(|e| e.kind == "do"),
        "nothing undone: {ledger:?}"
    );
    let alerts = store.alerts(false, 100).await.unwrap();
    for o in &orders {
        let error = store
            .get(&o.order_id)
            .await
            .unwrap()
            .state
            .last_error
            .unwrap_or_default();
        assert!(
            error.starts_with("gave up: the order timed out too often")
                && error.contains(
                    "but ship may have taken effect and cannot be undone: nothing undone; \
                     needs repair by hand"
                ),
            "{error}"
        );
        assert!(alerts.iter().any(|a| a.order_id == o.order_id), "alerted");
    }

    let (ok, stdout, stderr) = orderly(
        &db.url,
        &["resubmit", "--all", "--yes", "--reason", "shipping is back"],
        &[],
    );
    assert!(ok, "{stdout}\n{stderr}");
    cfg.sim = Some(SimConfig::default());
    let system = System::start(db.backend().await, cfg).await.unwrap();
    wait_for("2 orders Processed", Duration::from_secs(60), async || {
        count(&system, ProcessState::Processed).await == 2
    })
    .await;
    ledger.extend(system.sim.as_ref().unwrap().effects());
    let workflows = system.workflows.clone();
    system.stop(Duration::from_secs(5)).await;
    let report = invariants::report_on(store.as_ref(), Some(ledger), &sent, &workflows, true)
        .await
        .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
}

both!(
    giving_up_on_an_order_undoes_its_completed_steps_before_error,
    give_up_compensates
);
/// A service that only ever times out: the supervisor gives up at the threshold, and
/// the steps already done are undone (in reverse) before the order ends in Error; the
/// alert says so.
async fn give_up_compensates(dialect: Dialect) {
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new().quick();
    cfg.policy.max_failures = 2;
    cfg.sim = Some(SimConfig {
        hang_actions: vec!["charge-payment".into()],
        hang_for: Duration::from_secs(20),
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let orders = demo::sample_orders(4);
    let sent = demo::submit(&system, &orders).await.unwrap();
    wait_for("4 orders in Error", Duration::from_secs(90), async || {
        count(&system, ProcessState::Error).await == 4
    })
    .await;
    let ledger = system.sim.as_ref().unwrap().effects();
    let store = system.backend.store.clone();
    let workflows = system.workflows.clone();
    system.stop(Duration::from_secs(5)).await;

    let report = invariants::report_on(
        store.as_ref(),
        Some(ledger.clone()),
        &sent,
        &workflows,
        true,
    )
    .await
    .unwrap();
    assert_eq!(report.violations, Vec::<String>::new());
    let alerts: HashMap<String, String> = store
        .alerts(false, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|a| {
            (
                a.order_id.as_str().to_owned(),
                a.last_error.unwrap_or_default(),
            )
        })
        .collect();
    for o in &orders {
        let id = o.order_id.as_str();
        let view = store.get(&o.order_id).await.unwrap();
        let kinds: Vec<HistoryKind> = view.history.iter().map(|e| e.kind).collect();
        let gave_up = kinds
            .iter()
            .position(|k| *k == HistoryKind::GaveUp)
            .unwrap();
        assert!(
            kinds[gave_up..].contains(&HistoryKind::StepCompensated),
            "undone after the give-up: {kinds:?}"
        );
        assert!(
            orderly_remote_sim::in_force(&ledger, id, "reserve-inventory").is_empty(),
            "{id}: the inventory hold was released"
        );
        let alert = &alerts[id];
        assert!(
            alert.contains("gave up") && alert.contains("undone: reserve-inventory"),
            "the alert says it gave up and what was undone: {alert}"
        );
    }
}

both!(
    operator_retries_and_cancels_at_random_points_keep_the_ledger_consistent,
    operators_at_random
);
/// Orders under faults (transient failures, hangs, permanent refusals) while an
/// operator cancels some at random moments (Pending, Processing, being undone, in
/// Error) and retries every order that lands in Error, one by one and in bulk, for a
/// few rounds. Whatever the timing, every order ends Processed, Error or Cancelled and
/// the remote effects agree with it: a Processed order has each step in effect once,
/// an Error or Cancelled one that was undone has each completed step undone once.
async fn operators_at_random(dialect: Dialect) {
    use rand::Rng;
    let db = Db::new(dialect).await;
    let mut cfg = SystemConfig::new().quick();
    cfg.sim = Some(SimConfig {
        transient_rate: 0.1,
        hang_rate: 0.02,
        hang_for: Duration::from_secs(2),
        permanent_rate: 0.15,
        seed: 7,
        ..SimConfig::default()
    });
    let system = System::start(db.backend().await, cfg).await.unwrap();
    let store = system.backend.store.clone();
    let orders = demo::sample_orders(60);
    let sent = demo::submit(&system, &orders).await.unwrap();
    let operator = orderly_core::Actor::operator("chaos");
    let mut rng = rand::rng();
    let (mut cancels, mut retries) = (0, 0);
    let started = std::time::Instant::now();
    // Random cancels of orders still alive (Pending, Processing or Error, at whatever
    // point they are), retries of whatever is in Error. Picking among all orders would
    // mostly pick finished ones, and how many are alive depends on the machine's speed.
    let alive = [
        ProcessState::Pending,
        ProcessState::Processing,
        ProcessState::Error,
    ];
    while started.elapsed() < Duration::from_secs(6) {
        if rng.random_bool(0.3) {
            let state = alive[rng.random_range(0..alive.len())];
            let rows = store
                .list(&orderly_core::store::OrderFilter {
                    state: Some(state),
                    ..Default::default()
                })
                .await
                .unwrap()
                .orders;
            if !rows.is_empty() {
                let o = &rows[rng.random_range(0..rows.len())];
                if store
                    .request_cancel(&o.order_id, &operator, "chaos cancel", &[])
                    .await
                    .is_ok()
                {
                    cancels += 1;
                }
            }
        }
        let errors = store
            .list(&orderly_core::store::OrderFilter {
                state: Some(ProcessState::Error),
                ..Default::default()
            })
            .await
            .unwrap();
        for row in errors.orders.iter().take(3) {
            if store
                .resubmit(&row.order_id, &operator, "chaos retry", &[])
                .await
                .is_ok()
            {
                retries += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
    }
    // The operator fixes the cause of the refusals, then retries in bulk with the real
    // CLI, a few rounds.
    system.sim.as_ref().unwrap().repair();
    for _ in 0..3 {
        assert!(
            demo::wait_done_on(store.as_ref(), orders.len(), Duration::from_secs(120))
                .await
                .unwrap(),
            "every order finished"
        );
        let (ok, stdout, _) = orderly(
            &db.url,
            &["resubmit", "--all", "--yes", "--reason", "bulk retry"],
            &[],
        );
        if !ok && stdout.is_empty() {
            break; // no order in Error any more
        }
        retries += stdout.lines().count();
    }
    assert!(
        demo::wait_done_on(store.as_ref(), orders.len(), Duration::from_secs(120))
            .await
            .unwrap(),
        "every order finished"
    );
    let ledger = system.sim.as_ref().unwrap().effects();
    let workflows = system.workflows.clone();
    system.stop(Duration::from_secs(5)).await;
    let report = invariants::report_on(store.as_ref(), Some(ledger), &sent, &workflows, true)
        .await
        .unwrap();
    eprintln!(
        "{cancels} cancels, {retries} retries; by state {:?}",
        report.by_state
    );
    assert!(
        cancels > 0 && retries > 0,
        "the operator acted: {cancels} cancels, {retries} retries"
    );
    assert_eq!(report.violations, Vec::<String>::new());
}
