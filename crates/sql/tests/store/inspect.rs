//! What operators see of the SQL queue: depths by condition, and dead letters put back
//! on their queue.

use std::time::Duration;

use orderly_core::transport::{
    OutgoingMessage, QueueDepth, QueueInspector, QueueName, QueueSettings, Transport,
};

async fn depths_and_requeue<T: Transport + QueueInspector>(t: T) {
    let q = QueueName::parse("work").unwrap();
    let other = QueueName::parse("other").unwrap();
    let settings = QueueSettings {
        lock_duration: Duration::from_secs(30),
        max_delivery_count: 10,
        duplicate_detection_window: Duration::from_secs(600),
    };
    t.declare_queue(&q, &settings).await.unwrap();
    t.declare_queue(&other, &settings).await.unwrap();
    let mut later = OutgoingMessage::new("later", b"4".to_vec());
    later.scheduled_enqueue_time = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    t.send(
        &q,
        &[
            OutgoingMessage::new("a", b"1".to_vec()),
            OutgoingMessage::new("b", b"2".to_vec()),
            OutgoingMessage::new("c", b"3".to_vec()),
            later,
        ],
    )
    .await
    .unwrap();
    let got = t.receive(&q, 2, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 2);
    let (held, bad) = (&got[0], &got[1]);
    t.dead_letter(bad, "BodyUndecodable", "expected JSON")
        .await
        .unwrap();
    let depth = |ds: Vec<QueueDepth>, name: &str| {
        ds.into_iter().find(|d| d.queue.as_str() == name).unwrap()
    };
    let d = depth(t.depths().await.unwrap(), "work");
    assert_eq!(
        (d.ready, d.locked, d.scheduled, d.dead_lettered),
        (1, 1, 1, 1),
        "{d:?}"
    );
    let o = depth(t.depths().await.unwrap(), "other");
    assert_eq!(
        (o.ready, o.locked, o.scheduled, o.dead_lettered),
        (0, 0, 0, 0)
    );
    // Requeue by id: only that one, back as a fresh delivery, visible at once.
    assert_eq!(t.requeue_dead_letters(&q, Some("nope")).await.unwrap(), 0);
    assert_eq!(
        t.requeue_dead_letters(&q, Some(&bad.message_id))
            .await
            .unwrap(),
        1
    );
    assert!(t.dead_letters(&q, 10).await.unwrap().is_empty());
    t.complete(held).await.unwrap();
    let again = t.receive(&q, 10, Duration::from_secs(5)).await.unwrap();
    let mut ids: Vec<&str> = again
        .iter()
        .map(|m| {
            assert_eq!(m.delivery_count, 1, "a fresh delivery count");
            m.message_id.as_str()
        })
        .collect();
    ids.sort_unstable();
    let mut expected = vec![bad.message_id.as_str(), "c"];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    // Dead-letter both, then requeue all of them.
    for m in &again {
        t.dead_letter(m, "X", "y").await.unwrap();
    }
    assert_eq!(depth(t.depths().await.unwrap(), "work").dead_lettered, 2);
    assert_eq!(t.requeue_dead_letters(&q, None).await.unwrap(), 2);
    let d = depth(t.depths().await.unwrap(), "work");
    assert_eq!((d.ready, d.locked, d.dead_lettered), (2, 0, 0), "{d:?}");
}

#[tokio::test]
async fn sqlite_depths_and_requeue() {
    let f = crate::fixtures::sqlite_factory(orderly_core::TimeSource::Database);
    let store = orderly_sql::SqliteStore::open(&f.url(), orderly_core::TimeSource::Database)
        .await
        .unwrap();
    depths_and_requeue(store).await;
    orderly_testkit::store::StoreFactory::cleanup(&f).await;
}

#[tokio::test]
async fn postgres_depths_and_requeue() {
    let f = crate::fixtures::pg_factory(orderly_core::TimeSource::Database).await;
    depths_and_requeue(f.store().await).await;
    orderly_testkit::store::StoreFactory::cleanup(&f).await;
}
