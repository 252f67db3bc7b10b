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

/// A supervisor that runs but cannot lead (another holds the lease and never shows up)
/// raises "no leader" once a lease has passed without any supervisor leading; once it
/// takes over, its first look resolves it. Presence says who runs and who leads.
#[tokio::test]
async fn a_follower_that_sees_no_leader_for_a_lease_raises_it_and_the_next_leader_resolves_it() {
    use orderly_core::leader::{ElectorTiming, LeadershipStore};
    let path = std::env::temp_dir().join(format!("orderly-noleader-{}.db", std::process::id()));
    let url = format!("sqlite://{}", path.display());
    let store = Arc::new(
        orderly_sql::SqliteStore::open(&url, TimeSource::Database)
            .await
            .unwrap(),
    );
    store
        .declare_queue(
            &QueueName::parse("alerts").unwrap(),
            &QueueSettings::default(),
        )
        .await
        .unwrap();
    // A holder that never runs: its lease lasts 4 s.
    let ghost = InstanceId::parse("ghost").unwrap();
    let held = store
        .acquire_lease(
            orderly_supervisor::LEADERSHIP,
            &ghost,
            Duration::from_secs(4),
        )
        .await
        .unwrap()
        .unwrap();
    let timing = ElectorTiming {
        lease: Duration::from_secs(1),
        renew_interval: Duration::from_millis(200),
        renew_retry: Duration::from_millis(100),
        renew_deadline: Duration::from_millis(600),
        retry: Duration::from_millis(200),
        retry_jitter: 0.0,
        call_timeout: Duration::from_millis(300),
        stop_grace: Duration::from_millis(300),
        heartbeat_timeout: Duration::from_millis(500),
    };
    let me = InstanceId::parse("supervisor-1").unwrap();
    let mut cfg = SupervisorConfig::new(me.clone());
    cfg.presence_every = Duration::from_millis(100);
    cfg.conditions_every = Duration::from_millis(100);
    let elector = orderly_supervisor::sql_elector(store.clone(), me, timing).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(
        Supervisor::new(store.clone(), cfg)
            .unwrap()
            .with_conditions(store.clone())
            .run(Arc::new(elector), shutdown.clone()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let open = store.system_alerts(true, 10).await.unwrap();
        if open.iter().any(|a| a.kind == ConditionKind::NoLeader) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader raised");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (present, _) = store
        .presence(orderly_supervisor::LEADERSHIP, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(present.len(), 1);
    assert!(!present[0].leading);
    // The ghost's lease runs out; this supervisor leads and resolves it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let all = store.system_alerts(false, 10).await.unwrap();
        let no_leader: Vec<_> = all
            .iter()
            .filter(|a| a.kind == ConditionKind::NoLeader)
            .collect();
        assert_eq!(no_leader.len(), 1, "one episode: {all:?}");
        if no_leader[0].resolved_at.is_some() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not resolved");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = held;
    shutdown.cancel();
    run.await.unwrap();
    // Stopped cleanly: it is no longer present.
    assert!(
        store
            .presence(orderly_supervisor::LEADERSHIP, Duration::from_secs(60))
            .await
            .unwrap()
            .0
            .is_empty()
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
