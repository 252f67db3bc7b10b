//! Conformance cases for what the worker roles need of the store: batched step
//! writes, resuming after a restart, compensation, cancel requests and alerts.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::step::StepStatus;
use orderly_core::store::{StepUpdate, StepWrite};
use orderly_core::{Actor, Error, Fence, ProcessState};

use super::{Ctx, MINUTE, claim_one, leader, owner, policy, row, submit_n};

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

/// A batch of orders in one transaction: each judged alone, repeats absorbed.
pub async fn submit_many_records_a_batch_and_judges_each_order_alone(ctx: &Ctx) {
    use orderly_core::store::{Submission, SubmitOutcome};
    let store = ctx.store().await;
    let sub = |order| Submission {
        order,
        sends: Vec::new(),
    };
    let (a, b, c) = (
        crate::builders::order(1),
        crate::builders::order(2),
        crate::builders::order(3),
    );
    let first = store
        .submit_many(
            &[sub(a.clone()), sub(b.clone())],
            &crate::builders::submitter(),
        )
        .await
        .unwrap();
    assert!(matches!(
        first[..],
        [Ok(SubmitOutcome::Accepted), Ok(SubmitOutcome::Accepted)]
    ));
    let mut conflict = b.clone();
    conflict.details = crate::builders::details(99);
    let mut invalid = crate::builders::order(4);
    invalid.reply_to = Some(String::new());
    let second = store
        .submit_many(
            &[
                sub(a.clone()),
                sub(conflict),
                sub(invalid.clone()),
                sub(c.clone()),
            ],
            &crate::builders::submitter(),
        )
        .await
        .unwrap();
    assert!(
        matches!(second[0], Ok(SubmitOutcome::Duplicate)),
        "{:?}",
        second[0]
    );
    assert!(
        matches!(second[1], Err(Error::OrderIdConflict(_))),
        "{:?}",
        second[1]
    );
    assert!(
        matches!(second[2], Err(Error::Invalid(ref v)) if v.field == "reply_to"),
        "{:?}",
        second[2]
    );
    assert!(
        matches!(second[3], Ok(SubmitOutcome::Accepted)),
        "{:?}",
        second[3]
    );
    let counts = store.count_by_state().await.unwrap();
    assert!(counts.contains(&(ProcessState::Pending, 3)), "{counts:?}");
    assert!(matches!(
        store.get(&invalid.order_id).await,
        Err(Error::OrderNotFound(_))
    ));
    let history = store.get(&a.order_id).await.unwrap().history;
    assert_eq!(
        history
            .iter()
            .filter(|e| e.kind == HistoryKind::Submitted)
            .count(),
        1
    );
    assert_eq!(
        store.get(&b.order_id).await.unwrap().details,
        b.details,
        "the conflict changed nothing"
    );
    // The same id twice in one batch: the first row is the order, the second a repeat
    // (same details) or a conflict (other details), exactly as one by one.
    let (d, e) = (crate::builders::order(5), crate::builders::order(6));
    let mut e_other = e.clone();
    e_other.details = crate::builders::details(98);
    let third = store
        .submit_many(
            &[sub(d.clone()), sub(d.clone()), sub(e.clone()), sub(e_other)],
            &crate::builders::submitter(),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            third[..],
            [
                Ok(SubmitOutcome::Accepted),
                Ok(SubmitOutcome::Duplicate),
                Ok(SubmitOutcome::Accepted),
                Err(Error::OrderIdConflict(_))
            ]
        ),
        "{third:?}"
    );
    for o in [&d, &e] {
        let view = store.get(&o.order_id).await.unwrap();
        assert_eq!(view.details, o.details, "the first row's details are kept");
        assert_eq!(view.history_count(HistoryKind::Submitted), 1);
    }
    let counts = store.count_by_state().await.unwrap();
    assert!(counts.contains(&(ProcessState::Pending, 5)), "{counts:?}");
}

/// A claimer with nothing to claim waits for orders instead of polling: a submit, and
/// a release back to Pending, through another handle (on PostgreSQL another pool, so
/// the signal crosses connections as between processes) end its wait at once; and one
/// that happened while it was busy ends the next wait at once, not after it.
pub async fn a_waiting_claimer_is_woken_by_a_submit_and_a_release(ctx: &Ctx) {
    let claimer = ctx.store().await;
    let writer = ctx.store().await;
    let long = Duration::from_secs(30);
    // Prime: the first wait may start the cross-connection listener.
    let mut seen = 0;
    claimer
        .wait_claimable(&mut seen, Duration::from_millis(300))
        .await;
    let wait = |store: Arc<dyn orderly_core::store::StateStore>, mut seen: u64| {
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            store.wait_claimable(&mut seen, long).await;
            (started.elapsed(), seen)
        })
    };
    let waiting = wait(claimer.clone(), seen);
    tokio::time::sleep(Duration::from_millis(300)).await;
    submit_n(&*writer, 1).await;
    let (waited, seen_now) = waiting.await.unwrap();
    assert!(
        waited < Duration::from_secs(20),
        "woken by the submit, not the 30 s limit ({waited:?})"
    );
    assert_ne!(seen_now, seen, "the count moved");
    let seen = seen_now;

    let a = owner("a");
    let held = claim_one(&*claimer, &a, MINUTE).await;
    let waiting = wait(claimer.clone(), seen);
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer.release(&held.fence, "handed back").await.unwrap();
    let (waited, seen_now) = waiting.await.unwrap();
    assert!(
        waited < Duration::from_secs(20),
        "woken by the release ({waited:?})"
    );
    let seen = seen_now;

    // Something that happened between two waits is not missed.
    writer
        .submit(
            &crate::builders::order(7),
            &crate::builders::submitter(),
            &[],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (waited, _) = wait(claimer.clone(), seen).await.unwrap();
    assert!(
        waited < Duration::from_secs(20),
        "a submit before the wait ends it at once ({waited:?})"
    );
}

/// `owned` lists the fences of exactly the Processing orders an owner holds, and
/// releasing them hands each back to Pending without a failure.
pub async fn owned_lists_what_an_owner_holds_and_release_hands_it_back(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 3).await;
    let a = owner("a");
    let b = owner("b");
    let held = claim_one(&*store, &a, MINUTE).await;
    let held2 = claim_one(&*store, &a, MINUTE).await;
    claim_one(&*store, &b, MINUTE).await;
    let mut fences = store.owned(&a).await.unwrap();
    fences.sort_by(|x, y| x.order_id.cmp(&y.order_id));
    let mut expected = vec![held.fence.clone(), held2.fence.clone()];
    expected.sort_by(|x, y| x.order_id.cmp(&y.order_id));
    assert_eq!(fences, expected);
    for f in &fences {
        store.release(f, "shutting down").await.unwrap();
    }
    assert!(store.owned(&a).await.unwrap().is_empty());
    assert_eq!(store.owned(&b).await.unwrap().len(), 1);
    let r = row(&*store, &held.fence.order_id).await;
    assert_eq!(
        (r.process_state, r.failure_count),
        (ProcessState::Pending, 0)
    );
}

/// Applies one write, which must be accepted.
async fn apply(store: &dyn orderly_core::store::StateStore, w: StepWrite) {
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

/// A claim and its first step commit together: the orders it claims have their step
/// started in the same transaction; if a planned write cannot be applied, nothing is
/// claimed at all.
pub async fn a_claim_and_its_first_step_commit_together(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 3).await;
    let a = owner("a");
    let request = orderly_core::store::ClaimRequest {
        workflows: Default::default(),
        owner: a.clone(),
        limit: 2,
        timeout: MINUTE,
    };
    // A plan that cannot apply (it expects another step): nothing is claimed.
    let wrong = |c: &orderly_core::store::ClaimedOrder| {
        Some(write(
            &c.fence,
            Some(5),
            vec![update(5, StepStatus::Started)],
        ))
    };
    assert!(store.claim_and_start(&request, &wrong).await.is_err());
    for id in &ids {
        assert_eq!(row(&*store, id).await.process_state, ProcessState::Pending);
    }
    // The plan starts step 0 of the first order it sees, nothing for the others.
    let first = std::sync::Mutex::new(true);
    let plan = |c: &orderly_core::store::ClaimedOrder| {
        let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *first, false).then(|| start_first(&c.fence))
    };
    // Away from the host's time: the claim and its step are written at the store's.
    ctx.clock.advance(Duration::from_secs(3_600));
    let at = orderly_core::clock::truncate_micros(orderly_core::Clock::now(&ctx.clock));
    let claimed = store.claim_and_start(&request, &plan).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert_eq!(claimed.iter().filter(|(_, started)| *started).count(), 1);
    for (c, started) in &claimed {
        let r = row(&*store, &c.fence.order_id).await;
        assert_eq!(
            (r.process_state, r.lock_epoch),
            (ProcessState::Processing, c.fence.epoch)
        );
        let steps = store.steps(&c.fence.order_id).await.unwrap();
        assert_eq!(steps.len(), usize::from(*started), "{steps:?}");
        let written: Vec<_> = store
            .get(&c.fence.order_id)
            .await
            .unwrap()
            .history
            .into_iter()
            .filter(|e| matches!(e.kind, HistoryKind::Claimed | HistoryKind::StepStarted))
            .map(|e| (e.kind, e.at))
            .collect();
        let mut expected = vec![(HistoryKind::Claimed, at)];
        if *started {
            expected.push((HistoryKind::StepStarted, at));
        }
        assert_eq!(written, expected);
    }
}

/// A claim takes only orders of the workflows the claimant runs: a new order is pinned
/// to the version the claimant starts it on (the default workflow for an order that
/// names none), and once pinned it is taken only by a claimant that carries that
/// version on, however often it goes back to Pending. The rest wait, counted by
/// `workflows_in_flight`.
pub async fn claims_take_only_loaded_workflows_and_pin_new_orders(ctx: &Ctx) {
    use orderly_core::store::{ClaimRequest, WorkflowCount};
    use orderly_core::workflow::{Workflow, Workflows};
    let store = ctx.store().await;
    let v1 = Workflow::default();
    let mut v2 = Workflow::default();
    v2.steps[2].timeout_ms += 5_000;
    let mut gift = Workflow {
        name: "gift".into(),
        ..Workflow::default()
    };
    gift.steps.truncate(2);
    let submit = |id: &str, workflow: Option<&str>| {
        let mut o = crate::builders::order_with_id(id, 1);
        o.workflow = workflow.map(str::to_owned);
        o
    };
    for o in [
        submit("plain", None),
        submit("wrapped", Some("gift")),
        submit("returned", Some("returns")),
    ] {
        store
            .submit(&o, &crate::builders::submitter(), &[])
            .await
            .unwrap();
    }
    let a = owner("a");
    let claim = |workflows: Vec<Workflow>| ClaimRequest {
        owner: a.clone(),
        limit: 10,
        timeout: MINUTE,
        workflows: std::sync::Arc::new(Workflows::new(workflows).unwrap().filter()),
    };
    let ids = |claimed: &[orderly_core::store::ClaimedOrder]| {
        let mut ids: Vec<String> = claimed
            .iter()
            .map(|c| c.fence.order_id.as_str().to_owned())
            .collect();
        ids.sort();
        ids
    };

    // Runs v1 only: takes the order that names no workflow and pins it to v1.
    let claimed = store.claim(&claim(vec![v1.clone()])).await.unwrap();
    assert_eq!(ids(&claimed), ["plain"]);
    assert_eq!(claimed[0].workflow, Some(v1.reference()));
    let plain = row(&*store, &claimed[0].fence.order_id).await;
    assert_eq!(
        (plain.workflow.as_deref(), plain.workflow_version.as_deref()),
        (Some("order"), Some(v1.version().as_str()))
    );
    store
        .release(&claimed[0].fence, "handed back")
        .await
        .unwrap();

    // Runs v2 and gift: the v1 order is not its to take; the gift order is.
    let claimed = store
        .claim(&claim(vec![v2.clone(), gift.clone()]))
        .await
        .unwrap();
    assert_eq!(ids(&claimed), ["wrapped"]);
    assert_eq!(claimed[0].workflow, Some(gift.reference()));

    // Runs v2 and still carries v1 on: takes the v1 order, whose pin stays v1.
    let claimed = store
        .claim(&claim(vec![v2.clone(), v1.clone()]))
        .await
        .unwrap();
    assert_eq!(ids(&claimed), ["plain"]);
    assert_eq!(claimed[0].workflow, Some(v1.reference()));
    assert_eq!(
        row(&*store, &claimed[0].fence.order_id)
            .await
            .workflow_version
            .as_deref(),
        Some(v1.version().as_str())
    );

    // Nobody runs "returns": it waits, and the count says so.
    let mut counts = store.workflows_in_flight().await.unwrap();
    counts.sort_by(|x, y| x.workflow.cmp(&y.workflow));
    assert_eq!(
        counts,
        vec![
            WorkflowCount {
                workflow: Some("gift".into()),
                version: Some(gift.version()),
                state: ProcessState::Processing,
                orders: 1,
            },
            WorkflowCount {
                workflow: Some("order".into()),
                version: Some(v1.version()),
                state: ProcessState::Processing,
                orders: 1,
            },
            WorkflowCount {
                workflow: Some("returns".into()),
                version: None,
                state: ProcessState::Pending,
                orders: 1,
            },
        ]
    );
}

/// An operator moves orders to a compatible version: only Pending and Error ones of the
/// version named, each with a history entry; an incompatible or unstored version, or
/// orders in Processing, are refused before anything moves.
pub async fn orders_move_only_to_a_stored_compatible_version_and_say_so(ctx: &Ctx) {
    use orderly_core::store::ClaimRequest;
    use orderly_core::workflow::{Workflow, Workflows};
    let store = ctx.store().await;
    let v1 = Workflow::default();
    let mut v2 = Workflow::default();
    v2.steps[1].timeout_ms += 5_000;
    let mut v3 = Workflow::default();
    v3.steps.truncate(2);
    for i in 0..3 {
        let o = crate::builders::order_with_id(&format!("m-{i}"), 1);
        store
            .submit(&o, &crate::builders::submitter(), &[])
            .await
            .unwrap();
    }
    let a = owner("a");
    let claimed = store
        .claim(&ClaimRequest {
            owner: a.clone(),
            limit: 10,
            timeout: MINUTE,
            workflows: Arc::new(Workflows::new(vec![v1.clone()]).unwrap().filter()),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    // m-0 ends in Error, m-1 is handed back (Pending), m-2 stays in Processing.
    for c in &claimed {
        match c.fence.order_id.as_str() {
            "m-0" => store.fail(&c.fence, "declined", &[]).await.unwrap(),
            "m-1" => store.release(&c.fence, "handed back").await.unwrap(),
            _ => {}
        }
    }
    let op = Actor::operator("erin");
    let (r1, r2, r3) = (v1.reference(), v2.reference(), v3.reference());
    // Not stored yet: refused.
    let e = store
        .move_version(&r1, &r2, &[], &op, "budgets", 100)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().contains("not stored"),
        "{e}"
    );
    store
        .record_workflows(
            &[
                Arc::new(v1.clone()),
                Arc::new(v2.clone()),
                Arc::new(v3.clone()),
            ],
            "test",
        )
        .await
        .unwrap();
    let e = store
        .move_version(&r1, &r3, &[], &op, "fewer steps", 100)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("not compatible") && e.to_string().contains("number of steps"),
        "{e}"
    );
    let e = store
        .move_version(&r1, &r2, &[ProcessState::Processing], &op, "budgets", 100)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Processing"), "{e}");
    for id in ["m-0", "m-1", "m-2"] {
        let s = row(&*store, &orderly_core::OrderId::parse(id).unwrap()).await;
        assert_eq!(
            s.workflow_version.as_deref(),
            Some(r1.version.as_str()),
            "{id}"
        );
    }
    // One at a time, then the rest: the Error and the Pending order move; the one in
    // Processing stays on v1.
    let first = store
        .move_version(&r1, &r2, &[], &op, "budgets", 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let rest = store
        .move_version(&r1, &r2, &[], &op, "budgets", 100)
        .await
        .unwrap();
    let mut moved: Vec<&str> = first.iter().chain(&rest).map(|o| o.as_str()).collect();
    moved.sort_unstable();
    assert_eq!(moved, ["m-0", "m-1"]);
    for (id, version, state) in [
        ("m-0", &r2.version, ProcessState::Error),
        ("m-1", &r2.version, ProcessState::Pending),
        ("m-2", &r1.version, ProcessState::Processing),
    ] {
        let view = store
            .get(&orderly_core::OrderId::parse(id).unwrap())
            .await
            .unwrap();
        assert_eq!(
            view.state.workflow_version.as_deref(),
            Some(version.as_str()),
            "{id}"
        );
        assert_eq!(view.state.process_state, state, "{id}");
        let moves: Vec<_> = view
            .history
            .iter()
            .filter(|e| e.kind == HistoryKind::VersionMoved)
            .collect();
        if id == "m-2" {
            assert!(moves.is_empty());
        } else {
            assert_eq!(moves.len(), 1, "{id}");
            assert_eq!(moves[0].actor.as_str(), "operator:erin");
            assert_eq!(
                (moves[0].from_state, moves[0].to_state),
                (Some(state), state)
            );
            let reason = moves[0].reason.as_deref().unwrap_or_default();
            assert!(
                reason.contains(&r1.to_string())
                    && reason.contains(&r2.to_string())
                    && reason.contains("budgets"),
                "{reason}"
            );
        }
    }
    // Nothing left to move.
    assert!(
        store
            .move_version(&r1, &r2, &[], &op, "budgets", 100)
            .await
            .unwrap()
            .is_empty()
    );
}
