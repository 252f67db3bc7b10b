//! Conformance cases for what the worker roles need of the store: batched step
//! writes, resuming after a restart, compensation, cancel requests and alerts.

use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::step::StepStatus;
use orderly_core::store::{StepUpdate, StepWrite};
use orderly_core::{Actor, Error, Fence, ProcessState};

use super::{Ctx, MINUTE, claim_one, leader, owner, policy, row, submit_n};

mod batches;
mod compensation;
mod versions;

pub use batches::*;
pub use compensation::*;
pub use versions::*;

fn update(index: i32, status: StepStatus) -> StepUpdate {
    StepUpdate {
        index,
        name: format!("step-{index}"),
        status,
        detail: Some(format!("{status} {index}")),
        idempotency_key: format!("key-{index}"),
        irreversible: false,
    }
}

fn write(fence: &Fence, expect: Option<i32>, updates: Vec<StepUpdate>) -> StepWrite {
    StepWrite {
        complete: false,
        fence: fence.clone(),
        expect_step: expect,
        updates,
        sends: Vec::new(),
    }
}

/// The first step's start, as the claim's first write.
fn start_first(fence: &Fence) -> StepWrite {
    write(fence, Some(0), vec![update(0, StepStatus::Started)])
}

/// The first step's success and the second's start, as its reply's write.
fn first_done(fence: &Fence) -> StepWrite {
    write(
        fence,
        Some(0),
        vec![
            update(0, StepStatus::Succeeded),
            update(1, StepStatus::Started),
        ],
    )
}

/// One transaction, many orders: each write is applied or refused on its own, and a
/// refused one changes nothing. A repeated reply is refused as a stale step.
pub async fn record_steps_applies_each_write_or_refuses_it_alone(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 4).await;
    let (a, b) = (owner("a"), owner("b"));
    let one = claim_one(&*store, &a, MINUTE).await;
    let two = claim_one(&*store, &a, MINUTE).await;
    let three = claim_one(&*store, &b, MINUTE).await;
    let stolen = Fence {
        owner: a.clone(),
        ..three.fence.clone()
    };
    let advance = first_done(&one.fence);
    let verdicts = store
        .record_steps(&[
            advance.clone(),
            write(&stolen, Some(0), vec![update(0, StepStatus::Succeeded)]),
            write(&two.fence, Some(5), vec![update(5, StepStatus::Succeeded)]),
        ])
        .await
        .unwrap();
    assert!(verdicts[0].is_ok(), "{:?}", verdicts[0]);
    assert!(
        matches!(verdicts[1], Err(Error::Fenced { .. })),
        "{:?}",
        verdicts[1]
    );
    assert!(
        matches!(
            verdicts[2],
            Err(Error::StaleStep {
                expected: 5,
                current: 0,
                ..
            })
        ),
        "{:?}",
        verdicts[2]
    );
    assert_eq!(row(&*store, &one.fence.order_id).await.current_step, 1);
    let view = store.get(&one.fence.order_id).await.unwrap();
    let statuses: Vec<_> = view.steps.iter().map(|s| (s.index, s.status)).collect();
    assert_eq!(
        statuses,
        [(0, StepStatus::Succeeded), (1, StepStatus::Started)]
    );
    // Only a start counts as an attempt; the history lists the updates in their order.
    let attempts: Vec<_> = view.steps.iter().map(|s| s.attempts).collect();
    assert_eq!(attempts, [0, 1]);
    let written: Vec<_> = view
        .history
        .iter()
        .filter(|e| e.step.is_some())
        .map(|e| (e.kind, e.step))
        .collect();
    assert_eq!(
        written,
        [
            (HistoryKind::StepSucceeded, Some(0)),
            (HistoryKind::StepStarted, Some(1))
        ]
    );
    for refused in [&two.fence.order_id, &three.fence.order_id] {
        let v = store.get(refused).await.unwrap();
        assert!(v.steps.is_empty(), "a refused write leaves no step behind");
        assert_eq!(v.state.current_step, 0);
        assert!(
            !v.history
                .iter()
                .any(|e| e.kind == HistoryKind::StepSucceeded)
        );
    }
    // The same reply again (redelivered): refused, nothing recorded twice.
    let again = store.record_steps(&[advance]).await.unwrap();
    assert!(
        matches!(
            again[0],
            Err(Error::StaleStep {
                expected: 0,
                current: 1,
                ..
            })
        ),
        "{:?}",
        again[0]
    );
    let after = store.get(&one.fence.order_id).await.unwrap();
    assert_eq!(after.history.len(), view.history.len());
    assert_eq!(store.steps(&one.fence.order_id).await.unwrap(), after.steps);
    // Two replies for one order in one batch: the first applies, the repeat is stale.
    let dup = write(&two.fence, Some(0), vec![update(0, StepStatus::Succeeded)]);
    let both = store.record_steps(&[dup.clone(), dup]).await.unwrap();
    assert!(both[0].is_ok(), "{:?}", both[0]);
    assert!(
        matches!(
            both[1],
            Err(Error::StaleStep {
                expected: 0,
                current: 1,
                ..
            })
        ),
        "{:?}",
        both[1]
    );
    let view = store.get(&two.fence.order_id).await.unwrap();
    assert_eq!(view.history_count(HistoryKind::StepSucceeded), 1);
    // A write with no updates only checks the fence.
    let touch = store
        .record_steps(&[
            write(&one.fence, Some(1), vec![]),
            write(&stolen, None, vec![]),
        ])
        .await
        .unwrap();
    assert!(touch[0].is_ok());
    assert!(matches!(touch[1], Err(Error::Fenced { .. })));
    // Past its deadline the owner's fence still names the row, but its write is
    // refused whole (the order is the supervisor's now): no step, no history entry.
    let late = claim_one(&*store, &a, MINUTE).await;
    ctx.clock.advance(MINUTE);
    let before = store.get(&late.fence.order_id).await.unwrap();
    let refused = store
        .record_steps(&[start_first(&late.fence)])
        .await
        .unwrap();
    assert!(
        matches!(refused[0], Err(Error::DeadlinePassed { .. })),
        "{:?}",
        refused[0]
    );
    let after = store.get(&late.fence.order_id).await.unwrap();
    assert!(after.steps.is_empty(), "a late write leaves no step behind");
    assert_eq!(after.history.len(), before.history.len());
    assert_eq!(after.state, before.state);
}

/// A scheduler restarting under the same instance id takes back its live orders with
/// a new epoch; the old term's writes are refused; expired ones are left to recovery.
pub async fn resume_owned_takes_back_live_orders_under_a_new_epoch(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 3).await;
    let a = owner("a");
    let short = claim_one(&*store, &a, Duration::from_secs(5)).await;
    let live = claim_one(&*store, &a, MINUTE).await;
    let other = claim_one(&*store, &owner("b"), MINUTE).await;
    ctx.clock.advance(Duration::from_secs(10));
    let resumed = store.resume_owned(&a).await.unwrap();
    assert_eq!(resumed.len(), 1, "only the live order of this owner");
    let r = &resumed[0];
    assert_eq!(r.fence.order_id, live.fence.order_id);
    assert_eq!(r.fence.epoch.0, live.fence.epoch.0 + 1);
    assert_eq!(r.complete_by, live.complete_by, "the deadline is kept");
    assert_eq!(r.details, live.details);
    let old = store
        .record_steps(&[start_first(&live.fence)])
        .await
        .unwrap();
    assert!(matches!(old[0], Err(Error::Fenced { .. })), "{:?}", old[0]);
    let new = store.record_steps(&[start_first(&r.fence)]).await.unwrap();
    assert!(new[0].is_ok());
    let history = store.get(&live.fence.order_id).await.unwrap().history;
    assert!(
        history
            .iter()
            .any(|e| e.kind == HistoryKind::Resumed && e.epoch == r.fence.epoch)
    );
    assert_eq!(
        row(&*store, &short.fence.order_id).await.lock_epoch,
        short.fence.epoch
    );
    assert_eq!(
        row(&*store, &other.fence.order_id).await.lock_epoch,
        other.fence.epoch
    );
}

/// Marking an order for compensation keeps it Processing under its owner; only the
/// owner ends it Cancelled, and a stale owner cannot.
pub async fn a_compensating_order_ends_cancelled_only_through_its_owner(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 1).await;
    let a = owner("a");
    let c = claim_one(&*store, &a, MINUTE).await;
    let bad = store
        .begin_compensation(&c.fence, ProcessState::Processed, "nope", &[])
        .await
        .unwrap_err();
    assert!(
        matches!(bad, Error::Invalid(ref v) if v.field == "finish_as"),
        "{bad:?}"
    );
    store
        .begin_compensation(&c.fence, ProcessState::Cancelled, "operator asked", &[])
        .await
        .unwrap();
    let r = row(&*store, &c.fence.order_id).await;
    assert_eq!(r.process_state, ProcessState::Processing);
    assert_eq!(r.finish_as, Some(ProcessState::Cancelled));
    let stale = Fence {
        epoch: orderly_core::Epoch(c.fence.epoch.0 - 1),
        ..c.fence.clone()
    };
    assert!(matches!(
        store.finish_cancelled(&stale, "x", &[]).await,
        Err(Error::Fenced { .. })
    ));
    store
        .finish_cancelled(&c.fence, "undone", &[])
        .await
        .unwrap();
    let r = row(&*store, &c.fence.order_id).await;
    assert_eq!(r.process_state, ProcessState::Cancelled);
    assert_eq!(
        (r.locked_by, r.complete_by, r.finish_as),
        (None, None, None)
    );
    let kinds: Vec<_> = store
        .get(&c.fence.order_id)
        .await
        .unwrap()
        .history
        .iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Submitted,
            HistoryKind::Claimed,
            HistoryKind::CompensationStarted,
            HistoryKind::Cancelled
        ]
    );
}

/// An untouched order is cancelled at once; one whose steps may have taken effect goes
/// back to Pending to be undone, its owner fenced out, and the next claim says so.
pub async fn request_cancel_undoes_started_work_and_cancels_untouched_orders_at_once(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 2).await;
    let ops = Actor::operator("ops");
    let a = owner("a");
    let c = claim_one(&*store, &a, MINUTE).await;
    let untouched = ids.iter().find(|id| **id != c.fence.order_id).unwrap();
    let r = store
        .request_cancel(untouched, &ops, "dup", &[])
        .await
        .unwrap();
    assert_eq!(r.process_state, ProcessState::Cancelled);
    store.record_steps(&[start_first(&c.fence)]).await.unwrap();
    let r = store
        .request_cancel(&c.fence.order_id, &ops, "customer", &[])
        .await
        .unwrap();
    assert_eq!(r.process_state, ProcessState::Pending);
    assert_eq!(r.finish_as, Some(ProcessState::Cancelled));
    assert_eq!(r.locked_by, None);
    let again = store
        .request_cancel(&c.fence.order_id, &ops, "customer", &[])
        .await
        .unwrap();
    assert_eq!(again, r, "asking twice changes nothing");
    let late = store
        .record_steps(&[write(
            &c.fence,
            Some(0),
            vec![update(0, StepStatus::Succeeded)],
        )])
        .await
        .unwrap();
    assert!(late[0].is_err(), "the former owner is fenced out");
    let next = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(next.fence.order_id, c.fence.order_id);
    assert_eq!(next.finish_as, Some(ProcessState::Cancelled));
    let history = store.get(&c.fence.order_id).await.unwrap().history;
    assert!(
        history
            .iter()
            .any(|e| e.kind == HistoryKind::CancelRequested
                && e.actor == ops
                && e.reason.as_deref() == Some("customer"))
    );
}

/// A cancel that would undo an order is refused while a step that can never be undone
/// may have taken effect (started or done): the error names it, and the order, its
/// owner and its history are left as they were. Once that step has failed, the cancel
/// undoes the others as usual; a cancel without compensation is never refused.
pub async fn a_cancel_past_a_step_that_cannot_be_undone_is_refused_naming_it(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 2).await;
    let ops = Actor::operator("ops");
    let a = owner("a");
    let irreversible = |index: i32, status: StepStatus| StepUpdate {
        irreversible: true,
        ..update(index, status)
    };
    let x = claim_one(&*store, &a, MINUTE).await;
    let y = claim_one(&*store, &a, MINUTE).await;
    // Step 0 done (it can be undone), step 1 (it cannot) under way.
    apply(
        &*store,
        write(
            &x.fence,
            Some(0),
            vec![
                update(0, StepStatus::Succeeded),
                irreversible(1, StepStatus::Started),
            ],
        ),
    )
    .await;
    let before = store.get(&x.fence.order_id).await.unwrap();
    match store
        .request_cancel(&x.fence.order_id, &ops, "customer", &[])
        .await
    {
        Err(Error::PastReturn { order_id, steps }) => {
            assert_eq!(
                (order_id, steps.as_str()),
                (x.fence.order_id.clone(), "step-1")
            );
        }
        other => panic!("refused, naming step-1: {other:?}"),
    }
    let after = store.get(&x.fence.order_id).await.unwrap();
    assert_eq!(after.state, before.state, "the order is as it was");
    assert_eq!(
        after.history.len(),
        before.history.len(),
        "and so is its history"
    );
    // Step 1 fails: nothing stands in the way any more.
    apply(
        &*store,
        write(&x.fence, Some(1), vec![irreversible(1, StepStatus::Failed)]),
    )
    .await;
    let r = store
        .request_cancel(&x.fence.order_id, &ops, "customer", &[])
        .await
        .unwrap();
    assert_eq!(
        (r.process_state, r.finish_as),
        (ProcessState::Pending, Some(ProcessState::Cancelled)),
        "step 0 is undone first"
    );
    // Its first step cannot be undone and is done: refused; without compensation, done.
    apply(
        &*store,
        write(
            &y.fence,
            Some(0),
            vec![irreversible(0, StepStatus::Succeeded)],
        ),
    )
    .await;
    assert!(matches!(
        store
            .request_cancel(&y.fence.order_id, &ops, "customer", &[])
            .await,
        Err(Error::PastReturn { .. })
    ));
    let r = store
        .cancel(&y.fence.order_id, &ops, "dealt with by hand", &[])
        .await
        .unwrap();
    assert_eq!(r.process_state, ProcessState::Cancelled);
}

/// Whatever moves an order to Error raises one alert carrying the step and the last
/// error; publishing marks each once, however many publishers race.
pub async fn every_error_raises_one_alert_which_is_published_once(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 3).await;
    let a = owner("a");
    let failed = claim_one(&*store, &a, MINUTE).await;
    store
        .record_steps(&[start_first(&failed.fence)])
        .await
        .unwrap();
    store
        .fail(&failed.fence, "card declined", &[])
        .await
        .unwrap();
    let timed_out = claim_one(&*store, &a, Duration::from_secs(5)).await;
    ctx.clock.advance(Duration::from_secs(6));
    store
        .recover_expired(&leader(&*store, 1).await, &policy(1, 1), 10)
        .await
        .unwrap();
    let alerts = store.alerts(true, 10).await.unwrap();
    assert_eq!(alerts.len(), 2, "{alerts:?}");
    let by_order = |id| alerts.iter().find(|x| &x.order_id == id).unwrap();
    let f = by_order(&failed.fence.order_id);
    assert_eq!(f.last_error.as_deref(), Some("card declined"));
    assert_eq!((f.step_index, f.step.as_deref()), (0, Some("step-0")));
    assert_eq!(f.failure_count, 1);
    let t = by_order(&timed_out.fence.order_id);
    assert!(
        t.last_error.as_deref().unwrap().contains("deadline passed"),
        "{t:?}"
    );
    let pending = store.unpublished_alerts(10).await.unwrap();
    assert_eq!(pending.len(), 2);
    let ids: Vec<i64> = pending.iter().map(|x| x.alert_id).collect();
    let term = leader(&*store, 1).await;
    let (first, second) = tokio::join!(
        store.mark_alerts_published(&term, &ids, &[]),
        store.mark_alerts_published(&term, &ids, &[])
    );
    let mut marked = first.unwrap();
    marked.extend(second.unwrap());
    marked.sort_unstable();
    assert_eq!(marked, ids, "each alert is marked by exactly one publisher");
    assert!(store.unpublished_alerts(10).await.unwrap().is_empty());
    // A new Error episode after a resubmit raises a new alert.
    store
        .resubmit(
            &failed.fence.order_id,
            &Actor::operator("ops"),
            "fixed",
            &[],
        )
        .await
        .unwrap();
    let again = claim_one(&*store, &a, MINUTE).await;
    store
        .fail(&again.fence, "declined again", &[])
        .await
        .unwrap();
    assert_eq!(store.alerts(false, 10).await.unwrap().len(), 3);
    assert_eq!(store.unpublished_alerts(10).await.unwrap().len(), 1);
    // An operator acknowledges one: it leaves the open list, once and for all.
    let ops = Actor::operator("ops");
    let acked = store
        .acknowledge_alert(ids[0], &ops)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acked.acknowledged_by.as_deref(), Some("operator:ops"));
    let at = acked.acknowledged_at.unwrap();
    ctx.clock.advance(MINUTE);
    let again = store
        .acknowledge_alert(ids[0], &Actor::operator("other"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.acknowledged_at, again.acknowledged_by.as_deref()),
        (Some(at), Some("operator:ops")),
        "the first acknowledgement stands"
    );
    let open = store.alerts(true, 10).await.unwrap();
    assert_eq!(open.len(), 2);
    assert!(open.iter().all(|a| a.alert_id != ids[0]));
    assert_eq!(store.acknowledge_alert(999_999, &ops).await.unwrap(), None);
}
