//! Conformance cases for what the operators' console and the system alerts read: the
//! minute-by-minute activity, alert episodes, the oldest Pending order, the
//! supervisors' presence, and the list filters by customer and id.

use std::time::Duration;

use orderly_core::activity::{LATENCY_BOUNDS_MS, minute_of};
use orderly_core::conditions::{Condition, ConditionKind};
use orderly_core::service::{OutagePolicy, Park};
use orderly_core::store::{ClaimRequest, ClaimedOrder, Completion, OrderFilter, StateStore};
use orderly_core::{Actor, Clock, InstanceId, OrderId};

use super::{Ctx, MINUTE, owner};

async fn claim(store: &dyn StateStore, n: u32) -> Vec<ClaimedOrder> {
    store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: owner("a"),
            limit: n,
            timeout: 10 * MINUTE,
        })
        .await
        .expect("claim")
}

async fn submit(store: &dyn StateStore, n: u64) -> OrderId {
    let order = crate::builders::order(n);
    store
        .submit(&order, &crate::builders::submitter(), &[])
        .await
        .expect("submit");
    order.order_id
}

/// Orders finished in a minute are counted in that minute by outcome, the Processed
/// ones with their submit-to-Processed latency in the histogram; minutes before
/// `since`, and live orders, are not counted.
pub async fn activity_counts_each_minute_by_outcome_with_latencies(ctx: &Ctx) {
    let store = ctx.store().await;
    // An order finished long before the window.
    let old = submit(&*store, 0).await;
    store
        .cancel(&old, &Actor::operator("t"), "old", &[])
        .await
        .unwrap();
    ctx.clock.advance(Duration::from_secs(3_600));
    let since = ctx.clock.now();
    for n in 1..=5 {
        submit(&*store, n).await;
    }
    let claimed = claim(&*store, 5).await;
    assert_eq!(claimed.len(), 5);
    // Ninety seconds later: three Processed, one Error.
    ctx.clock.advance(Duration::from_secs(90));
    let first_minute = minute_of(ctx.clock.now());
    let done: Vec<Completion> = claimed[..3]
        .iter()
        .map(|c| Completion::from(c.fence.clone()))
        .collect();
    assert_eq!(store.complete_many(&done).await.unwrap().completed.len(), 3);
    store
        .fail(&claimed[3].fence, "declined", &[])
        .await
        .unwrap();
    // A minute later, the last one Processed.
    ctx.clock.advance(MINUTE);
    store
        .complete_many(&[Completion::from(claimed[4].fence.clone())])
        .await
        .unwrap();
    let minutes = store.activity(since).await.unwrap();
    assert_eq!(minutes.len(), 2, "{minutes:?}");
    let (a, b) = (&minutes[0], &minutes[1]);
    assert_eq!(a.minute, first_minute);
    assert_eq!((a.processed, a.error, a.cancelled), (3, 1, 0));
    assert_eq!((b.processed, b.error), (1, 0));
    let slot = |ms: u64| LATENCY_BOUNDS_MS.iter().position(|b| ms < *b).unwrap();
    assert_eq!(a.latency[slot(90_000)], 3, "{:?}", a.latency);
    assert_eq!(b.latency[slot(150_000)], 1, "{:?}", b.latency);
    assert_eq!(a.latency_quantile(0.5), Some(300_000));
}

/// A condition is raised once per episode (a second raise while it is open does
/// nothing) and resolved once; the next raise is a new episode.
pub async fn a_condition_is_raised_and_resolved_once_per_episode(ctx: &Ctx) {
    let store = ctx.store().await;
    let none = |_: &orderly_core::conditions::SystemAlert| Vec::new();
    let c = Condition {
        kind: ConditionKind::DeadLetters,
        subject: "orders".into(),
        detail: "3 dead letters on queue orders (was 0)".into(),
    };
    let first = store
        .raise(&c, "supervisor-1", &none)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.raised_at, ctx.clock.now());
    assert!(
        store
            .raise(&c, "supervisor-2", &none)
            .await
            .unwrap()
            .is_none()
    );
    let other = Condition {
        subject: "replies".into(),
        ..c.clone()
    };
    assert!(
        store
            .raise(&other, "supervisor-1", &none)
            .await
            .unwrap()
            .is_some()
    );
    let open = store.system_alerts(true, 10).await.unwrap();
    assert_eq!(open.len(), 2);
    assert!(open.iter().all(|a| a.acknowledged_by.is_none()));
    // Acknowledged by an operator: recorded, the first one stays, still open.
    ctx.clock.advance(Duration::from_secs(5));
    let seen = store
        .acknowledge_system_alert(first.alert_id, &orderly_core::Actor::operator("erin"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.acknowledged_by.as_deref(), Some("operator:erin"));
    assert_eq!(seen.acknowledged_at, Some(ctx.clock.now()));
    assert_eq!(seen.resolved_at, None, "acknowledged, not resolved");
    ctx.clock.advance(Duration::from_secs(5));
    let again = store
        .acknowledge_system_alert(first.alert_id, &orderly_core::Actor::operator("dan"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.acknowledged_by, again.acknowledged_at),
        (seen.acknowledged_by.clone(), seen.acknowledged_at),
        "the first acknowledgement stays"
    );
    assert!(
        store
            .acknowledge_system_alert(
                first.alert_id + 1_000,
                &orderly_core::Actor::operator("erin")
            )
            .await
            .unwrap()
            .is_none(),
        "no such episode"
    );
    assert_eq!(store.system_alerts(true, 10).await.unwrap().len(), 2);
    ctx.clock.advance(MINUTE);
    let resolved = store
        .resolve(ConditionKind::DeadLetters, "orders", &none)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resolved.alert_id, first.alert_id);
    assert_eq!(resolved.resolved_at, Some(ctx.clock.now()));
    assert_eq!(
        resolved.acknowledged_by, seen.acknowledged_by,
        "kept once resolved"
    );
    assert!(
        store
            .resolve(ConditionKind::DeadLetters, "orders", &none)
            .await
            .unwrap()
            .is_none()
    );
    let again = store
        .raise(&c, "supervisor-1", &none)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(again.alert_id, first.alert_id, "a new episode");
    assert_eq!(store.system_alerts(false, 10).await.unwrap().len(), 3);
    assert_eq!(store.system_alerts(true, 10).await.unwrap().len(), 2);
}

/// The oldest Pending order leaves out orders held for a service that is down.
pub async fn the_oldest_pending_order_leaves_out_orders_waiting_for_a_service(ctx: &Ctx) {
    let store = ctx.store().await;
    assert!(store.oldest_pending().await.unwrap().0.is_none());
    let first = submit(&*store, 1).await;
    ctx.clock.advance(Duration::from_secs(1));
    let second = submit(&*store, 2).await;
    let (oldest, now) = store.oldest_pending().await.unwrap();
    assert_eq!(oldest.map(|(id, _)| id), Some(first.clone()));
    assert_eq!(now, ctx.clock.now());
    store
        .report_failure(
            "agent.payment",
            "503",
            &InstanceId::parse("agent-1").unwrap(),
            &OutagePolicy::default(),
        )
        .await
        .unwrap();
    let claimed = claim(&*store, 1).await;
    assert_eq!(claimed[0].fence.order_id, first);
    store
        .park_many(&[Park {
            fence: claimed[0].fence.clone(),
            expect_step: Some(0),
            service: "agent.payment".into(),
            reason: "waiting".into(),
        }])
        .await
        .unwrap();
    let (oldest, _) = store.oldest_pending().await.unwrap();
    assert_eq!(oldest.map(|(id, _)| id), Some(second));
}

/// The supervisors' presence: who was seen recently, and whether each leads.
pub async fn presence_lists_the_instances_seen_recently(ctx: &Ctx) {
    let store = ctx.store().await;
    store.heartbeat("supervisor", "s-1", true).await.unwrap();
    store.heartbeat("supervisor", "s-2", false).await.unwrap();
    let (seen, _) = store
        .presence("supervisor", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        seen.iter()
            .map(|p| (p.instance.as_str(), p.leading))
            .collect::<Vec<_>>(),
        vec![("s-1", true), ("s-2", false)]
    );
    ctx.clock.advance(Duration::from_secs(20));
    store.heartbeat("supervisor", "s-2", true).await.unwrap();
    let (seen, _) = store
        .presence("supervisor", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].leading && seen[0].instance == "s-2");
    store.leave("supervisor", "s-2").await.unwrap();
    assert!(
        store
            .presence("supervisor", Duration::from_secs(10))
            .await
            .unwrap()
            .0
            .is_empty()
    );
}

/// Orders are found by customer and by the start of their id.
pub async fn orders_are_found_by_customer_and_by_id_prefix(ctx: &Ctx) {
    let store = ctx.store().await;
    let mut a = crate::builders::order_with_id("acme-1", 1);
    a.details = orderly_core::OrderDetails::new(
        "c-42",
        orderly_core::Currency::parse("EUR").unwrap(),
        a.details.lines().to_vec(),
    )
    .unwrap();
    store
        .submit(&a, &crate::builders::submitter(), &[])
        .await
        .unwrap();
    for id in ["acme-2", "other_1"] {
        let o = crate::builders::order_with_id(id, 2);
        store
            .submit(&o, &crate::builders::submitter(), &[])
            .await
            .unwrap();
    }
    let ids = |filter: OrderFilter| {
        let store = store.clone();
        async move {
            store
                .list(&filter)
                .await
                .unwrap()
                .orders
                .into_iter()
                .map(|o| o.order_id.as_str().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        ids(OrderFilter {
            customer: Some("c-42".into()),
            ..OrderFilter::default()
        })
        .await,
        vec!["acme-1"]
    );
    let mut by_prefix = ids(OrderFilter {
        id_prefix: Some("acme-".into()),
        ..OrderFilter::default()
    })
    .await;
    by_prefix.sort();
    assert_eq!(by_prefix, vec!["acme-1", "acme-2"]);
    // `_` is a character, not a wildcard.
    assert_eq!(
        ids(OrderFilter {
            id_prefix: Some("other_".into()),
            ..OrderFilter::default()
        })
        .await,
        vec!["other_1"]
    );
    assert!(
        ids(OrderFilter {
            id_prefix: Some("acme_".into()),
            ..OrderFilter::default()
        })
        .await
        .is_empty()
    );
}
