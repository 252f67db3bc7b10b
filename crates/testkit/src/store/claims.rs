//! Conformance cases for owning orders: claims under concurrency, fencing of a deposed
//! owner, deadlines, completions, step records, heartbeats and hand-backs.

use super::{Ctx, MINUTE, claim_one, claim_req, leader, owner, policy, row, submit_n};
use crate::builders;
use orderly_core::history::HistoryKind;
use orderly_core::step::{StepStatus, idempotency_key};
use orderly_core::store::{Completion, StateStore, StepUpdate};
use orderly_core::{Clock, Epoch, Error, Fence, InstanceId, OrderId, ProcessState};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A claim locks due Pending orders for the caller until now + timeout.
pub async fn claim_takes_due_orders_oldest_first_and_raises_the_epoch(ctx: &Ctx) {
    let store = ctx.store().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut order = builders::order(i);
        order.reply_to = Some(format!("replies-{i}"));
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap();
        ids.push(order.order_id);
        ctx.clock.advance(Duration::from_secs(1));
    }
    let who = owner("a");
    let claimed = store.claim(&claim_req(&who, 2, MINUTE)).await.unwrap();
    let got: HashSet<_> = claimed.iter().map(|c| c.fence.order_id.clone()).collect();
    assert_eq!(
        got,
        ids[..2].iter().cloned().collect::<HashSet<_>>(),
        "the two oldest"
    );
    for c in &claimed {
        assert_eq!(c.fence.owner, who);
        assert_eq!(c.fence.epoch, Epoch(1));
        assert_eq!(
            c.complete_by,
            ctx.clock.now() + chrono::Duration::seconds(60)
        );
        assert_eq!(c.failure_count, 0);
        assert_eq!(c.current_step, 0);
        let i: usize = ids.iter().position(|id| *id == c.fence.order_id).unwrap();
        assert_eq!(c.details, builders::details(i as u64));
        assert_eq!(c.reply_to.as_deref(), Some(format!("replies-{i}").as_str()));
        let r = row(&*store, &c.fence.order_id).await;
        assert_eq!(r.process_state, ProcessState::Processing);
        assert_eq!(r.locked_by.as_ref(), Some(&who));
        assert_eq!(r.complete_by, Some(c.complete_by));
    }
    let rest = store
        .claim(&claim_req(&owner("b"), 10, MINUTE))
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].fence.order_id, ids[2]);
    assert!(
        store
            .claim(&claim_req(&owner("c"), 10, MINUTE))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Claims are exclusive under real concurrency: 8 independent handles race.
pub async fn eight_concurrent_claimers_claim_each_of_1000_orders_exactly_once(ctx: &Ctx) {
    let store = ctx.store().await;
    // Submit from 4 handles at once to keep set-up short.
    let mut submitters = Vec::new();
    for s in 0..4u64 {
        let handle = ctx.store().await;
        submitters.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..250 {
                let order = builders::order(s * 1000 + i);
                handle
                    .submit(&order, &builders::submitter(), &[])
                    .await
                    .unwrap();
                ids.push(order.order_id);
            }
            ids
        }));
    }
    let mut submitted = HashSet::new();
    for s in submitters {
        submitted.extend(s.await.unwrap());
    }
    assert_eq!(submitted.len(), 1000);

    let mut claimers = Vec::new();
    for c in 0..8 {
        let handle = ctx.store().await;
        let who = owner(&format!("c{c}"));
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = handle.claim(&claim_req(&who, 7, MINUTE)).await.unwrap();
                if batch.is_empty() {
                    break;
                }
                mine.extend(batch.into_iter().map(|c| c.fence));
            }
            mine
        }));
    }
    let mut by_order: HashMap<OrderId, Vec<Fence>> = HashMap::new();
    for c in claimers {
        for fence in c.await.unwrap() {
            by_order
                .entry(fence.order_id.clone())
                .or_default()
                .push(fence);
        }
    }
    assert_eq!(by_order.len(), 1000, "every order claimed");
    let twice: Vec<_> = by_order.iter().filter(|(_, f)| f.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "{} orders claimed more than once, e.g. {:?}",
        twice.len(),
        twice.iter().take(2).collect::<Vec<_>>()
    );
    assert_eq!(by_order.keys().cloned().collect::<HashSet<_>>(), submitted);
    // The store agrees with what each claimer believes, and history shows one claim each.
    for (id, fences) in by_order.iter().take(50) {
        let view = store.get(id).await.unwrap();
        assert_eq!(view.state.locked_by.as_ref(), Some(&fences[0].owner));
        assert_eq!(view.state.lock_epoch, Epoch(1));
        assert_eq!(view.history_count(HistoryKind::Claimed), 1);
    }
    let counts: HashMap<_, _> = store.count_by_state().await.unwrap().into_iter().collect();
    assert_eq!(counts[&ProcessState::Processing], 1000);
    assert_eq!(counts[&ProcessState::Pending], 0);
}

/// Fencing: a deposed owner's writes are refused with a typed error and change nothing.
pub async fn stale_owner_cannot_complete_fail_extend_release_or_record_a_step(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let (a, b) = (owner("a"), owner("b"));
    let first = claim_one(&*store, &a, MINUTE).await;
    ctx.clock.advance(MINUTE + Duration::from_secs(1));
    let recovered = store
        .recover_expired(&leader(&*store, 1).await, &policy(5, 1), 10)
        .await
        .unwrap();
    assert_eq!(recovered.len(), 1);
    ctx.clock.advance(Duration::from_secs(1));
    let second = claim_one(&*store, &b, MINUTE).await;
    assert_eq!(second.fence.epoch, Epoch(2));

    // Another owner holds the order now.
    every_write_is_fenced(&*store, &first.fence, &b, Epoch(2)).await;

    // The same instance with an older epoch is just as stale.
    store.release(&second.fence, "handing back").await.unwrap();
    let third = claim_one(&*store, &b, MINUTE).await;
    assert_eq!(third.fence.epoch, Epoch(3));
    every_write_is_fenced(&*store, &second.fence, &b, Epoch(3)).await;

    // Another instance naming the current epoch is refused too: the owner is part of
    // the fence, not only the epoch.
    let forged = Fence {
        owner: a.clone(),
        ..third.fence.clone()
    };
    every_write_is_fenced(&*store, &forged, &b, Epoch(3)).await;
    store.complete(&third.fence, &[]).await.unwrap();
    assert_eq!(
        row(&*store, &id).await.process_state,
        ProcessState::Processed
    );
}

/// Tries every owner write with `stale` and checks each is refused as Fenced (the row
/// held by `holder` at `row_epoch`) and that nothing about the order changed.
async fn every_write_is_fenced(
    store: &dyn StateStore,
    stale: &Fence,
    holder: &InstanceId,
    row_epoch: Epoch,
) {
    let before = store.get(&stale.order_id).await.unwrap();
    let fenced = |what: &str, r: Result<(), Error>| match r {
        Err(Error::Fenced {
            row_epoch: e,
            holder: h,
            ..
        }) => {
            assert_eq!((e, h.as_ref()), (row_epoch, Some(holder)), "{what}");
        }
        other => panic!("{what}: expected Fenced, got {other:?}"),
    };
    fenced("complete", store.complete(stale, &[]).await);
    fenced("fail", store.fail(stale, "late failure", &[]).await);
    fenced("extend", store.extend(stale, MINUTE).await.map(|_| ()));
    fenced("release", store.release(stale, "late release").await);
    let step = StepUpdate {
        index: 0,
        name: "reserve-inventory".into(),
        status: StepStatus::Succeeded,
        detail: None,
        idempotency_key: "late-key".into(),
        irreversible: false,
    };
    fenced(
        "record_step",
        store.record_step(stale, &step, &[]).await.map(|_| ()),
    );
    let outcome = store
        .complete_many(&[Completion::from(stale.clone())])
        .await
        .unwrap();
    assert!(outcome.completed.is_empty());
    let after = store.get(&stale.order_id).await.unwrap();
    assert_eq!(after.state, before.state, "row untouched");
    assert_eq!(after.steps, before.steps);
    assert_eq!(after.history, before.history, "nothing recorded");
}

/// Once CompleteBy passes only the supervisor may act on the order.
pub async fn owner_past_its_deadline_is_refused_and_the_row_untouched(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    ctx.clock.advance(MINUTE);
    let before = row(&*store, &id).await;
    for result in [
        store.complete(&claimed.fence, &[]).await,
        store.fail(&claimed.fence, "too late", &[]).await,
        store.extend(&claimed.fence, MINUTE).await.map(|_| ()),
    ] {
        match result {
            Err(Error::DeadlinePassed { complete_by, .. }) => {
                assert_eq!(complete_by, claimed.complete_by)
            }
            other => panic!("expected DeadlinePassed, got {other:?}"),
        }
    }
    assert_eq!(row(&*store, &id).await, before);
}

/// Batched completion: one transaction, per-order verdicts.
pub async fn complete_many_completes_what_it_owns_and_refuses_the_rest(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 5).await;
    let a = owner("a");
    let claimed = store.claim(&claim_req(&a, 5, MINUTE)).await.unwrap();
    assert_eq!(claimed.len(), 5);
    let mut fences: Vec<Fence> = claimed.iter().map(|c| c.fence.clone()).collect();
    // One fence is forged with a wrong epoch; one names an order that does not exist.
    fences[4].epoch = Epoch(99);
    fences.push(Fence {
        order_id: OrderId::parse("no-such-order").unwrap(),
        owner: a.clone(),
        epoch: Epoch(1),
    });
    fences.push(fences[0].clone()); // the same fence twice counts once
    let completions: Vec<Completion> = fences.iter().cloned().map(Completion::from).collect();
    let outcome = store.complete_many(&completions).await.unwrap();
    assert_eq!(outcome.completed.len(), 4);
    assert_eq!(outcome.refused.len(), 2);
    assert!(
        outcome
            .refused
            .iter()
            .any(|(id, e)| *id == fences[4].order_id && matches!(e, Error::Fenced { .. }))
    );
    assert!(
        outcome
            .refused
            .iter()
            .any(|(_, e)| matches!(e, Error::OrderNotFound(_)))
    );
    for id in &outcome.completed {
        let view = store.get(id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Processed);
        assert_eq!(view.state.locked_by, None);
        assert_eq!(view.state.complete_by, None);
        let last = view.history.last().unwrap();
        assert_eq!(
            (last.kind, last.actor.as_str()),
            (HistoryKind::Completed, a.as_str())
        );
    }
    assert_eq!(
        row(&*store, &fences[4].order_id).await.process_state,
        ProcessState::Processing
    );
}

/// Steps: attempts counted, current_step advanced on success, the key never changes.
pub async fn record_step_advances_the_workflow_with_a_stable_idempotency_key(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let first = claim_one(&*store, &owner("a"), MINUTE).await;
    let step = |index: i32, name: &str, status: StepStatus, detail: Option<&str>| StepUpdate {
        index,
        name: name.into(),
        status,
        detail: detail.map(str::to_owned),
        idempotency_key: idempotency_key(&id, 0, index, name),
        irreversible: false,
    };
    let s0 = store
        .record_step(
            &first.fence,
            &step(0, "reserve-inventory", StepStatus::Started, None),
            &[],
        )
        .await
        .unwrap();
    assert_eq!((s0.attempts, s0.status), (1, StepStatus::Started));
    store
        .record_step(
            &first.fence,
            &step(
                0,
                "reserve-inventory",
                StepStatus::Succeeded,
                Some("{\"hold\":\"h-1\"}"),
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row(&*store, &id).await.current_step, 1);
    let s1 = store
        .record_step(
            &first.fence,
            &step(1, "charge-payment", StepStatus::Started, None),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        s1.idempotency_key,
        idempotency_key(&id, 0, 1, "charge-payment")
    );
    store.release(&first.fence, "shutting down").await.unwrap();

    // Another scheduler resumes at step 1 with the same key; the attempt is counted.
    let second = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(second.current_step, 1, "done steps are not redone");
    let again = store
        .record_step(
            &second.fence,
            &step(1, "charge-payment", StepStatus::Started, None),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(again.idempotency_key, s1.idempotency_key);
    assert_eq!(again.attempts, 2);
    assert_eq!(again.epoch, second.fence.epoch);
    store
        .record_step(
            &second.fence,
            &step(
                1,
                "charge-payment",
                StepStatus::Failed,
                Some("card declined"),
            ),
            &[],
        )
        .await
        .unwrap();
    let view = store.get(&id).await.unwrap();
    assert_eq!(view.state.current_step, 1, "a failed step does not advance");
    assert_eq!(view.state.last_error.as_deref(), Some("card declined"));
    assert_eq!(view.steps.len(), 2);
    assert_eq!(view.steps[0].status, StepStatus::Succeeded);
    assert_eq!(view.steps[0].detail.as_deref(), Some("{\"hold\":\"h-1\"}"));
    assert_eq!(view.steps[1].status, StepStatus::Failed);
    let kinds: Vec<_> = view.history.iter().map(|h| h.kind).collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Submitted,
            HistoryKind::Claimed,
            HistoryKind::StepStarted,
            HistoryKind::StepSucceeded,
            HistoryKind::StepStarted,
            HistoryKind::Released,
            HistoryKind::Claimed,
            HistoryKind::StepStarted,
            HistoryKind::StepFailed,
        ]
    );
    assert!(
        view.history
            .windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].at <= w[1].at)
    );
}

/// A heartbeat pushes the deadline; it never pulls it in.
pub async fn extend_moves_the_deadline_forward_never_back(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    ctx.clock.advance(Duration::from_secs(50));
    let extended = store.extend(&claimed.fence, MINUTE).await.unwrap();
    assert_eq!(extended, ctx.clock.now() + chrono::Duration::seconds(60));
    let unchanged = store
        .extend(&claimed.fence, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(unchanged, extended);
    ctx.clock.advance(Duration::from_secs(30));
    assert!(
        store.find_expired(10).await.unwrap().is_empty(),
        "the original deadline has passed, the new one not"
    );
    store.complete(&claimed.fence, &[]).await.unwrap();
    assert_eq!(
        row(&*store, &id).await.process_state,
        ProcessState::Processed
    );
}

/// Release is a clean hand-back: Pending, due at once, FailureCount unchanged.
pub async fn release_hands_an_order_back_without_counting_a_failure(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    store
        .release(&claimed.fence, "graceful shutdown")
        .await
        .unwrap();
    let r = row(&*store, &id).await;
    assert_eq!(
        (r.process_state, r.failure_count, r.locked_by.clone()),
        (ProcessState::Pending, 0, None)
    );
    let again = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(again.fence.epoch, Epoch(2));
}
