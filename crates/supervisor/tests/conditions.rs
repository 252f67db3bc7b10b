//! The alerts about the system, as the leading supervisor raises them against a real
//! store and queue (SQLite) on a clock the test moves: an old Pending order and growing
//! dead letters each raise one alert per episode, to the table and the alerts queue,
//! and resolve once the condition ends.

#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use orderly_core::conditions::{ConditionKind, ConditionNotice, ConditionStore};
use orderly_core::store::ClaimRequest;
use orderly_core::store::{IntakeStore, SchedulerStore};
use orderly_core::transport::{
    OutgoingMessage, QueueInspector, QueueName, QueueSettings, Transport,
};
use orderly_core::{InstanceId, ManualClock, TimeSource};
use orderly_supervisor::{ConditionWatch, Supervisor, SupervisorConfig};

/// The notices on the alerts queue, taken off it.
async fn notices(transport: &dyn Transport) -> Vec<(String, ConditionKind, String)> {
    let q = QueueName::parse("alerts").unwrap();
    let got = transport
        .receive(&q, 100, Duration::from_millis(50))
        .await
        .unwrap();
    for m in &got {
        transport.complete(m).await.unwrap();
    }
    got.iter()
        .filter_map(|m| serde_json::from_slice::<ConditionNotice>(&m.body).ok())
        .map(|n| (n.event, n.alert.kind, n.alert.subject))
        .collect()
}

#[tokio::test]
async fn an_old_pending_order_and_new_dead_letters_each_raise_one_alert_until_they_end() {
    let clock = ManualClock::starting_now();
    let store = Arc::new(
        orderly_sql::SqliteStore::open(
            "sqlite::memory:",
            TimeSource::Clock(Arc::new(clock.clone())),
        )
        .await
        .unwrap(),
    );
    for q in ["alerts", "orders"] {
        store
            .declare_queue(&QueueName::parse(q).unwrap(), &QueueSettings::default())
            .await
            .unwrap();
    }
    let mut cfg = SupervisorConfig::new(InstanceId::parse("supervisor-1").unwrap());
    cfg.pending_alert_after = Some(Duration::from_secs(60));
    let supervisor = Supervisor::new(store.clone(), cfg)
        .unwrap()
        .with_conditions(store.clone());
    let mut watch = ConditionWatch::default();

    let order = orderly_testkit::builders::order(1);
    store
        .submit(&order, &orderly_testkit::builders::submitter(), &[])
        .await
        .unwrap();
    supervisor.check_conditions(&mut watch).await.unwrap();
    assert!(notices(store.as_ref()).await.is_empty(), "young enough");
    clock.advance(Duration::from_secs(120));
    supervisor.check_conditions(&mut watch).await.unwrap();
    supervisor.check_conditions(&mut watch).await.unwrap();
    assert_eq!(
        notices(store.as_ref()).await,
        vec![(
            "raised".to_owned(),
            ConditionKind::PendingTooOld,
            "orders".to_owned()
        )],
        "one alert however often it is looked at"
    );
    let open = store.system_alerts(true, 10).await.unwrap();
    assert_eq!(open.len(), 1);
    assert!(open[0].detail.contains(order.order_id.as_str()), "{open:?}");
    // A scheduler takes it: the condition ends.
    store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: InstanceId::parse("scheduler-1").unwrap(),
            limit: 1,
            timeout: Duration::from_secs(60),
        })
        .await
        .unwrap();
    supervisor.check_conditions(&mut watch).await.unwrap();
    assert_eq!(
        notices(store.as_ref()).await,
        vec![(
            "resolved".to_owned(),
            ConditionKind::PendingTooOld,
            "orders".to_owned()
        )]
    );
    assert!(store.system_alerts(true, 10).await.unwrap().is_empty());

    // Dead letters on the orders queue grow: one alert; cleared: resolved.
    let orders = QueueName::parse("orders").unwrap();
    for id in ["bad-1", "bad-2"] {
        store
            .send(&orders, &[OutgoingMessage::new(id, b"not json".to_vec())])
            .await
            .unwrap();
        let got = store.receive(&orders, 1, Duration::ZERO).await.unwrap();
        store
            .dead_letter(&got[0], "BodyUndecodable", "test")
            .await
            .unwrap();
        supervisor.check_conditions(&mut watch).await.unwrap();
    }
    assert_eq!(
        notices(store.as_ref()).await,
        vec![(
            "raised".to_owned(),
            ConditionKind::DeadLetters,
            "orders".to_owned()
        )]
    );
    let requeued = store.requeue_dead_letters(&orders, None).await.unwrap();
    assert_eq!(requeued, 2);
    supervisor.check_conditions(&mut watch).await.unwrap();
    assert_eq!(
        notices(store.as_ref()).await,
        vec![(
            "resolved".to_owned(),
            ConditionKind::DeadLetters,
            "orders".to_owned()
        )]
    );
}
