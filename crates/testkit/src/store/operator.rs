//! Conformance cases for operators: retry, cancel, the triage lists and the
//! overview's counts.

use super::{Ctx, MINUTE, claim_one, leader, owner, policy, row, submit_n};
use crate::builders;
use orderly_core::history::HistoryKind;
use orderly_core::store::OrderFilter;
use orderly_core::{Actor, Clock, Epoch, Error, ProcessState};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Operators retry an Error order: Pending, due now, a fresh failure budget, history kept.
pub async fn resubmit_sends_an_error_order_round_again_with_a_fresh_failure_budget(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    ctx.clock.advance(MINUTE + Duration::from_secs(1));
    store
        .recover_expired(&leader(&*store, 1).await, &policy(5, 1), 10)
        .await
        .unwrap();
    ctx.clock.advance(Duration::from_secs(5));
    let again = claim_one(&*store, &owner("a"), MINUTE).await;
    assert_eq!(again.failure_count, 1);
    store
        .fail(
            &again.fence,
            "payment service: card permanently declined",
            &[],
        )
        .await
        .unwrap();
    let failed = row(&*store, &id).await;
    assert_eq!(failed.process_state, ProcessState::Error);
    assert_eq!(
        failed.failure_count, 2,
        "one timeout, then one permanent failure"
    );
    assert_eq!(
        failed.last_error.as_deref(),
        Some("payment service: card permanently declined")
    );
    assert!(matches!(
        store.complete(&claimed.fence, &[]).await,
        Err(Error::Fenced { .. })
    ));

    let resubmitted = store
        .resubmit(&id, &Actor::operator("bob"), "card replaced", &[])
        .await
        .unwrap();
    assert_eq!(resubmitted.process_state, ProcessState::Pending);
    assert_eq!(resubmitted.failure_count, 0);
    assert_eq!(resubmitted.next_attempt_at, ctx.clock.now());
    let third = claim_one(&*store, &owner("b"), MINUTE).await;
    assert_eq!(third.fence.epoch, Epoch(3));
    let last = store.get(&id).await.unwrap().history;
    let r = last
        .iter()
        .find(|h| h.kind == HistoryKind::Resubmitted)
        .unwrap();
    assert_eq!(
        (r.actor.as_str(), r.reason.as_deref()),
        ("operator:bob", Some("card replaced"))
    );
    assert_eq!(
        (r.from_state, r.to_state),
        (Some(ProcessState::Error), ProcessState::Pending)
    );
}

/// Cancelling a Processing order takes it from its owner at once.
pub async fn cancel_fences_out_the_owner_and_records_who_and_why(ctx: &Ctx) {
    let store = ctx.store().await;
    let id = submit_n(&*store, 1).await.remove(0);
    let claimed = claim_one(&*store, &owner("a"), MINUTE).await;
    let cancelled = store
        .cancel(&id, &Actor::operator("carol"), "fraud suspected", &[])
        .await
        .unwrap();
    assert_eq!(cancelled.process_state, ProcessState::Cancelled);
    assert_eq!((cancelled.locked_by, cancelled.complete_by), (None, None));
    assert!(matches!(
        store.complete(&claimed.fence, &[]).await,
        Err(Error::Fenced { holder: None, .. })
    ));
    ctx.clock.advance(MINUTE * 2);
    assert!(
        store
            .recover_expired(&leader(&*store, 1).await, &policy(5, 1), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let view = store.get(&id).await.unwrap();
    let last = view.history.last().unwrap();
    assert_eq!(last.kind, HistoryKind::Cancelled);
    assert_eq!(
        (last.actor.as_str(), last.reason.as_deref()),
        ("operator:carol", Some("fraud suspected"))
    );
    assert_eq!(last.from_state, Some(ProcessState::Processing));
}

/// Triage lists: filters combine, pages follow each other with no gap and no repeat.
pub async fn list_filters_by_state_and_error_text_and_pages_without_gaps(ctx: &Ctx) {
    let store = ctx.store().await;
    let start = ctx.clock.now();
    let mut all = Vec::new();
    for i in 0..25u64 {
        let order = builders::order(i);
        store
            .submit(&order, &builders::submitter(), &[])
            .await
            .unwrap();
        all.push(order.order_id);
        if i % 4 == 0 {
            ctx.clock.advance(Duration::from_secs(1)); // several orders share a created_at
        }
    }
    let a = owner("a");
    let mut declined = HashSet::new();
    for n in 0..6 {
        let c = claim_one(&*store, &a, MINUTE).await;
        let error = if n % 2 == 0 {
            "Payment DECLINED by issuer"
        } else {
            "out of stock: 100%_sure"
        };
        store.fail(&c.fence, error, &[]).await.unwrap();
        if n % 2 == 0 {
            declined.insert(c.fence.order_id);
        }
    }
    let errors = store
        .list(&OrderFilter {
            state: Some(ProcessState::Error),
            error_contains: Some("declined".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        errors
            .orders
            .iter()
            .map(|o| o.order_id.clone())
            .collect::<HashSet<_>>(),
        declined
    );
    assert!(errors.next.is_none());
    let literal = store
        .list(&OrderFilter {
            error_contains: Some("100%_s".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(literal.orders.len(), 3, "% and _ are matched literally");
    let wildcard = store
        .list(&OrderFilter {
            error_contains: Some("1_0".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(wildcard.orders.is_empty());

    let mut paged = Vec::new();
    let mut filter = OrderFilter {
        limit: 10,
        ..Default::default()
    };
    let mut pages = 0;
    loop {
        let page = store.list(&filter).await.unwrap();
        pages += 1;
        paged.extend(page.orders.iter().map(|o| o.order_id.clone()));
        match page.next {
            Some(cursor) => filter.after = Some(cursor),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(paged.len(), 25);
    assert_eq!(
        paged.iter().collect::<HashSet<_>>(),
        all.iter().collect::<HashSet<_>>()
    );
    let pending = store
        .list(&OrderFilter {
            state: Some(ProcessState::Pending),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(pending.orders.len(), 19);
    assert!(
        pending
            .orders
            .windows(2)
            .all(|w| (w[0].created_at, &w[0].order_id) < (w[1].created_at, &w[1].order_id))
    );
    // The Pending orders page by page (read through their state's index, then sorted):
    // the same orders in the same order, none twice.
    let mut by_pages = Vec::new();
    let mut filter = OrderFilter {
        state: Some(ProcessState::Pending),
        limit: 7,
        ..Default::default()
    };
    loop {
        let page = store.list(&filter).await.unwrap();
        by_pages.extend(page.orders.iter().map(|o| o.order_id.clone()));
        match page.next {
            Some(cursor) => filter.after = Some(cursor),
            None => break,
        }
    }
    assert_eq!(
        by_pages,
        pending
            .orders
            .iter()
            .map(|o| o.order_id.clone())
            .collect::<Vec<_>>()
    );
    // A customer's orders, through the index of customers: orders 3 and 3 + 97 would
    // share one; of these 25 only order 3 is customer-3's.
    let customer = store
        .list(&OrderFilter {
            customer: Some("customer-3".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        customer
            .orders
            .iter()
            .map(|o| &o.order_id)
            .collect::<Vec<_>>(),
        vec![&all[3]]
    );
    // The oldest Pending order (the overview's), read through the same index.
    let (oldest, _) = store.oldest_pending().await.unwrap();
    assert_eq!(
        oldest.map(|(id, _)| id),
        pending.orders.first().map(|o| o.order_id.clone())
    );
    // One order was created at `start`, four a second later, four more the next second.
    let early = store
        .list(&OrderFilter {
            created_before: Some(start + chrono::Duration::seconds(2)),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(early.orders.len(), 5);
}

/// Throughput: orders that reached a final state at or after a time, by state.
pub async fn finished_since_counts_orders_that_finished_in_the_window(ctx: &Ctx) {
    let store = ctx.store().await;
    submit_n(&*store, 6).await;
    let a = owner("a");
    let early = claim_one(&*store, &a, MINUTE).await;
    store.complete(&early.fence, &[]).await.unwrap();
    ctx.clock.advance(MINUTE);
    let since = ctx.clock.now();
    for _ in 0..2 {
        let c = claim_one(&*store, &a, MINUTE).await;
        store.complete(&c.fence, &[]).await.unwrap();
    }
    let c = claim_one(&*store, &a, MINUTE).await;
    store.fail(&c.fence, "boom", &[]).await.unwrap();
    claim_one(&*store, &a, MINUTE).await;
    let finished = async |since| -> HashMap<ProcessState, i64> {
        store
            .finished_since(since)
            .await
            .unwrap()
            .into_iter()
            .collect()
    };
    let counts = finished(since).await;
    assert_eq!(counts.len(), 3, "every final state is listed, zero or not");
    assert_eq!(
        counts[&ProcessState::Processed],
        2,
        "the one before the window is not counted"
    );
    assert_eq!(counts[&ProcessState::Error], 1);
    assert_eq!(counts[&ProcessState::Cancelled], 0);
    let all = finished(since - chrono::Duration::minutes(2)).await;
    assert_eq!(all[&ProcessState::Processed], 3);
    // An Error order sent round again is no longer finished.
    store
        .resubmit(&c.fence.order_id, &Actor::operator("dan"), "retry", &[])
        .await
        .unwrap();
    assert_eq!(finished(since).await[&ProcessState::Error], 0);
    assert!(
        finished(ctx.clock.now() + chrono::Duration::seconds(1))
            .await
            .values()
            .all(|n| *n == 0)
    );
}

/// The overview counts.
pub async fn count_by_state_counts_every_state(ctx: &Ctx) {
    let store = ctx.store().await;
    let ids = submit_n(&*store, 6).await;
    let a = owner("a");
    let c1 = claim_one(&*store, &a, MINUTE).await;
    store.complete(&c1.fence, &[]).await.unwrap();
    let c2 = claim_one(&*store, &a, MINUTE).await;
    store.fail(&c2.fence, "boom", &[]).await.unwrap();
    let pending = ids
        .iter()
        .find(|id| **id != c1.fence.order_id && **id != c2.fence.order_id)
        .unwrap();
    store
        .cancel(pending, &Actor::operator("dan"), "duplicate order", &[])
        .await
        .unwrap();
    claim_one(&*store, &a, MINUTE).await;
    let counts: HashMap<_, _> = store.count_by_state().await.unwrap().into_iter().collect();
    assert_eq!(counts.len(), 5, "every state is listed, zero or not");
    assert_eq!(counts[&ProcessState::Processed], 1);
    assert_eq!(counts[&ProcessState::Error], 1);
    assert_eq!(counts[&ProcessState::Processing], 1);
    assert_eq!(counts[&ProcessState::Cancelled], 1);
    assert_eq!(counts[&ProcessState::Pending], 2);
}

/// The console's error groups from the store's index of causes: Error orders whose
/// errors differ only in ids and numbers share a cause; an order retried leaves its
/// cause, and one in Error again counts under its new cause; a cause's orders come
/// oldest first, and the steps of many orders are read at once.
pub async fn error_causes_group_error_orders_and_follow_them_as_they_change(ctx: &Ctx) {
    let store = ctx.store().await;
    assert!(store.error_causes().await.unwrap().is_empty());
    let ids = submit_n(&*store, 5).await;
    let a = owner("a");
    let mut failed = Vec::new();
    for n in 0..5 {
        let c = claim_one(&*store, &a, MINUTE).await;
        let error = if n < 3 {
            format!(
                "payment declined for order {} (attempt {n})",
                c.fence.order_id
            )
        } else {
            format!("stock service: HTTP 503 after {n}00 ms")
        };
        store.fail(&c.fence, &error, &[]).await.unwrap();
        failed.push(c.fence.order_id);
        ctx.clock.advance(Duration::from_secs(1));
    }
    let causes = store.error_causes().await.unwrap();
    let counts: Vec<(String, u64)> = causes
        .iter()
        .map(|c| (c.key.pattern.clone(), c.count))
        .collect();
    assert_eq!(
        counts,
        vec![
            ("payment declined for order # (attempt #)".to_owned(), 3),
            ("stock service: HTTP # after # ms".to_owned(), 2),
        ]
    );
    let declined = &causes[0];
    assert!(failed[..3].contains(&declined.sample));
    assert!(declined.example.starts_with("payment declined for order "));
    assert!(declined.first_seen <= declined.last_seen);
    assert_eq!(
        declined.key.group_key().workflow,
        row(&*store, &failed[0]).await.workflow_label()
    );
    let rows = store.error_cause_orders(&declined.key, 100).await.unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r.order_id.clone())
            .collect::<HashSet<_>>(),
        failed[..3].iter().cloned().collect::<HashSet<_>>()
    );
    assert!(
        rows.windows(2).all(|w| w[0].created_at <= w[1].created_at),
        "oldest first"
    );
    assert_eq!(
        store
            .error_cause_orders(&declined.key, 2)
            .await
            .unwrap()
            .len(),
        2
    );
    // Every cause's ids at once: each cause's orders in the same order, up to the limit.
    let causes = store.error_causes().await.unwrap();
    let keys: Vec<_> = causes.iter().map(|c| c.key.clone()).collect();
    for limit in [100, 2] {
        let ids = store.error_cause_ids(&keys, limit).await.unwrap();
        assert_eq!(ids.len(), keys.len());
        for (key, ids) in keys.iter().zip(&ids) {
            let rows = store.error_cause_orders(key, limit).await.unwrap();
            assert_eq!(
                *ids,
                rows.into_iter().map(|r| r.order_id).collect::<Vec<_>>(),
                "{key:?} up to {limit}"
            );
        }
    }
    assert_eq!(
        store.error_cause_ids(&keys, 2).await.unwrap()[0].len(),
        2,
        "the largest cause, cut at the limit"
    );

    // Retried: it leaves its cause. In Error again, it counts under the new one.
    store
        .resubmit(&failed[0], &Actor::operator("erin"), "card replaced", &[])
        .await
        .unwrap();
    let counts = |causes: Vec<orderly_core::triage::ErrorCause>| {
        causes
            .into_iter()
            .map(|c| (c.key.pattern, c.count))
            .collect::<HashMap<_, _>>()
    };
    let now = counts(store.error_causes().await.unwrap());
    assert_eq!(now["payment declined for order # (attempt #)"], 2);
    ctx.clock.advance(Duration::from_secs(1));
    let again = claim_one(&*store, &a, MINUTE).await;
    assert_eq!(again.fence.order_id, failed[0]);
    store
        .fail(&again.fence, "stock service: HTTP 503 after 900 ms", &[])
        .await
        .unwrap();
    let now = counts(store.error_causes().await.unwrap());
    assert_eq!(now["payment declined for order # (attempt #)"], 2);
    assert_eq!(now["stock service: HTTP # after # ms"], 3);

    // Cancelled: it leaves the causes.
    store
        .cancel(&failed[4], &Actor::operator("erin"), "not wanted", &[])
        .await
        .unwrap();
    let now = counts(store.error_causes().await.unwrap());
    assert_eq!(now["stock service: HTTP # after # ms"], 2);

    let steps = store.steps_of_many(&ids).await.unwrap();
    for id in &ids {
        assert_eq!(
            steps.get(id),
            Some(&store.steps(id).await.unwrap()).filter(|s| !s.is_empty())
        );
    }
}
