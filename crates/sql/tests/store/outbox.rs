//! The transactional outbox and its relay: messages of state changes reach an external
//! transport at least once, and exactly once where the target drops repeated message
//! ids. The target here is a real SQL queue in another database.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use orderly_core::store::{StateStore, SubmitOutcome};
use orderly_core::transport::{
    Envelope, Outbox, OutgoingMessage, QueueName, QueueSettings, Transport,
};
use orderly_core::{Error, InstanceId, ManualClock, TimeSource};
use orderly_sql::{Delivery, PgStore, SqliteStore};
use orderly_testkit::builders;
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{pg_factory, sqlite_factory};

trait StoreWithOutbox: StateStore + Outbox {}
impl<T: StateStore + Outbox> StoreWithOutbox for T {}

type Reset = Box<dyn Fn(&'static str) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

fn envelope(queue: &str, id: &str) -> Envelope {
    Envelope {
        queue: QueueName::parse(queue).unwrap(),
        message: OutgoingMessage::new(id, id.as_bytes().to_vec()),
    }
}

async fn drain(t: &dyn Transport, queue: &str) -> Vec<String> {
    let q = QueueName::parse(queue).unwrap();
    let mut ids = Vec::new();
    loop {
        let got = t.receive(&q, 100, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return ids;
        }
        for m in got {
            t.complete(&m).await.unwrap();
            ids.push(m.message_id);
        }
    }
}

/// A relay waiting between passes is woken by a state change that wrote to the outbox,
/// also one committed before it began to wait; a change that sends nothing does not.
async fn check_wakes(source: Arc<dyn StoreWithOutbox>) {
    const LONG: Duration = Duration::from_secs(60);
    const SOON: Duration = Duration::from_secs(10);
    // A write before the wait: its signal is kept.
    let sends = [envelope("client-replies", "wake-1")];
    source
        .submit(&builders::order(101), &builders::submitter(), &sends)
        .await
        .unwrap();
    tokio::time::timeout(SOON, source.wait_written(LONG))
        .await
        .expect("woken by the write before the wait");
    // A change without messages is no reason to wake.
    source
        .submit(&builders::order(102), &builders::submitter(), &[])
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), source.wait_written(LONG))
            .await
            .is_err(),
        "nothing was written to the outbox"
    );
    // A write while waiting.
    let waiter = {
        let source = source.clone();
        tokio::spawn(async move { source.wait_written(LONG).await })
    };
    let sends = [envelope("client-replies", "wake-3")];
    source
        .submit(&builders::order(103), &builders::submitter(), &sends)
        .await
        .unwrap();
    tokio::time::timeout(SOON, waiter)
        .await
        .expect("woken by the write during the wait")
        .unwrap();
}

async fn check_all(
    open: impl Fn() -> Pin<Box<dyn Future<Output = Arc<dyn StoreWithOutbox>> + Send>>,
    clock: ManualClock,
    forget_sent: Reset,
) {
    let target_file = sqlite_factory(TimeSource::Database);
    let target = SqliteStore::open(&target_file.url(), TimeSource::Database)
        .await
        .unwrap();
    target
        .declare_queue(
            &QueueName::parse("client-replies").unwrap(),
            &QueueSettings::default(),
        )
        .await
        .unwrap();
    let source = open().await;
    let relay = InstanceId::parse("relay-1").unwrap();

    // The message waits in the outbox until a relay publishes it.
    let order = builders::order(1);
    let sends = [envelope("client-replies", "received-1")];
    assert_eq!(
        source
            .submit(&order, &builders::submitter(), &sends)
            .await
            .unwrap(),
        SubmitOutcome::Accepted
    );
    assert_eq!(source.outbox_backlog().await.unwrap(), 1);
    assert!(drain(&target, "client-replies").await.is_empty());
    let outcome = source.relay_once(&relay, &target, 10).await.unwrap();
    assert_eq!((outcome.sent, outcome.failed), (1, 0));
    assert_eq!(source.outbox_backlog().await.unwrap(), 0);
    assert_eq!(drain(&target, "client-replies").await, ["received-1"]);
    assert_eq!(
        source.relay_once(&relay, &target, 10).await.unwrap().sent,
        0,
        "sent once"
    );

    // A message that cannot be part of the change rolls the change back.
    let bad = builders::order(2);
    let invalid = [envelope("client-replies", "")];
    assert!(matches!(
        source.submit(&bad, &builders::submitter(), &invalid).await,
        Err(Error::Send(_))
    ));
    assert!(matches!(
        source.get(&bad.order_id).await,
        Err(Error::OrderNotFound(_))
    ));
    assert_eq!(source.outbox_backlog().await.unwrap(), 0);

    // The target has no such queue: set aside at once as a dead letter with the reason
    // (not retried forever, not lost), published again on an operator's requeue.
    let second = builders::order(3);
    source
        .submit(
            &second,
            &builders::submitter(),
            &[envelope("alerts", "alert-3")],
        )
        .await
        .unwrap();
    let outcome = source.relay_once(&relay, &target, 10).await.unwrap();
    assert_eq!((outcome.sent, outcome.failed, outcome.dead), (0, 0, 1));
    assert_eq!(source.outbox_backlog().await.unwrap(), 0);
    let dead = source.outbox_dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(source.outbox_dead_count().await.unwrap(), 1);
    assert_eq!(
        (dead[0].queue.as_str(), dead[0].message_id.as_str()),
        ("alerts", "alert-3")
    );
    assert!(
        dead[0].reason.contains("QueueNotFound"),
        "{}",
        dead[0].reason
    );
    assert_eq!(
        source.relay_once(&relay, &target, 10).await.unwrap().sent,
        0
    );
    target
        .declare_queue(
            &QueueName::parse("alerts").unwrap(),
            &QueueSettings::default(),
        )
        .await
        .unwrap();
    assert_eq!(source.requeue_outbox_dead_letters().await.unwrap(), 1);
    assert!(source.outbox_dead_letters(10).await.unwrap().is_empty());
    assert_eq!(
        source.relay_once(&relay, &target, 10).await.unwrap().sent,
        1
    );
    assert_eq!(drain(&target, "alerts").await, ["alert-3"]);

    // A target that keeps failing: retried after a back-off each time, then set aside
    // after OUTBOX_MAX_ATTEMPTS attempts.
    source
        .submit(
            &builders::order(4),
            &builders::submitter(),
            &[envelope("client-replies", "stuck-4")],
        )
        .await
        .unwrap();
    let down = Down;
    for attempt in 1..=orderly_core::transport::OUTBOX_MAX_ATTEMPTS {
        let outcome = source.relay_once(&relay, &down, 10).await.unwrap();
        if attempt < orderly_core::transport::OUTBOX_MAX_ATTEMPTS {
            assert_eq!((outcome.failed, outcome.dead), (1, 0), "attempt {attempt}");
            assert_eq!(
                source.relay_once(&relay, &down, 10).await.unwrap().failed,
                0,
                "waits for its back-off"
            );
        } else {
            assert_eq!((outcome.failed, outcome.dead), (0, 1));
        }
        clock.advance(Duration::from_secs(6));
    }
    let dead = source.outbox_dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].reason.contains("gave up after 20 attempts"),
        "{}",
        dead[0].reason
    );
    assert_eq!(
        dead[0].attempts,
        orderly_core::transport::OUTBOX_MAX_ATTEMPTS
    );
    assert_eq!(source.outbox_backlog().await.unwrap(), 0);

    // The relay published but its "sent" mark was lost (a crash): it publishes again,
    // and the target drops the repeat by message id.
    forget_sent("alert-3").await;
    assert_eq!(source.outbox_backlog().await.unwrap(), 1);
    clock.advance(Duration::from_secs(31));
    assert_eq!(
        source.relay_once(&relay, &target, 10).await.unwrap().sent,
        1
    );
    assert!(drain(&target, "alerts").await.is_empty(), "delivered once");

    // Several relays at once publish every message once.
    for i in 0..60 {
        let order = builders::order(100 + i);
        source
            .submit(
                &order,
                &builders::submitter(),
                &[envelope("client-replies", &format!("bulk-{i}"))],
            )
            .await
            .unwrap();
    }
    let target = Arc::new(target);
    let mut relays = Vec::new();
    for r in 0..3 {
        let handle = open().await;
        let target = target.clone();
        relays.push(tokio::spawn(async move {
            let me = InstanceId::parse(format!("relay-{r}")).unwrap();
            let mut sent = 0;
            loop {
                let outcome = handle.relay_once(&me, &*target, 7).await.unwrap();
                if outcome.sent == 0 && handle.outbox_backlog().await.unwrap() == 0 {
                    break sent;
                }
                sent += outcome.sent;
            }
        }));
    }
    let mut total = 0;
    for r in relays {
        total += r.await.unwrap();
    }
    assert_eq!(total, 60, "each message leased by exactly one relay");
    let mut got = drain(&*target, "client-replies").await;
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 60);

    // Published rows are deleted after the retention period; dead letters stay.
    assert_eq!(
        source
            .prune_sent(Duration::from_secs(3600), 1000)
            .await
            .unwrap(),
        0,
        "too young"
    );
    clock.advance(Duration::from_secs(2 * 3600));
    let pruned = source
        .prune_sent(Duration::from_secs(3600), 1000)
        .await
        .unwrap();
    assert_eq!(
        pruned, 62,
        "every published row: received-1, alert-3 and the 60"
    );
    assert_eq!(source.outbox_dead_letters(10).await.unwrap().len(), 1);
    StoreFactory::cleanup(&target_file).await;
}

/// A target transport that is down: every call fails as unavailable.
struct Down;

fn down<T>() -> Result<T, orderly_core::transport::TransportError> {
    Err(orderly_core::transport::TransportError::Unavailable(
        "the target is down".into(),
    ))
}

#[async_trait::async_trait]
impl Transport for Down {
    async fn declare_queue(
        &self,
        _: &QueueName,
        _: &QueueSettings,
    ) -> Result<(), orderly_core::transport::TransportError> {
        down()
    }
    async fn ensure_queue(
        &self,
        _: &QueueName,
        _: &QueueSettings,
    ) -> Result<bool, orderly_core::transport::TransportError> {
        down()
    }
    async fn send(
        &self,
        _: &QueueName,
        _: &[OutgoingMessage],
    ) -> Result<orderly_core::transport::SendOutcome, orderly_core::transport::TransportError> {
        down()
    }
    async fn receive(
        &self,
        _: &QueueName,
        _: u32,
        _: Duration,
    ) -> Result<
        Vec<orderly_core::transport::ReceivedMessage>,
        orderly_core::transport::TransportError,
    > {
        down()
    }
    async fn complete(
        &self,
        _: &orderly_core::transport::ReceivedMessage,
    ) -> Result<(), orderly_core::transport::TransportError> {
        down()
    }
    async fn abandon(
        &self,
        _: &orderly_core::transport::ReceivedMessage,
    ) -> Result<(), orderly_core::transport::TransportError> {
        down()
    }
    async fn dead_letter(
        &self,
        _: &orderly_core::transport::ReceivedMessage,
        _: &str,
        _: &str,
    ) -> Result<(), orderly_core::transport::TransportError> {
        down()
    }
    async fn renew_lock(
        &self,
        _: &orderly_core::transport::ReceivedMessage,
    ) -> Result<chrono::DateTime<chrono::Utc>, orderly_core::transport::TransportError> {
        down()
    }
    async fn dead_letters(
        &self,
        _: &QueueName,
        _: u32,
    ) -> Result<Vec<orderly_core::transport::DeadLetter>, orderly_core::transport::TransportError>
    {
        down()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_outbox_messages_reach_the_target_once() {
    let clock = ManualClock::starting_now();
    let f = Arc::new(sqlite_factory(TimeSource::Clock(Arc::new(clock.clone()))));
    let (url, time) = (f.url(), f.time.clone());
    let open = move || {
        let (url, time) = (url.clone(), time.clone());
        Box::pin(async move {
            let store = SqliteStore::open(&url, time)
                .await
                .unwrap()
                .with_delivery(Delivery::Outbox);
            Arc::new(store) as Arc<dyn StoreWithOutbox>
        }) as Pin<Box<dyn Future<Output = Arc<dyn StoreWithOutbox>> + Send>>
    };
    let url = f.url();
    let forget: Reset = Box::new(move |id| {
        let url = url.clone();
        Box::pin(async move {
            let store = SqliteStore::open(&url, TimeSource::Database).await.unwrap();
            sqlx::query(
                "UPDATE outbox SET sent_at = NULL, leased_until = NULL WHERE message_id = $1",
            )
            .bind(id)
            .execute(store.pool())
            .await
            .unwrap();
        })
    });
    check_all(&open, clock, forget).await;
    check_wakes(open().await).await;
    StoreFactory::cleanup(&*f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_outbox_messages_reach_the_target_once() {
    let clock = ManualClock::starting_now();
    let f = Arc::new(pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await);
    let opener = f.clone();
    let open = move || {
        let f = opener.clone();
        Box::pin(async move {
            Arc::new(f.store().await.with_delivery(Delivery::Outbox)) as Arc<dyn StoreWithOutbox>
        }) as Pin<Box<dyn Future<Output = Arc<dyn StoreWithOutbox>> + Send>>
    };
    let resetter = f.clone();
    let forget: Reset = Box::new(move |id| {
        let f = resetter.clone();
        Box::pin(async move {
            let store: PgStore = f.store().await;
            sqlx::query(
                "UPDATE outbox SET sent_at = NULL, leased_until = NULL WHERE message_id = $1",
            )
            .bind(id)
            .execute(store.pool())
            .await
            .unwrap();
        })
    });
    check_all(&open, clock, forget).await;
    check_wakes(open().await).await;
    StoreFactory::cleanup(&*f).await;
}
