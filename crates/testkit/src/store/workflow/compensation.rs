//! Conformance cases for undoing: a retry after compensation runs afresh, giving up
//! undoes the steps done first, and the last step completes its order in its write.

use super::{Ctx, MINUTE, claim_one, leader, owner, policy, row, submit_n};
use super::{first_done, start_first, update, write};
use orderly_core::history::HistoryKind;
use orderly_core::step::StepStatus;
use orderly_core::store::StepWrite;
use orderly_core::{Actor, Error, Fence, ProcessState};
use std::time::Duration;

/// Applies one write, which must be accepted.
pub(super) async fn apply(store: &dyn orderly_core::store::StateStore, w: StepWrite) {
    let verdicts = store.record_steps(&[w]).await.unwrap();
    assert!(matches!(verdicts[..], [Ok(())]), "{verdicts:?}");
}

/// From step 0 started: steps 0 and 1 done, step 2 failed.
async fn fail_the_last_step(store: &dyn orderly_core::store::StateStore, f: &Fence) {
    for w in [
        first_done(f),
        write(
            f,
            Some(1),
            vec![
                update(1, StepStatus::Succeeded),
                update(2, StepStatus::Started),
            ],
        ),
        write(f, Some(2), vec![update(2, StepStatus::Failed)]),
    ] {
        apply(store, w).await;
    }
}

/// Drives a claimed order through steps 0 and 1 done, step 2 failed, both undone, to
/// Error: the state an operator finds after a permanent failure with compensation.
async fn failed_and_undone(
    store: &dyn orderly_core::store::StateStore,
    c: &orderly_core::store::ClaimedOrder,
) -> Fence {
    let f = &c.fence;
    apply(store, start_first(f)).await;
    fail_the_last_step(store, f).await;
    store
        .begin_compensation(f, ProcessState::Error, "step 2 failed", &[])
        .await
        .unwrap();
    for i in [1, 0] {
        apply(
            store,
            write(f, None, vec![update(i, StepStatus::Compensated)]),
        )
        .await;
    }
    store
        .fail(f, "step 2 failed; undone: 1, 0", &[])
        .await
        .unwrap();
    c.fence.clone()
}

/// An operator's retry of an order whose steps were undone runs it afresh from the
/// first step under the next generation (its earlier step records gone, the history
/// saying so); a retry of one whose steps all stand continues from the failed step.
pub async fn a_retry_after_compensation_is_a_fresh_run_under_the_next_generation(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 2).await;
    let a = owner("a");
    let first = claim_one(&*store, &a, MINUTE).await;
    let c = claim_one(&*store, &a, MINUTE).await;
    let undone = failed_and_undone(&*store, &first).await;
    let id = undone.order_id.clone();
    assert_eq!(row(&*store, &id).await.process_state, ProcessState::Error);
    let who = Actor::operator("op");
    let r = store
        .resubmit(&id, &who, "supplier fixed", &[])
        .await
        .unwrap();
    assert_eq!(
        (
            r.process_state,
            r.generation,
            r.current_step,
            r.failure_count
        ),
        (ProcessState::Pending, 1, 0, 0),
        "fresh run from the first step, next generation"
    );
    let view = store.get(&id).await.unwrap();
    assert!(
        view.steps.is_empty(),
        "the undone run's step records are gone: {:?}",
        view.steps
    );
    let last = view.history.last().unwrap();
    assert_eq!(last.kind, HistoryKind::RetriedAfresh);
    let reason = last.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("supplier fixed")
            && reason.contains("fresh run")
            && reason.contains("generation 1"),
        "{reason}"
    );
    let again = claim_one(&*store, &a, MINUTE).await;
    assert_eq!(
        (
            again.fence.order_id.clone(),
            again.generation,
            again.current_step
        ),
        (id.clone(), 1, 0)
    );

    // Steps 0 and 1 done, step 2 failed, nothing undone: the retry continues at step 2.
    let f = &c.fence;
    fail_the_last_step(&*store, f).await;
    store.fail(f, "step 2 failed", &[]).await.unwrap();
    let r = store
        .resubmit(&f.order_id, &who, "retry", &[])
        .await
        .unwrap();
    assert_eq!(
        (r.generation, r.current_step),
        (0, 2),
        "continues from the failed step"
    );
    assert_eq!(
        store.get(&f.order_id).await.unwrap().steps.len(),
        3,
        "its steps stand"
    );
}

/// At the failure threshold an order with steps that may have taken effect is not left
/// in Error with them in effect: it goes back to Pending at once to have them undone
/// (then ends in Error); one with none ends in Error at once; one whose undoing itself
/// times out goes round again to undo within the undo budget, and past it ends in Error
/// marked as needing manual repair.
pub async fn giving_up_undoes_the_steps_done_first(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 2).await;
    let a = owner("a");
    let leader = leader(&*store, 1).await;
    let once = policy(1, 1);
    let touched = claim_one(&*store, &a, Duration::from_secs(1)).await;
    store
        .record_steps(&[start_first(&touched.fence)])
        .await
        .unwrap();
    let untouched = claim_one(&*store, &a, Duration::from_secs(1)).await;
    ctx.clock.advance(Duration::from_secs(2));
    let recovered = store.recover_expired(&leader, &once, 10).await.unwrap();
    assert_eq!(recovered.len(), 2);
    for r in &recovered {
        match r {
            orderly_core::store::RecoveryOutcome::Undoing {
                order_id,
                failure_count,
            } => {
                assert_eq!((order_id, *failure_count), (&touched.fence.order_id, 1));
            }
            orderly_core::store::RecoveryOutcome::GaveUp { order_id, .. } => {
                assert_eq!(order_id, &untouched.fence.order_id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        row(&*store, &untouched.fence.order_id).await.process_state,
        ProcessState::Error
    );
    let r = row(&*store, &touched.fence.order_id).await;
    assert_eq!(
        (r.process_state, r.finish_as, r.failure_count),
        (ProcessState::Pending, Some(ProcessState::Error), 1)
    );
    assert!(
        r.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("undoing"),
        "{:?}",
        r.last_error
    );
    // Claimable at once, and the claim says it is to be undone.
    let undo = claim_one(&*store, &a, Duration::from_secs(1)).await;
    assert_eq!(undo.fence.order_id, touched.fence.order_id);
    assert_eq!(undo.finish_as, Some(ProcessState::Error));
    // The undoing expires too: within the undo budget it goes round again to be undone
    // (a transient hang must not leave an effect in force), after the back-off.
    let undo_budget = orderly_core::store::RecoveryPolicy {
        max_undo_failures: 2,
        ..once.clone()
    };
    ctx.clock.advance(Duration::from_secs(2));
    let again = store
        .recover_expired(&leader, &undo_budget, 10)
        .await
        .unwrap();
    assert!(
        matches!(
            again[..],
            [orderly_core::store::RecoveryOutcome::Retried {
                failure_count: 2,
                ..
            }]
        ),
        "{again:?}"
    );
    let r = row(&*store, &touched.fence.order_id).await;
    assert_eq!(
        (r.process_state, r.finish_as, r.failure_count),
        (ProcessState::Pending, Some(ProcessState::Error), 2)
    );
    assert!(
        r.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("undoing")
            && r.last_error
                .as_deref()
                .unwrap_or_default()
                .contains("failure 2 of 3"),
        "{:?}",
        r.last_error
    );
    ctx.clock.advance(Duration::from_secs(3));
    let undo = claim_one(&*store, &a, Duration::from_secs(1)).await;
    assert_eq!(undo.fence.order_id, touched.fence.order_id);
    assert_eq!(undo.finish_as, Some(ProcessState::Error));
    // Past the undo budget: Error, needing repair by hand, with one alert.
    ctx.clock.advance(Duration::from_secs(2));
    let again = store
        .recover_expired(&leader, &undo_budget, 10)
        .await
        .unwrap();
    assert!(
        matches!(
            again[..],
            [orderly_core::store::RecoveryOutcome::GaveUp { .. }]
        ),
        "{again:?}"
    );
    let r = row(&*store, &touched.fence.order_id).await;
    assert_eq!((r.process_state, r.finish_as), (ProcessState::Error, None));
    assert!(
        r.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("manual repair"),
        "{:?}",
        r.last_error
    );
    let alerts = store.alerts(false, 100).await.unwrap();
    assert_eq!(
        alerts
            .iter()
            .filter(|al| al.order_id == touched.fence.order_id)
            .count(),
        1,
        "one alert, when it entered Error"
    );
}

/// The write that records the last step also completes the order, in one transaction:
/// no window in which a finished order waits, Processing, to time out. Refused (stale
/// fence), it records nothing and completes nothing.
pub async fn recording_the_last_step_completes_the_order_in_the_same_write(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 1).await;
    let a = owner("a");
    let c = claim_one(&*store, &a, MINUTE).await;
    let f = &c.fence;
    store.record_steps(&[start_first(f)]).await.unwrap();
    let stale = Fence {
        epoch: orderly_core::Epoch(f.epoch.0 - 1),
        ..f.clone()
    };
    let mut last = write(&stale, Some(0), vec![update(0, StepStatus::Succeeded)]);
    last.complete = true;
    let refused = store.record_steps(&[last.clone()]).await.unwrap();
    assert!(
        matches!(refused[..], [Err(Error::Fenced { .. })]),
        "{refused:?}"
    );
    assert_eq!(
        row(&*store, &f.order_id).await.process_state,
        ProcessState::Processing
    );
    // In one batch with another order's write that does not complete it.
    submit_n(&*store, 1).await;
    let other = claim_one(&*store, &a, MINUTE).await;
    store
        .record_steps(&[start_first(&other.fence)])
        .await
        .unwrap();
    let going_on = first_done(&other.fence);
    last.fence = f.clone();
    let applied = store.record_steps(&[going_on, last]).await.unwrap();
    assert!(matches!(applied[..], [Ok(()), Ok(())]), "{applied:?}");
    let r = row(&*store, &f.order_id).await;
    assert_eq!(
        (r.process_state, r.locked_by, r.complete_by),
        (ProcessState::Processed, None, None)
    );
    let history = store.get(&f.order_id).await.unwrap().history;
    let kinds: Vec<HistoryKind> = history.iter().map(|e| e.kind).collect();
    assert_eq!(
        &kinds[kinds.len() - 2..],
        [HistoryKind::StepSucceeded, HistoryKind::Completed]
    );
    let completed = history.last().unwrap();
    assert_eq!(
        (
            completed.from_state,
            completed.to_state,
            completed.epoch,
            completed.step
        ),
        (
            Some(ProcessState::Processing),
            ProcessState::Processed,
            f.epoch,
            None
        )
    );
    assert!(history.windows(2).all(|w| w[0].seq < w[1].seq));
    let r = row(&*store, &other.fence.order_id).await;
    assert_eq!(
        (r.process_state, r.locked_by, r.current_step),
        (ProcessState::Processing, Some(a.clone()), 1)
    );
    let kinds: Vec<HistoryKind> = store
        .get(&other.fence.order_id)
        .await
        .unwrap()
        .history
        .iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        &kinds[kinds.len() - 2..],
        [HistoryKind::StepSucceeded, HistoryKind::StepStarted]
    );
}
