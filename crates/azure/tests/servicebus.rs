//! The transport conformance suite through the Service Bus adapter, on the wire: each
//! test starts its own Service Bus STAND-IN (tests/servicebus-standin, a small AMQP 1.0
//! broker for tests; no Service Bus emulator runs on our CI machines) on a loopback
//! address of its own, moves its clock with the test's manual clock, and declares
//! queues through its control endpoint. The same suite runs against the SQL queue.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use async_trait::async_trait;
use orderly_azure::{QueueAdmin, ServiceBusSettings, ServiceBusTransport};
use orderly_core::ManualClock;
use orderly_core::transport::{QueueName, QueueSettings, Transport, TransportError};
use orderly_testkit::servicebus_standin::{Standin, post, post_for_body};
use orderly_testkit::transport::{TransportCtx, TransportFactory};

struct StandinAdmin(u16);

#[async_trait]
impl QueueAdmin for StandinAdmin {
    async fn declare(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        let body = serde_json::json!({
            "lock_ms": settings.lock_duration.as_millis() as u64,
            "max_delivery_count": settings.max_delivery_count,
            "dedup_ms": settings.duplicate_detection_window.as_millis() as u64,
        })
        .to_string();
        post(self.0, &format!("/queues/{}", queue.as_str()), &body)
            .map_err(|e| TransportError::Unavailable(e.into()))
    }

    async fn ensure(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError> {
        let body = serde_json::json!({
            "lock_ms": settings.lock_duration.as_millis() as u64,
            "max_delivery_count": settings.max_delivery_count,
            "dedup_ms": settings.duplicate_detection_window.as_millis() as u64,
        })
        .to_string();
        let answer = post_for_body(
            self.0,
            &format!("/queues/{}?if-missing", queue.as_str()),
            &body,
        )
        .map_err(|e| TransportError::Unavailable(e.into()))?;
        Ok(answer.contains("\"created\":true"))
    }
}

struct ServiceBusFactory {
    standin: Arc<Standin>,
    clock: ManualClock,
}

#[async_trait]
impl TransportFactory for ServiceBusFactory {
    async fn open(&self) -> Arc<dyn Transport> {
        let mut settings = ServiceBusSettings::new(self.standin.connection_string());
        settings.unsecured = true;
        settings.try_timeout = std::time::Duration::from_secs(5);
        let admin = Arc::new(StandinAdmin(self.standin.control));
        Arc::new(
            ServiceBusTransport::connect(&settings, admin, Arc::new(self.clock.clone()))
                .await
                .expect("connect to the stand-in"),
        )
    }
}

async fn servicebus() -> TransportCtx {
    let standin = Arc::new(Standin::start());
    let clock = ManualClock::starting_now();
    let port = standin.control;
    clock.on_change(move |t| {
        // The client writes settlements after `complete` has returned; let those in
        // flight reach the stand-in before its clock jumps and expires their locks.
        std::thread::sleep(std::time::Duration::from_millis(50));
        post(
            port,
            "/clock",
            &format!("{{\"now_ms\":{}}}", t.timestamp_millis()),
        )
        .expect("set the stand-in's clock")
    });
    TransportCtx {
        clock: clock.clone(),
        factory: Box::new(ServiceBusFactory { standin, clock }),
    }
}

mod servicebus_transport {
    orderly_testkit::transport_conformance!(crate::servicebus);
}

/// The path a production deployment takes: a state change writes its message to the
/// SQL store's outbox in its own transaction; the relay publishes it to Service Bus;
/// a consumer there receives it once, even when the relay publishes it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outbox_messages_reach_service_bus_through_the_relay_once() {
    use orderly_core::store::{IntakeStore, SubmitOutcome};
    use orderly_core::transport::{Envelope, Outbox, OutgoingMessage};
    use orderly_core::{InstanceId, TimeSource};
    use orderly_sql::{Delivery, SqliteStore};

    let standin = Arc::new(Standin::start());
    let clock = ManualClock::starting_now();
    let servicebus = ServiceBusFactory {
        standin: standin.clone(),
        clock: clock.clone(),
    }
    .open()
    .await;
    let replies = QueueName::parse("client-replies").unwrap();
    servicebus
        .declare_queue(&replies, &QueueSettings::default())
        .await
        .unwrap();

    let file = std::env::temp_dir().join(format!(
        "orderly-relay-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let url = format!("sqlite://{}", file.display());
    let store = SqliteStore::open(&url, TimeSource::Database)
        .await
        .unwrap()
        .with_delivery(Delivery::Outbox);
    let order = orderly_testkit::builders::order(1);
    let sends = [Envelope {
        queue: replies.clone(),
        message: OutgoingMessage::new("received-1", br#"{"status":"received"}"#.to_vec()),
    }];
    let outcome = store
        .submit(&order, &orderly_testkit::builders::submitter(), &sends)
        .await
        .unwrap();
    assert_eq!(outcome, SubmitOutcome::Accepted);
    assert_eq!(store.outbox_backlog().await.unwrap(), 1);

    let relay = InstanceId::parse("relay-1").unwrap();
    assert_eq!(
        store
            .relay_once(&relay, &*servicebus, 10)
            .await
            .unwrap()
            .sent,
        1
    );
    assert_eq!(store.outbox_backlog().await.unwrap(), 0);
    // The mark was lost (say the relay crashed after publishing): it publishes again,
    // and Service Bus drops the repeat by message id.
    sqlx::query("UPDATE outbox SET sent_at = NULL, leased_until = NULL")
        .execute(store.pool())
        .await
        .unwrap();
    assert_eq!(
        store
            .relay_once(&relay, &*servicebus, 10)
            .await
            .unwrap()
            .sent,
        1
    );

    let got = servicebus
        .receive(&replies, 10, std::time::Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "delivered once");
    assert_eq!(got[0].message_id, "received-1");
    assert_eq!(got[0].body, br#"{"status":"received"}"#);
    servicebus.complete(&got[0]).await.unwrap();
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

struct RealServiceBus(orderly_azure::ServiceBusSettings);

#[async_trait]
impl TransportFactory for RealServiceBus {
    async fn open(&self) -> Arc<dyn Transport> {
        let clock = Arc::new(orderly_core::SystemClock);
        Arc::new(
            ServiceBusTransport::connect(&self.0, Arc::new(orderly_azure::Provisioned), clock)
                .await
                .expect("connect to the namespace of ORDERLY_TEST_SERVICEBUS_CONNECTION"),
        )
    }
}

async fn real_servicebus() -> TransportCtx {
    let connection = std::env::var("ORDERLY_TEST_SERVICEBUS_CONNECTION")
        .expect("ORDERLY_TEST_SERVICEBUS_CONNECTION names the namespace these tests run against");
    TransportCtx {
        clock: ManualClock::starting_now(),
        factory: Box::new(RealServiceBus(ServiceBusSettings::new(connection))),
    }
}

/// Against a real namespace, on request:
/// `ORDERLY_TEST_SERVICEBUS_CONNECTION=... cargo nextest run -p orderly-azure --run-ignored only`.
/// The namespace needs the queues `orders`, `replies` and `work` (lock 30 s, maximum
/// delivery count 10, duplicate detection 10 min), with empty dead-letter queues. The
/// cases that move time run against the stand-in only: a real broker's clock cannot move.
mod real_servicebus_transport {
    orderly_testkit::transport_conformance!(@ignored "needs ORDERLY_TEST_SERVICEBUS_CONNECTION", crate::real_servicebus;
        sent_messages_are_received_with_id_correlation_properties_and_body,
        a_waiting_receiver_is_woken_by_a_send,
        dead_letter_on_request_keeps_the_reason,
        concurrent_consumers_receive_disjoint_messages,
        bad_requests_are_refused_with_typed_errors_and_send_nothing,
        poison_messages_are_dead_lettered_with_the_problem_and_consuming_goes_on,
    );
}
