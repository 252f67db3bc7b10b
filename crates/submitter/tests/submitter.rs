//! The submitter's loop against a real store and queue (in-memory SQLite): orders
//! posted to the orders queue are recorded once each, a repeat is absorbed, and bad
//! messages are dead-lettered with a reason while the good ones go through.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use orderly_core::history::HistoryKind;
use orderly_core::messages::{order_submitted, queues};
use orderly_core::store::{NewOrder, StateStore};
use orderly_core::transport::{OutgoingMessage, QueueName, QueueSettings, Transport};
use orderly_core::{
    Currency, InstanceId, OrderDetails, OrderId, OrderLine, ProcessState, TimeSource,
};
use orderly_submitter::{Intake, Submitter, SubmitterConfig};

struct Rig {
    store: Arc<dyn StateStore>,
    transport: Arc<dyn Transport>,
    orders: QueueName,
    submitter: Submitter,
}

async fn rig() -> Rig {
    rig_with(SubmitterConfig::new(
        InstanceId::parse("submitter-test").unwrap(),
    ))
    .await
}

async fn rig_with(cfg: SubmitterConfig) -> Rig {
    let store = Arc::new(
        orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
            .await
            .unwrap(),
    );
    let orders = QueueName::parse(queues::ORDERS).unwrap();
    store
        .declare_queue(&orders, &QueueSettings::default())
        .await
        .unwrap();
    Rig {
        submitter: Submitter::new(store.clone(), store.clone(), cfg),
        store: store.clone(),
        transport: store,
        orders,
    }
}

fn order(id: &str, quantity: u32) -> NewOrder {
    NewOrder {
        order_id: OrderId::parse(id).unwrap(),
        details: OrderDetails::new(
            "c-1",
            Currency::parse("EUR").unwrap(),
            vec![OrderLine {
                sku: "SKU-1".into(),
                quantity,
                unit_price_minor: 1999,
            }],
        )
        .unwrap(),
        reply_to: None,
        workflow: None,
    }
}

/// Runs the loop until a pass finds nothing; the sum of what the passes did.
async fn drain(rig: &Rig) -> Intake {
    let mut total = Intake::default();
    loop {
        let pass = rig
            .submitter
            .run_once(Duration::from_millis(50))
            .await
            .unwrap();
        if pass == Intake::default() {
            return total;
        }
        total.accepted += pass.accepted;
        total.duplicates += pass.duplicates;
        total.rejected += pass.rejected;
        total.retried += pass.retried;
    }
}

#[tokio::test]
async fn posted_orders_are_recorded_once_and_bad_messages_dead_lettered_with_a_reason() {
    let rig = rig().await;
    let good: Vec<NewOrder> = (0..5).map(|i| order(&format!("o-{i}"), 1)).collect();
    let mut messages: Vec<OutgoingMessage> =
        good.iter().map(|o| order_submitted(o).unwrap()).collect();
    // Not JSON, and JSON that is no order.
    messages.push(OutgoingMessage::new("junk-1", b"not json".to_vec()));
    messages.push(OutgoingMessage::new(
        "junk-2",
        br#"{"order_id": "x"}"#.to_vec(),
    ));
    rig.transport.send(&rig.orders, &messages).await.unwrap();
    let first = drain(&rig).await;
    assert_eq!(first.accepted, 5, "{first:?}");
    assert_eq!(first.rejected, 2, "{first:?}");

    // The same order id again with a new message id (a client retry after a lost
    // answer) is absorbed; the same id with other details is refused, never applied.
    let mut again = order_submitted(&good[0]).unwrap();
    again.message_id = "retry-of-o-0".into();
    let mut other = order_submitted(&order("o-1", 7)).unwrap();
    other.message_id = "o-1-changed".into();
    rig.transport
        .send(&rig.orders, &[again, other])
        .await
        .unwrap();
    let second = drain(&rig).await;
    assert_eq!(second.accepted, 0, "{second:?}");
    assert_eq!(second.duplicates + second.rejected, 2, "{second:?}");

    for o in &good {
        let view = rig.store.get(&o.order_id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Pending);
        assert_eq!(view.details, o.details, "the first details stand");
        assert_eq!(
            view.history_count(HistoryKind::Submitted),
            1,
            "order {} recorded once",
            o.order_id
        );
    }
    let dead = rig.transport.dead_letters(&rig.orders, 100).await.unwrap();
    for id in ["junk-1", "junk-2"] {
        let d = dead.iter().find(|d| d.message.message_id == id).unwrap();
        assert!(!d.reason.is_empty() && !d.description.is_empty(), "{d:?}");
    }
    assert!(
        rig.transport
            .receive(&rig.orders, 10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
}

/// With a reply prefix set, an order naming any other queue for its notices (one that
/// exists, so the prefix is what refuses it) is dead-lettered with the reason naming
/// `reply_to` and the prefix, and no notice goes there; an order naming a client queue
/// is recorded and its `received` notice sent to it.
#[tokio::test]
async fn an_order_whose_reply_queue_is_not_a_client_queue_is_dead_lettered() {
    let mut cfg = SubmitterConfig::new(InstanceId::parse("submitter-test").unwrap());
    cfg.reply_queues =
        orderly_core::store::ReplyQueues::prefixed("client-", "ORDERLY_REPLY_TO_PREFIX").unwrap();
    let rig = rig_with(cfg).await;
    let client = QueueName::parse("client-7").unwrap();
    let billing = QueueName::parse("billing-events").unwrap();
    for q in [&client, &billing] {
        rig.transport
            .declare_queue(q, &QueueSettings::default())
            .await
            .unwrap();
    }
    let mut welcome = order("o-client", 1);
    welcome.reply_to = Some("client-7".into());
    let mut stray = order("o-stray", 1);
    stray.reply_to = Some("billing-events".into());
    rig.transport
        .send(
            &rig.orders,
            &[
                order_submitted(&welcome).unwrap(),
                order_submitted(&stray).unwrap(),
            ],
        )
        .await
        .unwrap();
    let pass = drain(&rig).await;
    assert_eq!((pass.accepted, pass.rejected), (1, 1), "{pass:?}");
    let dead = rig.transport.dead_letters(&rig.orders, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].reason, "InvalidOrder");
    assert!(
        dead[0].description.contains("reply_to") && dead[0].description.contains("client-"),
        "{}",
        dead[0].description
    );
    assert!(
        rig.store
            .get(&OrderId::parse("o-stray").unwrap())
            .await
            .is_err()
    );
    let noticed = rig
        .transport
        .receive(&billing, 10, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        noticed.is_empty(),
        "no notice to another system's queue: {noticed:?}"
    );
    let noticed = rig
        .transport
        .receive(&client, 10, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(noticed.len(), 1, "the client's received notice");
}
