//! A state change and the messages it causes commit together or not at all: the SQL
//! store enqueues them on its own queue tables inside the same transaction.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::store::{ClaimRequest, Completion, StateStore, StepUpdate, SubmitOutcome};
use orderly_core::transport::{
    Envelope, OutgoingMessage, QueueName, QueueSettings, Transport, TransportError,
};
use orderly_core::{Error, InstanceId, StepStatus, TimeSource};
use orderly_sql::SqliteStore;
use orderly_testkit::builders;
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{pg_factory, sqlite_factory};

trait StoreAndQueue: StateStore + Transport {}
impl<T: StateStore + Transport> StoreAndQueue for T {}

fn envelope(queue: &str, id: &str) -> Envelope {
    Envelope {
        queue: QueueName::parse(queue).unwrap(),
        message: OutgoingMessage::new(id, b"{}".to_vec()),
    }
}

async fn queued(t: &dyn StoreAndQueue, queue: &str) -> Vec<String> {
    let q = QueueName::parse(queue).unwrap();
    let got = t.receive(&q, 100, Duration::ZERO).await.unwrap();
    for m in &got {
        t.abandon(m).await.unwrap();
    }
    got.into_iter().map(|m| m.message_id).collect()
}

async fn check_all(s: Arc<dyn StoreAndQueue>) {
    for q in ["agent-inventory", "client-replies", "alerts"] {
        s.declare_queue(&QueueName::parse(q).unwrap(), &QueueSettings::default())
            .await
            .unwrap();
    }
    let owner = InstanceId::parse("scheduler-a").unwrap();

    // A duplicate submit sends nothing; a new one sends its notification.
    let order = builders::order(1);
    let received = [envelope("client-replies", "received-1")];
    assert_eq!(
        s.submit(&order, &builders::submitter(), &received)
            .await
            .unwrap(),
        SubmitOutcome::Accepted
    );
    let again = [envelope("client-replies", "received-1-again")];
    assert_eq!(
        s.submit(&order, &builders::submitter(), &again)
            .await
            .unwrap(),
        SubmitOutcome::Duplicate
    );
    assert_eq!(queued(&*s, "client-replies").await, ["received-1"]);

    // A step and its request commit together.
    let claimed = s
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: owner.clone(),
            limit: 1,
            timeout: Duration::from_secs(60),
        })
        .await
        .unwrap()
        .remove(0);
    let start = StepUpdate {
        index: 0,
        name: "reserve-inventory".into(),
        status: StepStatus::Started,
        detail: None,
        idempotency_key: "test-key".into(),
        irreversible: false,
    };
    s.record_step(
        &claimed.fence,
        &start,
        &[envelope("agent-inventory", "step-0")],
    )
    .await
    .unwrap();
    assert_eq!(queued(&*s, "agent-inventory").await, ["step-0"]);

    // Half-way failure: the first message is written, the second cannot be; neither the
    // step nor the first message survives.
    let before = s.get(&order.order_id).await.unwrap();
    let done = StepUpdate {
        index: 0,
        name: "reserve-inventory".into(),
        status: StepStatus::Succeeded,
        detail: None,
        idempotency_key: "test-key".into(),
        irreversible: false,
    };
    let sends = [
        envelope("agent-inventory", "step-1"),
        envelope("no-such-queue", "lost"),
    ];
    match s.record_step(&claimed.fence, &done, &sends).await {
        Err(Error::Send(inner)) => assert!(matches!(*inner, TransportError::QueueNotFound(_))),
        other => panic!("expected a Send error, got {other:?}"),
    }
    let after = s.get(&order.order_id).await.unwrap();
    assert_eq!(
        after.state, before.state,
        "the state change was rolled back"
    );
    assert_eq!(after.steps, before.steps);
    assert_eq!(after.history.len(), before.history.len());
    assert_eq!(
        queued(&*s, "agent-inventory").await,
        ["step-0"],
        "the first message was rolled back too"
    );

    // A completion that is refused sends nothing; the one that completes sends its own.
    let second = builders::order(2);
    s.submit(&second, &builders::submitter(), &[])
        .await
        .unwrap();
    let other = s
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: owner.clone(),
            limit: 1,
            timeout: Duration::from_secs(60),
        })
        .await
        .unwrap()
        .remove(0);
    let mut stale = other.fence.clone();
    stale.epoch.0 += 7;
    let outcome = s
        .complete_many(&[
            Completion {
                fence: claimed.fence.clone(),
                sends: vec![envelope("client-replies", "completed-1")],
            },
            Completion {
                fence: stale,
                sends: vec![envelope("client-replies", "completed-2")],
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        outcome.completed,
        std::slice::from_ref(&claimed.fence.order_id)
    );
    assert_eq!(outcome.refused.len(), 1);
    let mut replies = queued(&*s, "client-replies").await;
    replies.sort();
    assert_eq!(replies, ["completed-1", "received-1"]);
    let history = s.get(&claimed.fence.order_id).await.unwrap().history;
    assert_eq!(history.last().unwrap().kind, HistoryKind::Completed);

    // Alerts are published in the fenced transaction that marks them: a deposed
    // leader's publication sends nothing; the current leader's sends them with it.
    s.fail(&other.fence, "declined", &[]).await.unwrap();
    let alert_ids: Vec<i64> = s
        .unpublished_alerts(10)
        .await
        .unwrap()
        .iter()
        .map(|a| a.alert_id)
        .collect();
    assert_eq!(alert_ids.len(), 1);
    let old = s
        .begin_term("supervisor", &InstanceId::parse("supervisor-1").unwrap())
        .await
        .unwrap();
    let new = s
        .begin_term("supervisor", &InstanceId::parse("supervisor-2").unwrap())
        .await
        .unwrap();
    let alert = [envelope("alerts", "alert:1")];
    assert!(matches!(
        s.mark_alerts_published(&old, &alert_ids, &alert).await,
        Err(Error::Deposed { .. })
    ));
    assert!(
        queued(&*s, "alerts").await.is_empty(),
        "a deposed leader published nothing"
    );
    assert_eq!(s.unpublished_alerts(10).await.unwrap().len(), 1);
    assert_eq!(
        s.mark_alerts_published(&new, &alert_ids, &alert)
            .await
            .unwrap(),
        alert_ids
    );
    assert_eq!(queued(&*s, "alerts").await, ["alert:1"]);
    assert!(s.unpublished_alerts(10).await.unwrap().is_empty());

    // An operator's cancel of an order that never ran cancels it at once and tells the
    // client's queue in the same transaction; a client queue that does not exist does
    // not hold up the cancel.
    for (n, reply_to) in [(3, "client-replies"), (4, "no-such-queue")] {
        let mut order = builders::order(n);
        order.reply_to = Some(reply_to.into());
        s.submit(&order, &builders::submitter(), &[]).await.unwrap();
        let row = s
            .request_cancel(
                &order.order_id,
                &orderly_core::Actor::operator("op"),
                "changed mind",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.process_state, orderly_core::ProcessState::Cancelled);
    }
    let notices = queued(&*s, "client-replies").await;
    assert!(
        notices.iter().any(|id| id.contains(":cancelled:")),
        "{notices:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_state_changes_and_their_messages_commit_together() {
    let f = sqlite_factory(TimeSource::Database);
    let store = SqliteStore::open(&f.url(), TimeSource::Database)
        .await
        .unwrap();
    check_all(Arc::new(store)).await;
    StoreFactory::cleanup(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_state_changes_and_their_messages_commit_together() {
    let f = pg_factory(TimeSource::Database).await;
    check_all(Arc::new(f.store().await)).await;
    StoreFactory::cleanup(&f).await;
}
