//! The transport conformance suite through the Service Bus adapter, on the wire: each
//! test starts its own Service Bus STAND-IN (tests/servicebus-standin, a small AMQP 1.0
//! broker for tests; no Service Bus emulator runs on our CI machines) on a loopback
//! address of its own, moves its clock with the test's manual clock, and declares
//! queues through its control endpoint. The same suite runs against the SQL queue.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use async_trait::async_trait;
use orderly_azure::{ServiceBusSettings, ServiceBusTransport};
use orderly_core::ManualClock;
use orderly_core::transport::{QueueName, QueueSettings, Transport};
use orderly_testkit::servicebus_standin::{Standin, post};

mod common;
use common::StandinAdmin;
use orderly_testkit::transport::{TransportCtx, TransportFactory};

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

    let got = orderly_testkit::transport::receive_n(&*servicebus, &replies, 1).await;
    let again = servicebus
        .receive(&replies, 10, std::time::Duration::from_millis(300))
        .await
        .unwrap();
    assert!(again.is_empty(), "delivered once: {again:?}");
    assert_eq!(got[0].message_id, "received-1");
    assert_eq!(got[0].body, br#"{"status":"received"}"#);
    servicebus.complete(&got[0]).await.unwrap();
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// The relay's batch of 100 outbox rows of 4 kB each (400 kB, more than the stand-in
/// takes in one transfer, as Service Bus Standard) goes out in size-bounded batches:
/// every row is sent and marked, none set aside as undeliverable, each message arrives
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_batch_of_large_rows_goes_out_within_the_entitys_size() {
    use orderly_core::store::IntakeStore;
    use orderly_core::transport::{Envelope, Outbox, OutgoingMessage};
    use orderly_core::{InstanceId, TimeSource};
    use orderly_sql::{Delivery, SqliteStore};

    let standin = Arc::new(Standin::start());
    let servicebus = ServiceBusFactory {
        standin: standin.clone(),
        clock: ManualClock::starting_now(),
    }
    .open()
    .await;
    let replies = QueueName::parse("client-replies").unwrap();
    servicebus
        .declare_queue(&replies, &QueueSettings::default())
        .await
        .unwrap();
    let file = std::env::temp_dir().join(format!(
        "orderly-relay-large-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let store = SqliteStore::open(
        &format!("sqlite://{}", file.display()),
        TimeSource::Database,
    )
    .await
    .unwrap()
    .with_delivery(Delivery::Outbox);
    for i in 0..100u64 {
        let order = orderly_testkit::builders::order(i + 1);
        let body = format!(
            "{{\"status\":\"received\",\"pad\":\"{}\"}}",
            "p".repeat(4_000)
        );
        let sends = [Envelope {
            queue: replies.clone(),
            message: OutgoingMessage::new(format!("received-{i}"), body.into_bytes()),
        }];
        store
            .submit(&order, &orderly_testkit::builders::submitter(), &sends)
            .await
            .unwrap();
    }
    assert_eq!(store.outbox_backlog().await.unwrap(), 100);
    let relay = InstanceId::parse("relay-1").unwrap();
    let pass = store.relay_once(&relay, &*servicebus, 100).await.unwrap();
    assert_eq!(pass.sent, 100, "{pass:?}");
    assert_eq!(store.outbox_backlog().await.unwrap(), 0);
    // Completed as they come: the receiver holds only so many unsettled at a time.
    let mut got = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + orderly_testkit::transport::DELIVERY_BOUND;
    while got.len() < 100 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "only {} of 100 arrived", got.len());
        for m in servicebus.receive(&replies, 100, left).await.unwrap() {
            assert!(got.insert(m.message_id.clone()), "{} twice", m.message_id);
            servicebus.complete(&m).await.unwrap();
        }
    }
    drop(store);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// What operators do with a Service Bus queue, over AMQP on the stand-in: count its
/// messages and dead letters by peeking (nothing is locked: a consumer still gets every
/// message at once), discard one dead letter, requeue one (it comes back with its body
/// and properties, under a new id so duplicate detection keeps it), then the rest.
#[test]
fn operators_count_requeue_and_discard_dead_letters_over_amqp() {
    // The AMQP client's send is deep in a debug build: worker threads with room for it
    // (the `orderly` command runs with the same).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { tokio::spawn(operators_count_requeue_and_discard()).await })
        .unwrap();
}

async fn operators_count_requeue_and_discard() {
    use orderly_core::transport::OutgoingMessage;
    use std::time::Duration;
    let standin = Arc::new(Standin::start());
    let mut settings = ServiceBusSettings::new(standin.connection_string());
    settings.unsecured = true;
    settings.try_timeout = Duration::from_secs(5);
    let sb = ServiceBusTransport::connect(
        &settings,
        Arc::new(StandinAdmin(standin.control)),
        Arc::new(orderly_core::SystemClock),
    )
    .await
    .unwrap();
    let orders = QueueName::parse("orders").unwrap();
    sb.declare_queue(
        &orders,
        &QueueSettings {
            duplicate_detection_window: Duration::from_secs(600),
            lock_duration: Duration::from_secs(3),
            ..QueueSettings::default()
        },
    )
    .await
    .unwrap();
    for n in 1..=5 {
        let mut m = OutgoingMessage::new(format!("m-{n}"), format!("body {n}").into_bytes());
        m.properties.insert("kind".into(), "order".into());
        sb.send(&orders, &[m]).await.unwrap();
    }
    // Sent is not yet delivered: wait (bounded) for the three asked for.
    let got = orderly_testkit::transport::receive_n(&sb, &orders, 3).await;
    for m in &got {
        sb.dead_letter(m, "BodyUndecodable", "not an order")
            .await
            .unwrap();
    }
    let depths = sb
        .depths_by_peeking(std::slice::from_ref(&orders))
        .await
        .unwrap();
    assert_eq!(
        (depths[0].ready, depths[0].dead_lettered),
        (2, 3),
        "{depths:?}"
    );

    let dead_ids = async || {
        let mut ids: Vec<String> = sb
            .dead_letters(&orders, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.message.message_id)
            .collect();
        ids.sort();
        ids
    };
    let dead = dead_ids().await;
    assert_eq!(dead.len(), 3);
    assert_eq!(
        sb.settle_dead_letters(&orders, Some(&dead[1]), false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(dead_ids().await, vec![dead[0].clone(), dead[2].clone()]);
    // The one before it was passed over and given back: at once available.
    assert_eq!(
        sb.settle_dead_letters(&orders, Some(&dead[0]), true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(dead_ids().await, vec![dead[2].clone()]);
    // The two never dead-lettered (their first locks ran out) and the requeued one.
    tokio::time::sleep(Duration::from_millis(3_300)).await;
    let live = orderly_testkit::transport::receive_n(&sb, &orders, 3).await;
    for m in &live {
        sb.complete(m).await.unwrap();
    }
    let more = sb
        .receive(&orders, 10, Duration::from_millis(500))
        .await
        .unwrap();
    assert!(more.is_empty(), "a fourth message: {more:?}");
    let requeued = live
        .iter()
        .find(|m| m.message_id.starts_with(&format!("{}~requeued-", dead[0])))
        .unwrap_or_else(|| panic!("{live:?}"));
    let n = dead[0].trim_start_matches("m-");
    assert_eq!(requeued.body, format!("body {n}").into_bytes());
    assert_eq!(
        requeued.properties.get("kind").map(String::as_str),
        Some("order")
    );
    assert!(!requeued.properties.contains_key("DeadLetterReason"));
    assert_eq!(live.len(), 3, "{live:?}");
    assert_eq!(
        sb.settle_dead_letters(&orders, None, true).await.unwrap(),
        1
    );
    assert!(dead_ids().await.is_empty());
    let depths = sb
        .depths_by_peeking(std::slice::from_ref(&orders))
        .await
        .unwrap();
    assert_eq!((depths[0].ready, depths[0].dead_lettered), (1, 0));
    assert_eq!(
        sb.settle_dead_letters(&orders, Some("m-9"), false)
            .await
            .unwrap(),
        0,
        "no such dead letter"
    );
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

/// The robustness cases: the stand-in misbehaves on purpose (drops connections,
/// restarts, never answers an attach or a renewal) and the transport rides it out.
mod misbehaving_broker {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use azservicebus::SubQueue;
    use orderly_azure::{ServiceBusSettings, ServiceBusTransport};
    use orderly_core::SystemClock;
    use orderly_core::transport::{
        OutgoingMessage, QueueName, QueueSettings, Transport, TransportError,
    };
    use orderly_testkit::servicebus_standin::Standin;

    use super::StandinAdmin;

    async fn transport(standin: &Standin, try_timeout: Duration) -> ServiceBusTransport {
        transport_with(
            standin,
            try_timeout,
            ServiceBusSettings::new(String::new()).max_retries,
        )
        .await
    }

    async fn transport_with(
        standin: &Standin,
        try_timeout: Duration,
        max_retries: u32,
    ) -> ServiceBusTransport {
        let mut settings = ServiceBusSettings::new(standin.connection_string());
        settings.unsecured = true;
        settings.try_timeout = try_timeout;
        settings.max_retries = max_retries;
        ServiceBusTransport::connect(
            &settings,
            Arc::new(StandinAdmin(standin.control)),
            Arc::new(SystemClock),
        )
        .await
        .expect("connect to the stand-in")
    }

    async fn declared(t: &ServiceBusTransport, name: &str) -> QueueName {
        let q = QueueName::parse(name).unwrap();
        t.declare_queue(&q, &QueueSettings::default())
            .await
            .unwrap();
        q
    }

    fn msg(id: &str) -> OutgoingMessage {
        OutgoingMessage::new(id, id.as_bytes().to_vec())
    }

    /// A send larger than the entity takes at once (the stand-in, as Service Bus
    /// Standard, refuses a transfer over 256 KB) goes out in batches within it: 256
    /// replies of ~1.5 kB, as an agent settles them, all arrive once. Sent as one batch
    /// (the limit set above the broker's) the broker refuses it whole; a single message
    /// over the limit is refused before anything is sent, naming the queue and sizes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_send_over_the_entitys_size_goes_out_in_batches_within_it() {
        let standin = Standin::start();
        let t = transport(&standin, Duration::from_secs(5)).await;
        let q = declared(&t, "replies").await;
        let big = |i: usize| {
            let mut m = OutgoingMessage::new(format!("reply-{i}"), vec![b'r'; 1_500]);
            m.correlation_id = Some(format!("req:o-{i}:1:d:3"));
            m.properties.insert(
                "traceparent".into(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            );
            m
        };
        let replies: Vec<OutgoingMessage> = (0..256).map(big).collect();
        let total: usize = replies
            .iter()
            .map(orderly_azure::servicebus::wire_size)
            .sum();
        assert!(
            total > 256 * 1024,
            "{total} bytes: more than one transfer takes"
        );
        let out = t.send(&q, &replies).await.unwrap();
        assert_eq!(out.accepted, 256);
        // Completed as they come: the receiver holds only so many unsettled at a time.
        let mut got = std::collections::BTreeSet::new();
        let deadline = Instant::now() + orderly_testkit::transport::DELIVERY_BOUND;
        while got.len() < 256 {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "only {} of 256 arrived", got.len());
            for m in t.receive(&q, 256, left).await.unwrap() {
                assert!(got.insert(m.message_id.clone()), "{} twice", m.message_id);
                t.complete(&m).await.unwrap();
            }
        }

        // Without the split (a limit above the broker's) the broker refuses it whole.
        let mut settings = ServiceBusSettings::new(standin.connection_string());
        settings.unsecured = true;
        settings.max_batch_bytes = 4 * 1024 * 1024;
        let unsplit = ServiceBusTransport::connect(
            &settings,
            Arc::new(StandinAdmin(standin.control)),
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        let again: Vec<OutgoingMessage> = (1000..1256).map(big).collect();
        let e = unsplit.send(&q, &again).await.unwrap_err();
        assert!(!e.is_retryable(), "{e}");
        assert!(
            t.receive(&q, 10, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty()
        );

        // One message over the limit with its framing (its body alone is within the
        // limit every transport applies): refused before anything goes, naming it all.
        let huge = OutgoingMessage::new("huge", vec![b'x'; 262_000]);
        let e = t.send(&q, &[msg("small"), huge]).await.unwrap_err();
        assert!(matches!(e, TransportError::Invalid(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("huge") && text.contains("replies") && text.contains("262144"),
            "{text}"
        );
        assert!(
            t.receive(&q, 10, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty(),
            "nothing sent"
        );
    }

    /// Sends until one goes through (each call may fail while the transport finds its
    /// connection gone and builds a new one); how long it took.
    async fn send_until_through(t: &ServiceBusTransport, q: &QueueName, id: &str) -> Duration {
        let started = Instant::now();
        loop {
            match t.send(q, &[msg(id)]).await {
                Ok(_) => return started.elapsed(),
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    assert!(
                        e.to_string().contains("Service Bus"),
                        "names the system: {e}"
                    );
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "no send went through in 30 s after the broker came back: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// A network blip cuts the connection: the transport notices, builds a new one, and
    /// sends and receives go on; a delivery held on the old connection is a lost lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_dropped_connection_is_replaced_and_messaging_goes_on() {
        let standin = Standin::start();
        let t = transport(&standin, Duration::from_secs(3)).await;
        let q = QueueName::parse("work").unwrap();
        // A short lock, so that what the lost connection held comes back soon.
        t.declare_queue(
            &q,
            &QueueSettings {
                lock_duration: Duration::from_secs(3),
                ..QueueSettings::default()
            },
        )
        .await
        .unwrap();
        t.send(&q, &[msg("before-1"), msg("before-2")])
            .await
            .unwrap();
        let held = t.receive(&q, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(t.reconnects(), 0);

        standin.drop_connections().unwrap();
        let took = send_until_through(&t, &q, "after-1").await;
        eprintln!("first send through {} ms after the drop", took.as_millis());
        assert!(t.reconnects() >= 1, "a new connection was built");
        assert!(t.is_connected().await);
        assert!(
            matches!(
                t.complete(&held[0]).await,
                Err(TransportError::LockLost { .. })
            ),
            "a hold from the lost connection cannot be settled"
        );
        // Everything comes through on the new connection: the new message at once, and
        // what the old one held (before-1) or had prefetched (before-2, locked to it
        // too) once those locks expire. Nothing is lost.
        let mut ids = Vec::new();
        let started = Instant::now();
        while ids.len() < 3 && started.elapsed() < Duration::from_secs(20) {
            for m in t
                .receive(&q, 10, Duration::from_secs(1))
                .await
                .unwrap_or_default()
            {
                t.complete(&m).await.unwrap();
                if m.message_id == "before-1" {
                    assert!(
                        m.delivery_count >= 2,
                        "delivered again: {}",
                        m.delivery_count
                    );
                }
                ids.push(m.message_id);
            }
        }
        ids.sort();
        assert_eq!(ids, ["after-1", "before-1", "before-2"]);
    }

    /// The broker restarts (all its queues must be declared again, as infrastructure
    /// would keep them): the transport reconnects by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_restarted_broker_is_reconnected_to() {
        let mut standin = Standin::start();
        let t = transport(&standin, Duration::from_secs(3)).await;
        let q = declared(&t, "orders").await;
        t.send(&q, &[msg("m-1")]).await.unwrap();
        standin.restart();
        standin
            .declare(
                "orders",
                Duration::from_secs(30),
                10,
                Duration::from_secs(600),
            )
            .unwrap();
        send_until_through(&t, &q, "m-2").await;
        let got = t.receive(&q, 10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1, "the restart lost m-1; m-2 is there");
        assert_eq!(got[0].message_id, "m-2");
        t.complete(&got[0]).await.unwrap();
        assert!(t.reconnects() >= 1);
    }

    /// An attach the broker never answers fails within the try-timeout, and the queues
    /// whose links are open keep working meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_unanswered_attach_times_out_and_other_queues_keep_working() {
        let standin = Standin::start();
        let t = Arc::new(transport(&standin, Duration::from_secs(2)).await);
        let good = declared(&t, "good").await;
        let stuck = declared(&t, "stuck").await;
        // Open the good queue's links first.
        t.send(&good, &[msg("g-0")]).await.unwrap();
        let m = t.receive(&good, 1, Duration::from_secs(5)).await.unwrap();
        t.complete(&m[0]).await.unwrap();
        // The good queue's next message is on its way before the attach hangs: what is
        // timed below is its receive and settlement, not a send, whose outcome
        // fe2o3-amqp 0.14 can lose on a loaded machine (see `judge`). (A new link,
        // on any queue, waits its turn behind the hung attach: attaches take turns.)
        t.send(&good, &[msg("g-1")]).await.unwrap();

        standin.hang_attach("stuck").unwrap();
        let started = Instant::now();
        let hung = tokio::spawn({
            let t = t.clone();
            let stuck = stuck.clone();
            async move { t.send(&stuck, &[msg("s-1")]).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let during = Instant::now();
        let got = t.receive(&good, 32, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        t.complete(&got[0]).await.unwrap();
        let good_took = during.elapsed();
        let err = hung.await.unwrap().unwrap_err();
        let stuck_took = started.elapsed();
        eprintln!(
            "good queue round trip {} ms while the stuck attach hung; the stuck send failed after {} ms: {err}",
            good_took.as_millis(),
            stuck_took.as_millis()
        );
        assert!(good_took < Duration::from_secs(1), "{good_took:?}");
        assert!(err.to_string().contains("did not answer"), "{err}");
        assert!(
            stuck_took < Duration::from_secs(10),
            "bounded: {stuck_took:?}"
        );
    }

    /// An attach the broker answers only after the try-timeout (a slow broker, or a
    /// loaded machine) fails the call that asked for it, and its late answer harms
    /// nothing: the connection and its session stay up, a message held on another
    /// queue is still settled, and the slow queue works once it answers in time.
    /// (Giving up on the attach half-way used to leave the client's session with an
    /// answer for a link nobody waited for; the session then ended with
    /// amqp:session:unattached-handle and took every hold with it.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_attach_answered_after_its_timeout_ends_nothing_else() {
        let standin = Standin::start();
        // One attach, not one per retry: two failures in a row would (rightly) retire
        // the connection, which is not what this case is about.
        let t = transport_with(&standin, Duration::from_secs(1), 0).await;
        let good = declared(&t, "good").await;
        let slow = declared(&t, "slow").await;
        t.send(&good, &[msg("g-1")]).await.unwrap();
        let held = t.receive(&good, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(held.len(), 1);
        let reconnects = t.reconnects();

        // The sender link's attach is answered late (its management node's in time).
        standin
            .late_attach("slow", Duration::from_millis(1500), 1)
            .unwrap();
        let err = t.send(&slow, &[msg("s-1")]).await.unwrap_err();
        assert!(err.to_string().contains("did not answer"), "{err}");
        // The late answer has gone out, and the client has had time to take it in.
        let started = Instant::now();
        while standin.late_attaches_answered().unwrap() == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the stand-in never answered the late attach"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;

        // The hold taken before is still good on the same connection.
        t.abandon(&held[0]).await.unwrap();
        assert_eq!(
            t.reconnects(),
            reconnects,
            "the connection was not replaced"
        );
        assert!(t.is_connected().await);
        let again = t.receive(&good, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message_id, "g-1");
        assert_eq!(again[0].delivery_count, 2);
        t.complete(&again[0]).await.unwrap();
        // The slow queue works now that its attaches are answered in time.
        send_until_through(&t, &slow, "s-2").await;
        let got = t.receive(&slow, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message_id, "s-2");
        t.complete(&got[0]).await.unwrap();
        assert_eq!(t.reconnects(), reconnects);
    }

    /// An attach never answered fails its caller within the try-timeout; the
    /// connection stays in use meanwhile, and is retired (its holds lost, as the broker
    /// has lost them) once the attach has gone unanswered for three try-timeouts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_attach_never_answered_retires_its_connection_in_the_end() {
        let standin = Standin::start();
        let try_timeout = Duration::from_millis(600);
        let t = transport_with(&standin, try_timeout, 0).await;
        let good = declared(&t, "good").await;
        let stuck = declared(&t, "stuck").await;
        t.send(&good, &[msg("g-1"), msg("g-2")]).await.unwrap();
        // A receive returns with what has arrived: the second may come a moment later.
        let mut held = Vec::new();
        while held.len() < 2 {
            held.extend(t.receive(&good, 2, Duration::from_secs(5)).await.unwrap());
        }
        let reconnects = t.reconnects();

        standin.hang_attach("stuck").unwrap();
        let started = Instant::now();
        let err = t.send(&stuck, &[msg("s-1")]).await.unwrap_err();
        assert!(err.to_string().contains("did not answer"), "{err}");
        // Still the same connection: what it holds can be settled.
        t.complete(&held[0]).await.unwrap();
        assert!(t.is_connected().await);
        while t.is_connected().await {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the connection of a never-answered attach was never retired"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let retired_after = started.elapsed();
        eprintln!("retired {} ms after the attach", retired_after.as_millis());
        assert!(retired_after >= try_timeout * 3, "{retired_after:?}");
        assert!(matches!(
            t.complete(&held[1]).await,
            Err(TransportError::LockLost { .. })
        ));
        // The next call builds a new connection and messaging goes on.
        t.send(&good, &[msg("g-3")]).await.unwrap();
        assert_eq!(t.reconnects(), reconnects + 1);
    }

    /// Failures on different queues do not add up to retire a connection that works
    /// (a queue's second failure in a row does): a renewal left unanswered on one queue
    /// and then on another leave the connection in use; a second on the first retires
    /// it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn failures_on_two_queues_do_not_retire_the_connection() {
        let standin = Standin::start();
        let t = transport_with(&standin, Duration::from_millis(600), 0).await;
        let mut held = Vec::new();
        for (name, ids) in [("a", &["a-1", "a-2"][..]), ("b", &["b-1"]), ("c", &["c-1"])] {
            let q = declared(&t, name).await;
            t.send(&q, &ids.iter().map(|id| msg(id)).collect::<Vec<_>>())
                .await
                .unwrap();
            let mut got = Vec::new();
            while got.len() < ids.len() {
                got.extend(t.receive(&q, 2, Duration::from_secs(5)).await.unwrap());
            }
            held.extend(got);
        }
        let of = |wanted: &str| {
            held.iter()
                .find(|m| m.message_id == wanted)
                .unwrap()
                .clone()
        };
        let reconnects = t.reconnects();

        standin.hang_renew(true).unwrap();
        assert!(t.renew_lock(&of("a-1")).await.is_err());
        assert!(t.renew_lock(&of("b-1")).await.is_err());
        assert!(t.is_connected().await, "one failure on each of two queues");
        assert_eq!(t.reconnects(), reconnects);
        // A second failure in a row on one queue does retire it, and its holds with it.
        assert!(t.renew_lock(&of("a-2")).await.is_err());
        assert!(!t.is_connected().await, "two failures in a row on queue a");
        assert!(matches!(
            t.complete(&of("c-1")).await,
            Err(TransportError::LockLost { .. })
        ));
    }

    /// A receive of up to 32 returns as soon as its first message is there, not after
    /// its whole wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_receive_returns_on_its_first_message() {
        let standin = Standin::start();
        let t = transport(&standin, Duration::from_secs(3)).await;
        let q = declared(&t, "replies").await;
        // The link exists and is idle.
        assert!(
            t.receive(&q, 32, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty()
        );
        t.send(&q, &[msg("only")]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        let got = t.receive(&q, 32, Duration::from_secs(5)).await.unwrap();
        let took = started.elapsed();
        eprintln!(
            "receive of up to 32 with one waiting: {} ms",
            took.as_millis()
        );
        assert_eq!(got.len(), 1);
        assert!(
            took < Duration::from_millis(500),
            "{took:?} (the wait was 5 s)"
        );
        // A settlement does not wait behind a receive that is waiting on the same queue.
        let waiting = {
            let t = &t;
            let q = q.clone();
            async move { t.receive(&q, 32, Duration::from_secs(3)).await }
        };
        let settle = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let started = Instant::now();
            t.complete(&got[0]).await.unwrap();
            started.elapsed()
        };
        let (idle, settled_in) = tokio::join!(waiting, settle);
        assert!(idle.unwrap().is_empty());
        eprintln!(
            "completion during a waiting receive: {} ms",
            settled_in.as_millis()
        );
        assert!(settled_in < Duration::from_millis(500), "{settled_in:?}");
    }

    /// A renewal the broker never answers delays nothing on another queue, fails
    /// within the try-timeout, and the links it takes out of use leave the connection
    /// up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_hanging_renewal_does_not_delay_another_queue() {
        let standin = Standin::start();
        let t = Arc::new(transport(&standin, Duration::from_secs(2)).await);
        let a = declared(&t, "agent.a").await;
        let b = declared(&t, "agent.b").await;
        t.send(&a, &[msg("a-1")]).await.unwrap();
        t.send(&b, &[msg("b-0")]).await.unwrap();
        let warm = t.receive(&b, 1, Duration::from_secs(5)).await.unwrap();
        t.complete(&warm[0]).await.unwrap();
        let held = t.receive(&a, 1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(held.len(), 1);

        // Queue b's next message is waiting (prefetched) before the renewal hangs: what
        // is timed below is b's receive, settlement and a peek (an attach and a request
        // on b's management node: broker round trips), not a send, whose outcome
        // fe2o3-amqp 0.14 can lose on a loaded machine (see `judge`).
        t.send(&b, &[msg("b-1")]).await.unwrap();
        standin.hang_renew(true).unwrap();
        let started = Instant::now();
        let renewal = tokio::spawn({
            let t = t.clone();
            let m = held[0].clone();
            async move { t.renew_lock(&m).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let during = Instant::now();
        let got = t.receive(&b, 32, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        t.complete(&got[0]).await.unwrap();
        let (left, _) = t.count_by_peeking(&b, SubQueue::None).await.unwrap();
        assert_eq!(left, 0);
        let b_took = during.elapsed();
        let renewed = renewal.await.unwrap();
        eprintln!(
            "queue b receive, completion and peek {} ms during the hung renewal; renewal ended after {} ms: {renewed:?}",
            b_took.as_millis(),
            started.elapsed().as_millis()
        );
        assert!(b_took < Duration::from_secs(1), "{b_took:?}");
        assert!(renewed.is_err(), "an unanswered renewal fails");
        assert!(started.elapsed() < Duration::from_secs(10));
        // The failed renewal leaves the connection in use for queue b. (It used to
        // take queue a's links out of use by dropping them, without waiting for the
        // broker's detach, which ended the session with amqp:session:unattached-handle
        // and queue b with it; a timed-out link is now kept, and one taken out of use
        // for another failure is closed.)
        let reconnects = t.reconnects();
        tokio::time::sleep(Duration::from_millis(500)).await;
        send_until_through(&t, &b, "b-2").await;
        let got = t.receive(&b, 32, Duration::from_secs(5)).await.unwrap();
        let ids: Vec<_> = got
            .iter()
            .map(|m| (m.message_id.clone(), m.delivery_count))
            .collect();
        assert_eq!(ids, [("b-2".to_owned(), 1)]);
        t.complete(&got[0]).await.unwrap();
        assert_eq!(t.reconnects(), reconnects);
    }
}

/// The default build speaks AMQPS: without `unsecured` the transport dials the
/// namespace on port 5671 and opens TLS there (the stand-in, listening for AMQPS with a
/// certificate from the test's CA, sees the handshake), verifying the server's
/// certificate. azservicebus 0.25 verifies against the public (webpki) roots only and
/// takes no other CA, so the stand-in's test CA is refused, and the error says why:
/// the same connection to `<namespace>.servicebus.windows.net`, whose certificate
/// chains to a public root, is the production path (docs/containers.md). Over plain
/// AMQP (`unsecured`, the emulator's mode) the same stand-in is reached.
#[test]
fn the_transport_speaks_amqps_on_5671_and_verifies_the_brokers_certificate() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use std::time::Duration;
        let (_ca, standin) = Standin::start_tls();
        let mut settings = ServiceBusSettings::new(standin.connection_string());
        settings.try_timeout = Duration::from_secs(5);
        assert!(!settings.unsecured, "TLS is the default");
        let refused = ServiceBusTransport::connect(
            &settings,
            Arc::new(StandinAdmin(standin.control)),
            Arc::new(orderly_core::SystemClock),
        )
        .await
        .map(|_| ())
        .expect_err("a broker whose certificate no trusted root signed is refused");
        let text = refused.to_string();
        eprintln!("AMQPS to the stand-in: {text}");
        assert!(
            text.contains("UnknownIssuer") || text.contains("certificate"),
            "the error names the certificate: {text}"
        );
        assert!(!text.contains("c3RhbmQtaW4tb25seQ=="), "no key in {text}");
        let stats: serde_json::Value = serde_json::from_str(&standin.tls_stats().unwrap()).unwrap();
        assert!(
            stats["handshakes"].as_u64().unwrap() >= 1,
            "the client opened TLS on 5671: {stats}"
        );
        assert_eq!(stats["secured"], 0, "{stats}");

        settings.unsecured = true;
        let sb = ServiceBusTransport::connect(
            &settings,
            Arc::new(StandinAdmin(standin.control)),
            Arc::new(orderly_core::SystemClock),
        )
        .await
        .expect("plain AMQP on 5672 is reached");
        let orders = QueueName::parse("orders").unwrap();
        sb.declare_queue(&orders, &QueueSettings::default())
            .await
            .unwrap();
        sb.send(
            &orders,
            &[orderly_core::transport::OutgoingMessage::new(
                "m-1",
                b"x".to_vec(),
            )],
        )
        .await
        .unwrap();
    });
}

/// What a subscriber wrote, for the log's assertions.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn count(&self, level: &str, text: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(level) && l.contains(text))
            .count()
    }
}

/// A broker that stays down is reported when the failing begins (with its cause), not
/// at every reconnect attempt of the back-off; its return is reported once too, and a
/// second outage is reported again.
#[tokio::test(flavor = "current_thread")]
async fn a_broker_down_is_logged_once_per_cause_not_at_every_reconnect_attempt() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut standin = Standin::start();
    let defaults = QueueSettings::default();
    let declare = |s: &Standin| {
        s.declare(
            "orders",
            defaults.lock_duration,
            defaults.max_delivery_count,
            defaults.duplicate_detection_window,
        )
        .unwrap()
    };
    declare(&standin);
    let mut settings = ServiceBusSettings::new(standin.connection_string());
    settings.unsecured = true;
    settings.try_timeout = std::time::Duration::from_secs(2);
    let t = ServiceBusTransport::connect(
        &settings,
        Arc::new(StandinAdmin(standin.control)),
        Arc::new(ManualClock::starting_now()),
    )
    .await
    .unwrap();
    let q = QueueName::parse("orders").unwrap();
    let msg = |id: &str| orderly_core::transport::OutgoingMessage::new(id, "x");
    t.send(&q, &[msg("m-0")]).await.unwrap();

    for outage in 1..=2 {
        standin.stop();
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(4);
        let mut calls = 0;
        while tokio::time::Instant::now() < until {
            assert!(t.send(&q, &[msg("down")]).await.is_err());
            calls += 1;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let again = log.count("DEBUG", "Service Bus reconnect failed again");
        assert!(
            again >= 2,
            "fewer reconnect attempts than the test needs: {again} ({calls} calls)"
        );
        assert_eq!(
            log.count("WARN", "Service Bus reconnect failed; retrying"),
            outage,
            "one warning per outage, with its cause"
        );
        standin.restart();
        declare(&standin);
        let back = tokio::time::Instant::now() + std::time::Duration::from_secs(40);
        while t.send(&q, &[msg("up")]).await.is_err() {
            assert!(tokio::time::Instant::now() < back, "not reconnected");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert_eq!(
            log.count("INFO", "Service Bus connection re-established"),
            outage
        );
    }
    assert!(
        log.count("WARN", "refused") >= 1 || log.count("WARN", "cannot connect") >= 1,
        "the warning says why"
    );
}
