//! The client library against real transports: the SQL queue on SQLite and PostgreSQL
//! (with the real submitter taking what it posts), and the Service Bus stand-in.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use orderly_client::{Client, ClientConfig, ClientError, Target};
use orderly_core::messages::{OrderStatus, StatusNotice, json_message, queues};
use orderly_core::store::{IntakeStore, NewOrder};
use orderly_core::transport::{QueueName, Transport};
use orderly_core::{Currency, InstanceId, OrderDetails, OrderId, OrderLine, TimeSource};
use orderly_submitter::{Submitter, SubmitterConfig};

fn order(id: &str) -> NewOrder {
    NewOrder {
        workflow: None,
        order_id: OrderId::parse(id).unwrap(),
        details: OrderDetails::new(
            "customer-1",
            Currency::parse("EUR").unwrap(),
            vec![OrderLine {
                sku: "MOUSE-02".into(),
                quantity: 2,
                unit_price_minor: 1999,
            }],
        )
        .unwrap(),
        reply_to: None,
    }
}

/// A fresh database URL: a new SQLite file, or a new PostgreSQL schema (PostgreSQL is
/// required: a test that cannot reach it fails).
async fn fresh(dialect: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    if dialect == "sqlite" {
        let path = std::env::temp_dir().join(format!("orderly-client-{id}.db"));
        return format!("sqlite://{}", path.display());
    }
    let base = std::env::var("ORDERLY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&base).await.unwrap_or_else(|e| {
        panic!("PostgreSQL is required (run .ci/run, or set ORDERLY_TEST_POSTGRES_URL): {e}")
    });
    let schema = format!("orderly_client_{id}");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&pool)
        .await
        .unwrap();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

/// Posted orders go through the real submitter into the store, exactly once each
/// however often they were posted, and the `received` notices come back to the
/// client's reply queue, each to its own `wait_for`.
async fn posts_reach_the_store_once_and_notices_come_back(dialect: &str) {
    let url = fresh(dialect).await;
    let client = Client::connect(
        ClientConfig::new(Target::Sql {
            database_url: url.clone(),
            password: None,
        })
        .with_reply_queue("shop-1")
        .unwrap(),
    )
    .await
    .unwrap();
    // Before any role ran: the client made the queues it needs.
    let ids: Vec<String> = (0..5).map(|i| format!("client-{dialect}-{i}")).collect();
    let first = client
        .post_many(ids.iter().map(|id| order(id)).collect())
        .await
        .unwrap();
    assert_eq!(first, 5);
    // Repeats: dropped by the queue's duplicate detection.
    let again = client.post(order(&ids[1])).await.unwrap();
    assert_eq!(again.as_str(), ids[1]);
    let repeats = client
        .post_many(vec![order(&ids[3]), order(&ids[4])])
        .await
        .unwrap();
    assert_eq!(repeats, 0, "repeats are absorbed by the queue");

    let backend = orderly_sql::connect(&url, TimeSource::Database)
        .await
        .unwrap();
    let store: Arc<dyn IntakeStore> = backend.store.clone();
    let submitter = Submitter::new(
        store,
        backend.transport.clone(),
        SubmitterConfig::new(InstanceId::generate("submitter")),
    );
    let mut accepted = 0;
    for _ in 0..10 {
        let intake = submitter
            .run_once(Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(intake.rejected, 0);
        accepted += intake.accepted;
        if accepted == 5 {
            break;
        }
    }
    assert_eq!(accepted, 5, "each posted order recorded once");
    let counts = backend.store.count_by_state().await.unwrap();
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 5, "{counts:?}");
    for id in &ids {
        let view = backend
            .store
            .get(&OrderId::parse(id.as_str()).unwrap())
            .await
            .unwrap();
        assert_eq!(view.state.reply_to.as_deref(), Some("shop-1"));
    }
    // Waited for in another order than they arrive: none is lost to another's wait.
    for id in ids.iter().rev() {
        let n = client
            .wait_for(
                &OrderId::parse(id.as_str()).unwrap(),
                OrderStatus::Received,
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(n.status, OrderStatus::Received);
    }
    cleanup(&url);
}

fn cleanup(url: &str) {
    if let Some(path) = url.strip_prefix("sqlite://") {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_posts_reach_the_store_once_and_notices_come_back() {
    posts_reach_the_store_once_and_notices_come_back("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_posts_reach_the_store_once_and_notices_come_back() {
    posts_reach_the_store_once_and_notices_come_back("postgres").await;
}

/// An order that cannot be accepted is refused before anything is sent, naming the
/// field; one bad order in a batch sends none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_orders_are_refused_before_anything_is_sent() {
    let url = fresh("sqlite").await;
    let client = Client::connect(ClientConfig::new(Target::Sql {
        database_url: url.clone(),
        password: None,
    }))
    .await
    .unwrap();
    let mut bad = order("bad-reply");
    bad.reply_to = Some("no spaces allowed".into());
    let err = client
        .post_many(vec![order("good-1"), bad])
        .await
        .unwrap_err();
    match &err {
        ClientError::Invalid { order_id, error } => {
            assert_eq!(order_id.as_deref(), Some("bad-reply"));
            assert_eq!(error.field, "reply_to");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let backend = orderly_sql::connect(&url, TimeSource::Database)
        .await
        .unwrap();
    let depths = backend.inspector.depths().await.unwrap();
    let orders = depths
        .iter()
        .find(|d| d.queue.as_str() == queues::ORDERS)
        .unwrap();
    assert_eq!(orders.ready, 0, "nothing of the batch was sent");
    // No reply queue: waiting is refused, not a hang.
    assert!(matches!(
        client
            .wait_for(
                &OrderId::parse("good-1").unwrap(),
                OrderStatus::Completed,
                Duration::from_secs(1)
            )
            .await,
        Err(ClientError::NoReplyQueue)
    ));
    // A database URL that is no database: named.
    let err = Client::connect(ClientConfig::new(Target::Sql {
        database_url: "mysql://nope".into(),
        password: None,
    }))
    .await
    .unwrap_err();
    assert!(err.to_string().contains("database_url"), "{err}");
    cleanup(&url);
}

/// `wait_for` reports an order that ended otherwise, and times out on silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_reports_another_ending_and_times_out() {
    let url = fresh("sqlite").await;
    let client = Client::connect(
        ClientConfig::new(Target::Sql {
            database_url: url.clone(),
            password: None,
        })
        .with_reply_queue("shop-2")
        .unwrap(),
    )
    .await
    .unwrap();
    let backend = orderly_sql::connect(&url, TimeSource::Database)
        .await
        .unwrap();
    let failed = StatusNotice {
        order_id: OrderId::parse("o-failed").unwrap(),
        status: OrderStatus::Failed,
        step: Some("charge-payment".into()),
        detail: Some("card declined".into()),
    };
    let reply = QueueName::parse("shop-2").unwrap();
    backend
        .transport
        .send(&reply, &[json_message("n-1".into(), &failed, None)])
        .await
        .unwrap();
    match client
        .wait_for(
            &failed.order_id,
            OrderStatus::Completed,
            Duration::from_secs(5),
        )
        .await
    {
        Err(ClientError::Ended(n)) => {
            assert_eq!(n, failed);
        }
        other => panic!("expected Ended, got {other:?}"),
    }
    let started = std::time::Instant::now();
    assert!(matches!(
        client
            .wait_for(
                &OrderId::parse("o-silent").unwrap(),
                OrderStatus::Completed,
                Duration::from_millis(700)
            )
            .await,
        Err(ClientError::Timeout { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
    cleanup(&url);
}

mod servicebus {
    use super::*;
    use orderly_azure::{Provisioned, ServiceBusSettings, ServiceBusTransport};
    use orderly_core::SystemClock;
    use orderly_testkit::servicebus_standin::Standin;

    fn settings(standin: &Standin) -> ServiceBusSettings {
        let mut s = ServiceBusSettings::new(standin.connection_string());
        s.unsecured = true;
        s.try_timeout = Duration::from_secs(5);
        s
    }

    /// On Service Bus (the stand-in): the message is the order with its id as message
    /// id, a repeat is dropped by duplicate detection, and a queue that was not
    /// provisioned is named.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posts_on_service_bus_carry_the_order_id_and_repeats_are_dropped() {
        let standin = Standin::start();
        let missing = Client::connect(ClientConfig::new(Target::ServiceBus(settings(&standin))))
            .await
            .unwrap_err();
        assert!(
            matches!(&missing, ClientError::QueueNotFound(q) if q.as_str() == queues::ORDERS),
            "{missing:?}"
        );
        for q in [queues::ORDERS, "shop-sb"] {
            standin
                .declare(q, Duration::from_secs(30), 10, Duration::from_secs(600))
                .unwrap();
        }
        let client = Client::connect(
            ClientConfig::new(Target::ServiceBus(settings(&standin)))
                .with_reply_queue("shop-sb")
                .unwrap(),
        )
        .await
        .unwrap();
        client
            .post_many(vec![order("sb-1"), order("sb-2")])
            .await
            .unwrap();
        client.post(order("sb-1")).await.unwrap();

        let reader = ServiceBusTransport::connect(
            &settings(&standin),
            Arc::new(Provisioned),
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        let orders = QueueName::parse(queues::ORDERS).unwrap();
        let mut got = Vec::new();
        for _ in 0..10 {
            for m in reader
                .receive(&orders, 10, Duration::from_millis(500))
                .await
                .unwrap()
            {
                let decoded: NewOrder = serde_json::from_slice(&m.body).unwrap();
                assert_eq!(m.message_id, decoded.order_id.as_str());
                assert_eq!(decoded.reply_to.as_deref(), Some("shop-sb"));
                reader.complete(&m).await.unwrap();
                got.push(m.message_id);
            }
            if got.len() >= 2 {
                // Give a wrongly kept repeat the time to show up.
                let late = reader
                    .receive(&orders, 10, Duration::from_millis(500))
                    .await
                    .unwrap();
                got.extend(late.into_iter().map(|m| m.message_id));
                break;
            }
        }
        got.sort();
        assert_eq!(got, ["sb-1", "sb-2"], "the repeat of sb-1 was dropped");

        // Notices on Service Bus reach wait_for too.
        let reply = QueueName::parse("shop-sb").unwrap();
        let done = StatusNotice {
            order_id: OrderId::parse("sb-2").unwrap(),
            status: OrderStatus::Completed,
            step: None,
            detail: None,
        };
        reader
            .send(&reply, &[json_message("n-sb".into(), &done, None)])
            .await
            .unwrap();
        let n = client
            .wait_for(
                &done.order_id,
                OrderStatus::Completed,
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(n, done);
    }
}
