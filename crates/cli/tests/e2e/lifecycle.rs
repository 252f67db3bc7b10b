//! The order lifecycle under operator actions and give-ups, checked against the
//! simulator's ledger of remote effects: whatever happens, the final state agrees with
//! what is in effect at the remote services (DESIGN.md §4, invariant 8).

use std::collections::HashMap;
use std::time::Duration;

use orderly_cli::system::{System, SystemConfig};
use orderly_cli::{demo, invariants};
use orderly_core::history::HistoryKind;
use orderly_core::{ProcessState, StepStatus};
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

    // The operator's list says the first run's error is history, not what is wrong now.
    let (ok, stdout, stderr) = orderly(&db.url, &["list", "--state", "Processed"], &[]);
    assert!(ok, "{stdout}\n{stderr}");
    for o in &orders {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(o.order_id.as_str()))
            .unwrap_or_else(|| panic!("{} not listed:\n{stdout}", o.order_id.as_str()));
        assert!(line.contains("  earlier: "), "{line}");
    }
    let (ok, stdout, stderr) = orderly(&db.url, &["show", orders[0].order_id.as_str()], &[]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("last error   earlier: "), "{stdout}");

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
