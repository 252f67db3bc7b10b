//! The driver conformance suite: the same calls on both dialects, and the same rows
//! after them.
//!
//! A dialect may write a set its own way (SQLite in several statements, PostgreSQL in
//! one); what is written is decided once, in the shared code (`steps.rs`,
//! `supervisor.rs`, `intake.rs`, `rows.rs`). The scenario below drives one order
//! through the step writes a scheduler makes (retries, a stale step, a deposed owner,
//! a late duplicate, a failure with an over-long error, the completing write) and
//! another through a timeout, checks each rule on the dialect it runs on, and returns
//! everything the store then holds of both orders. The test runs it on both dialects
//! and requires the two records to be the same, field by field.

use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{
    ClaimRequest, ClaimedOrder, IntakeStore, MAX_TEXT_LEN, OperatorStore, OrderView,
    RecoveryPolicy, SchedulerStore, StepUpdate, SupervisorStore,
};
use orderly_core::{Epoch, Fence, InstanceId, ManualClock, OrderId, ProcessState, StepStatus};
use orderly_testkit::builders::{order_with_id, submitter};

use super::SqlStore;
use super::steps::{step_row, touch};
use super::supervisor::recovery_row;
use crate::driver::{Driver, q};
use crate::testing::{on_postgres_at, sqlite_at};

/// Where both dialects' clocks stand at the start (whole seconds: both store
/// microseconds, so every timestamp compares equal).
fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .expect("a valid instant")
        .with_timezone(&Utc)
}

fn update(index: i32, status: StepStatus, detail: Option<String>) -> StepUpdate {
    StepUpdate {
        index,
        name: format!("step-{index}"),
        status,
        detail,
        idempotency_key: format!("o-1:{index}:0"),
        irreversible: index == 1,
    }
}

/// One step write straight to the dialect, as the shared code builds it; whether it
/// touched the order.
async fn write<D: Driver>(
    store: &SqlStore<D>,
    fence: &Fence,
    expect: Option<i32>,
    updates: &[StepUpdate],
    complete: bool,
) -> bool {
    let (mut tx, now) = store.begin().await.expect("a write transaction");
    let touches = [touch(fence, expect, updates, complete)];
    let rows = updates.iter().map(|u| step_row(fence, u)).collect();
    let touched = D::write_steps(&mut tx, now, &touches, rows)
        .await
        .expect("the write runs");
    D::commit(tx).await.expect("the write commits");
    touched.contains(fence.order_id.as_str())
}

/// Marks `order` as waiting on `service` (as a park does).
async fn wait_on<D: Driver>(store: &SqlStore<D>, order: &OrderId, service: &str) {
    let (mut tx, _) = store.begin().await.expect("a write transaction");
    q("UPDATE order_state SET waiting_on = $1 WHERE order_id = $2")
        .bind(service)
        .bind(order.as_str())
        .execute::<D>(&mut tx)
        .await
        .expect("the mark is written");
    D::commit(tx).await.expect("the mark commits");
}

async fn claim_one<D: Driver>(store: &SqlStore<D>, owner: &str) -> ClaimedOrder {
    let mut claimed = store
        .claim(&ClaimRequest {
            owner: InstanceId::parse(owner).expect("a valid owner"),
            limit: 1,
            timeout: Duration::from_secs(30),
            workflows: std::sync::Arc::default(),
        })
        .await
        .expect("the claim runs");
    assert_eq!(claimed.len(), 1, "{owner} claims one order");
    claimed.remove(0)
}

async fn view<D: Driver>(store: &SqlStore<D>, order: &OrderId) -> OrderView {
    store.get(order).await.expect("the order is stored")
}

/// The scenario: each rule checked as it runs, then all that is stored of both
/// orders (history positions, which each database numbers its own way, left out).
async fn scenario<D: Driver>(store: SqlStore<D>, clock: ManualClock) -> String {
    let one = OrderId::parse("o-1").expect("a valid id");
    let two = OrderId::parse("o-2").expect("a valid id");
    for id in [&one, &two] {
        store
            .submit(&order_with_id(id.as_str(), 2), &submitter(), &[])
            .await
            .expect("the order is accepted");
        clock.advance(Duration::from_secs(1));
    }
    let claimed = claim_one(&store, "scheduler-a").await;
    assert_eq!(claimed.fence.order_id, one, "the oldest order first");
    let f = claimed.fence.clone();

    // A start, and its retry: each counts an attempt.
    wait_on(&store, &one, "payment").await;
    let started = [update(0, StepStatus::Started, None)];
    assert!(write(&store, &f, Some(0), &started, false).await);
    assert!(write(&store, &f, Some(0), &started, false).await);
    assert_eq!(view(&store, &one).await.steps[0].attempts, 2);

    // A success moves the order on and ends its wait.
    let succeeded = [update(0, StepStatus::Succeeded, Some("ok".into()))];
    assert!(write(&store, &f, Some(0), &succeeded, false).await);
    let v = view(&store, &one).await;
    assert_eq!((v.state.current_step, v.state.waiting_on), (1, None));
    assert_eq!(v.steps[0].attempts, 2, "a success adds no attempt");

    // A late duplicate of that success, unguarded: never backwards, the new wait kept.
    wait_on(&store, &one, "shipping").await;
    assert!(write(&store, &f, None, &succeeded, false).await);
    let v = view(&store, &one).await;
    assert_eq!(v.state.current_step, 1);
    assert_eq!(v.state.waiting_on.as_deref(), Some("shipping"));

    // Refused: a stale step guard, and a deposed owner. Neither writes a row.
    let before = view(&store, &one).await;
    assert!(!write(&store, &f, Some(0), &started, false).await);
    let deposed = Fence {
        epoch: Epoch(f.epoch.0 + 1),
        ..f.clone()
    };
    let next = [update(1, StepStatus::Started, None)];
    assert!(!write(&store, &deposed, Some(1), &next, false).await);
    let after = view(&store, &one).await;
    assert_eq!(after.steps, before.steps);
    assert_eq!(after.history, before.history);

    // A failure with an error longer than is stored: cut the same for the row, the
    // record and the history.
    let long = "é".repeat(MAX_TEXT_LEN);
    let failed = [update(1, StepStatus::Failed, Some(long))];
    assert!(write(&store, &f, Some(1), &failed, false).await);
    let v = view(&store, &one).await;
    let error = v.state.last_error.clone().expect("the error is kept");
    assert!(error.len() <= MAX_TEXT_LEN && error.chars().all(|c| c == 'é'));
    assert_eq!(v.steps[1].detail.as_deref(), Some(error.as_str()));
    assert_eq!(v.steps[1].attempts, 0, "a failure adds no attempt");

    // The last step's success completes the order in the same write.
    let last = [update(1, StepStatus::Succeeded, Some("shipped".into()))];
    assert!(write(&store, &f, Some(1), &last, true).await);
    let v = view(&store, &one).await;
    assert_eq!(v.state.process_state, ProcessState::Processed);
    assert_eq!((v.state.locked_by, v.state.complete_by), (None, None));
    let kinds: Vec<HistoryKind> = v.history.iter().rev().take(2).map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [HistoryKind::Completed, HistoryKind::StepSucceeded],
        "the completion after its step"
    );

    // The second order times out, and is recovered as the shared policy decides.
    let held = claim_one(&store, "scheduler-b").await;
    assert_eq!(held.fence.order_id, two);
    clock.advance(Duration::from_secs(60));
    let expired = store.find_expired(10).await.expect("the scan runs");
    assert_eq!(expired.len(), 1);
    let (mut tx, now) = store.begin().await.expect("a write transaction");
    let policy = RecoveryPolicy::default();
    let rows: Vec<_> = expired
        .iter()
        .map(|e| recovery_row(&e.order_id, e.lock_epoch.0, &policy.decide(e, now)))
        .collect();
    let applied = D::recover(&mut tx, now, "supervisor-a", &rows)
        .await
        .expect("the recovery runs");
    D::commit(tx).await.expect("the recovery commits");
    assert!(applied.contains(two.as_str()));
    let v = view(&store, &two).await;
    assert_eq!(v.state.process_state, ProcessState::Pending);
    assert_eq!(v.state.failure_count, 1);
    let entry = v.history.last().expect("the recovery's entry");
    assert_eq!(
        entry.reason, v.state.last_error,
        "one reason, row and history"
    );
    assert_eq!(entry.from_state, Some(ProcessState::Processing));

    let mut record = format!("{claimed:#?}\n{held:#?}\n");
    for id in [&one, &two] {
        let mut v = view(&store, id).await;
        for e in &mut v.history {
            e.seq = 0;
        }
        record.push_str(&format!("{v:#?}\n"));
    }
    record
}

#[tokio::test]
async fn both_dialects_write_the_same_rows_for_the_same_calls() {
    let (sqlite, clock) = sqlite_at(start()).await;
    let lite = scenario(sqlite, clock).await;
    let pg = on_postgres_at(start(), scenario).await;
    for (n, (l, p)) in lite.lines().zip(pg.lines()).enumerate() {
        assert_eq!(l, p, "line {n} of the record differs (SQLite, PostgreSQL)");
    }
    assert_eq!(lite.lines().count(), pg.lines().count());
}
