//! Conformance cases for timed-out orders: what a sweep finds, concurrent
//! recoverers counting each expiry once, back-off, and the state machine's refusals.

use super::{Ctx, MINUTE, claim_one, claim_req, leader, owner, policy, row, submit_n};
use orderly_core::history::HistoryKind;
use orderly_core::store::RecoveryOutcome;
use orderly_core::{Actor, Clock, Error, OrderId, ProcessState, StateRow};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The sweep query sees exactly the Processing rows whose deadline is behind.
pub async fn find_expired_lists_only_overdue_processing_orders_most_overdue_first(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 4).await;
    let a = owner("a");
    let c10 = claim_one(&*store, &a, Duration::from_secs(10)).await;
    let c20 = claim_one(&*store, &a, Duration::from_secs(20)).await;
    let c30 = claim_one(&*store, &a, Duration::from_secs(30)).await;
    ctx.clock.advance(Duration::from_secs(25));
    let expired = store.find_expired(10).await.unwrap();
    let ids: Vec<_> = expired.iter().map(|e| e.order_id.clone()).collect();
    assert_eq!(
        ids,
        [c10.fence.order_id.clone(), c20.fence.order_id.clone()]
    );
    assert_eq!(expired[0].locked_by, a.as_str());
    assert_eq!(expired[0].lock_epoch, c10.fence.epoch);
    assert_eq!(expired[0].complete_by, c10.complete_by);
    assert_eq!(store.find_expired(1).await.unwrap().len(), 1);
    assert!(!ids.contains(&c30.fence.order_id));
}

/// Invariant 5: several supervisors, each expiry counted exactly once, Error at the
/// threshold and never beyond.
pub async fn three_concurrent_recoverers_count_each_expiry_once_and_stop_at_the_threshold(
    ctx: &Ctx,
) {
    let store = ctx.store().await;
    let ids: HashSet<OrderId> = submit_n(&*store, 40).await.into_iter().collect();
    let handles = [ctx.store().await, ctx.store().await, ctx.store().await];
    let max = 3;
    for round in 1..=max {
        let claimed = store
            .claim(&claim_req(&owner("a"), 100, MINUTE))
            .await
            .unwrap();
        assert_eq!(
            claimed.len(),
            40,
            "round {round}: every order claimable again"
        );
        ctx.clock.advance(MINUTE + Duration::from_secs(1));
        // Overlapping sweeps of one leader (a slow sweep and the next tick's): the
        // store still counts each expiry once.
        let term = leader(&*store, 0).await;
        let mut tasks = Vec::new();
        for handle in &handles {
            let (handle, term) = (handle.clone(), term.clone());
            tasks.push(tokio::spawn(async move {
                let mut all = Vec::new();
                loop {
                    let batch = handle
                        .recover_expired(&term, &policy(max, 1), 7)
                        .await
                        .unwrap();
                    if batch.is_empty() {
                        break all;
                    }
                    all.extend(batch);
                }
            }));
        }
        let mut seen: HashMap<OrderId, RecoveryOutcome> = HashMap::new();
        for t in tasks {
            for r in t.await.unwrap() {
                let dup = seen.insert(r.order_id().clone(), r);
                assert!(
                    dup.is_none(),
                    "round {round}: one expiry recovered twice: {dup:?}"
                );
            }
        }
        assert_eq!(seen.keys().cloned().collect::<HashSet<_>>(), ids);
        for id in &ids {
            let r = row(&*store, id).await;
            assert_eq!(
                r.failure_count, round,
                "round {round}: counted exactly once"
            );
            let expected = if round < max {
                ProcessState::Pending
            } else {
                ProcessState::Error
            };
            assert_eq!(r.process_state, expected);
            assert_eq!(r.locked_by, None);
            match &seen[id] {
                RecoveryOutcome::Retried { failure_count, .. } => {
                    assert!(round < max && *failure_count == round)
                }
                RecoveryOutcome::GaveUp { failure_count, .. } => {
                    assert!(round == max && *failure_count == max)
                }
                RecoveryOutcome::Undoing { .. } => panic!("no step was started: nothing to undo"),
                RecoveryOutcome::Waiting { .. } => panic!("no service is down: nothing waits"),
            }
        }
        ctx.clock.advance(Duration::from_secs(300));
    }
    // Beyond the threshold nothing moves: Error orders are neither claimable nor recovered.
    assert!(
        store
            .claim(&claim_req(&owner("a"), 100, MINUTE))
            .await
            .unwrap()
            .is_empty()
    );
    ctx.clock.advance(Duration::from_secs(3600));
    assert!(
        store
            .recover_expired(&leader(&*store, 0).await, &policy(max, 1), 100)
            .await
            .unwrap()
            .is_empty()
    );
    let sample = ids.iter().next().unwrap();
    let view = store.get(sample).await.unwrap();
    assert_eq!(view.state.failure_count, max);
    assert!(
        view.state
            .last_error
            .as_deref()
            .unwrap()
            .contains("deadline passed")
    );
    let kinds: Vec<_> = view
        .history
        .iter()
        .map(|h| h.kind)
        .filter(|k| *k != HistoryKind::Claimed)
        .collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Submitted,
            HistoryKind::Recovered,
            HistoryKind::Recovered,
            HistoryKind::GaveUp
        ]
    );
}

/// Back-off: a recovered order waits base * 2^(failures - 1) before it can be claimed.
pub async fn recovered_order_is_not_claimable_before_its_next_attempt_time(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let a = owner("a");
    let p = policy(5, 10);
    let mut expected_wait = 10;
    for failures in 1..=2 {
        claim_one(&*store, &a, MINUTE).await;
        ctx.clock.advance(MINUTE + Duration::from_secs(1));
        let recovered = store
            .recover_expired(&leader(&*store, 1).await, &p, 10)
            .await
            .unwrap();
        let now = ctx.clock.now();
        match &recovered[..] {
            [
                RecoveryOutcome::Retried {
                    failure_count,
                    next_attempt_at,
                    ..
                },
            ] => {
                assert_eq!(*failure_count, failures);
                assert_eq!(
                    *next_attempt_at,
                    now + chrono::Duration::seconds(expected_wait)
                );
            }
            other => panic!("expected one retry, got {other:?}"),
        }
        assert_eq!(
            row(&*store, &id).await.next_attempt_at,
            now + chrono::Duration::seconds(expected_wait)
        );
        assert!(
            store
                .claim(&claim_req(&a, 10, MINUTE))
                .await
                .unwrap()
                .is_empty(),
            "not due yet"
        );
        ctx.clock
            .advance(Duration::from_secs(expected_wait as u64 - 1));
        assert!(
            store
                .claim(&claim_req(&a, 10, MINUTE))
                .await
                .unwrap()
                .is_empty(),
            "one second early"
        );
        ctx.clock.advance(Duration::from_secs(1));
        let due = store.claim(&claim_req(&a, 10, MINUTE)).await.unwrap();
        assert_eq!(due.len(), 1, "due exactly at its next attempt time");
        store.release(&due[0].fence, "test").await.unwrap();
        expected_wait *= 2;
    }
}

/// The state machine is enforced by the store, with typed errors.
pub async fn illegal_transitions_are_refused_with_a_typed_error(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 2).await;
    let alice = Actor::operator("alice");
    let illegal = |r: Result<StateRow, Error>, from: ProcessState, to: ProcessState| match r {
        Err(Error::IllegalTransition { from: f, to: t, .. }) => assert_eq!((f, t), (from, to)),
        other => panic!("expected IllegalTransition {from} -> {to}, got {other:?}"),
    };
    illegal(
        store.resubmit(&ids[0], &alice, "why not", &[]).await,
        ProcessState::Pending,
        ProcessState::Pending,
    );
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    store.complete(&claimed.fence, &[]).await.unwrap();
    let done = &claimed.fence.order_id;
    let before = store.get(done).await.unwrap();
    illegal(
        store.resubmit(done, &alice, "again", &[]).await,
        ProcessState::Processed,
        ProcessState::Pending,
    );
    illegal(
        store.cancel(done, &alice, "oops", &[]).await,
        ProcessState::Processed,
        ProcessState::Cancelled,
    );
    assert!(matches!(
        store.complete(&claimed.fence, &[]).await,
        Err(Error::Fenced {
            state: ProcessState::Processed,
            ..
        })
    ));
    let after = store.get(done).await.unwrap();
    assert_eq!(
        (after.state, after.history.len()),
        (before.state, before.history.len())
    );

    let other = ids.iter().find(|id| *id != done).unwrap();
    store
        .cancel(other, &alice, "customer asked", &[])
        .await
        .unwrap();
    illegal(
        store.resubmit(other, &alice, "undo", &[]).await,
        ProcessState::Cancelled,
        ProcessState::Pending,
    );
    illegal(
        store.cancel(other, &alice, "twice", &[]).await,
        ProcessState::Cancelled,
        ProcessState::Cancelled,
    );
    let missing = OrderId::parse("missing").unwrap();
    assert!(matches!(
        store.get(&missing).await,
        Err(Error::OrderNotFound(_))
    ));
    assert!(matches!(
        store.cancel(&missing, &alice, "x", &[]).await,
        Err(Error::OrderNotFound(_))
    ));
}

/// `sweep_due` tells exactly what a sweep would find: an order past its deadline (as
/// `find_expired`), an alert not yet published, an outage's start or end not yet
/// announced; and nothing on a store with none of them, where the sweep then begins
/// no transaction.
pub async fn sweep_due_tells_what_a_sweep_would_find(ctx: &Ctx) {
    use orderly_core::service::OutagePolicy;
    use orderly_core::store::SweepDue;
    let store = ctx.store().await;
    let none = SweepDue {
        expired: false,
        alerts: false,
        outages: false,
    };
    assert_eq!(store.sweep_due().await.unwrap(), none, "an empty store");

    // An order in work: due once its deadline is behind, as the sweep finds it.
    submit_n(&*store, 1).await;
    let claimed = claim_one(&*store, &owner("a"), Duration::from_secs(10)).await;
    ctx.clock.advance(Duration::from_secs(9));
    assert_eq!(
        store.sweep_due().await.unwrap(),
        none,
        "its deadline is ahead"
    );
    assert!(store.find_expired(1).await.unwrap().is_empty());
    ctx.clock.advance(Duration::from_secs(2));
    let due = store.sweep_due().await.unwrap();
    assert!(due.expired && !due.alerts && !due.outages, "{due:?}");
    assert_eq!(store.find_expired(1).await.unwrap().len(), 1);

    // Recovered into Error: no longer expired, its alert due until published.
    let term = leader(&*store, 1).await;
    store
        .recover_expired(&term, &policy(1, 1), 10)
        .await
        .unwrap();
    assert_eq!(
        row(&*store, &claimed.fence.order_id).await.process_state,
        ProcessState::Error
    );
    let due = store.sweep_due().await.unwrap();
    assert!(!due.expired && due.alerts && !due.outages, "{due:?}");
    let ids: Vec<i64> = store
        .unpublished_alerts(10)
        .await
        .unwrap()
        .iter()
        .map(|a| a.alert_id)
        .collect();
    store.mark_alerts_published(&term, &ids, &[]).await.unwrap();
    assert_eq!(
        store.sweep_due().await.unwrap(),
        none,
        "the alert published"
    );

    // An outage: its start due until announced, then its end once the service is up.
    let agent = orderly_core::InstanceId::parse("agent-1").unwrap();
    store
        .report_failure("agent.payment", "503", &agent, &OutagePolicy::default())
        .await
        .unwrap();
    let due = store.sweep_due().await.unwrap();
    assert!(!due.expired && !due.alerts && due.outages, "{due:?}");
    assert!(
        store
            .mark_outage_published(&term, "agent.payment", 1, false, &[])
            .await
            .unwrap()
    );
    assert_eq!(
        store.sweep_due().await.unwrap(),
        none,
        "the start announced"
    );
    store
        .report_success("agent.payment", "agent-1")
        .await
        .unwrap();
    let due = store.sweep_due().await.unwrap();
    assert!(!due.expired && !due.alerts && due.outages, "{due:?}");
    store
        .mark_outage_published(&term, "agent.payment", 1, true, &[])
        .await
        .unwrap();
    assert_eq!(store.sweep_due().await.unwrap(), none, "the end announced");
}
