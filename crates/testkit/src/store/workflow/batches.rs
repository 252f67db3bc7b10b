//! Conformance cases for batches and waits: a batch of orders judged one by one, a
//! waiting claimer woken at once, and what an owner holds.

use super::{Ctx, MINUTE, claim_one, owner, row, submit_n};
use orderly_core::history::HistoryKind;
use orderly_core::{Error, ProcessState};
use std::sync::Arc;
use std::time::Duration;

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
