//! Consuming in the transaction that acts: on the SQL queue (the store's own database)
//! a batch of submissions or step writes ends the deliveries of the messages that asked
//! for them in its own transaction, exactly for the items it settled for good; a
//! message it could not end (lock lost, another transport's, a failed batch) stays the
//! caller's, and nothing is lost or applied twice.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::step::StepStatus;
use orderly_core::store::{
    ClaimRequest, Consumed, StateStore, StepUpdate, StepWrite, Submission, SubmitOutcome,
};
use orderly_core::transport::{
    Envelope, LockToken, OutgoingMessage, QueueName, QueueSettings, ReceivedMessage, Transport,
    TransportError,
};
use orderly_core::{Error, Fence, InstanceId, ManualClock, TimeSource};
use orderly_sql::{Delivery, SqliteStore};
use orderly_testkit::builders;
use orderly_testkit::store::StoreFactory;

use crate::fixtures::{pg_factory, sqlite_factory};

trait StoreAndQueue: StateStore + Transport {}
impl<T: StateStore + Transport> StoreAndQueue for T {}

const MINUTE: Duration = Duration::from_secs(60);

fn queue(name: &str) -> QueueName {
    QueueName::parse(name).unwrap()
}

/// Sends one message per id to `q` and receives them all (in order).
async fn held(t: &dyn Transport, q: &QueueName, ids: &[&str]) -> Vec<ReceivedMessage> {
    let messages: Vec<_> = ids
        .iter()
        .map(|id| OutgoingMessage::new(*id, id.as_bytes().to_vec()))
        .collect();
    t.send(q, &messages).await.unwrap();
    let got = t.receive(q, 100, Duration::ZERO).await.unwrap();
    assert_eq!(
        got.iter()
            .map(|m| m.message_id.as_str())
            .collect::<Vec<_>>(),
        ids
    );
    got
}

/// The ids `q` delivers again once every lock has run out.
async fn redelivered(t: &dyn Transport, clock: &ManualClock, q: &QueueName) -> Vec<String> {
    clock.advance(QueueSettings::default().lock_duration + Duration::from_secs(1));
    let got = t.receive(q, 100, Duration::ZERO).await.unwrap();
    for m in &got {
        t.complete(m).await.unwrap();
    }
    got.into_iter().map(|m| m.message_id).collect()
}

/// The write that records step `expect` of `fence`'s order done (key `{key}-{expect}`)
/// and sends `sends`.
fn succeeded(fence: &Fence, expect: i32, key: &str, sends: Vec<Envelope>) -> StepWrite {
    StepWrite {
        complete: false,
        fence: fence.clone(),
        expect_step: Some(expect),
        updates: vec![StepUpdate {
            index: expect,
            name: format!("step-{expect}"),
            status: StepStatus::Succeeded,
            detail: None,
            idempotency_key: format!("{key}-{expect}"),
            irreversible: false,
        }],
        sends,
    }
}

fn submission(order: orderly_core::store::NewOrder) -> Submission {
    Submission {
        order,
        sends: Vec::new(),
    }
}

fn lock_lost(m: &ReceivedMessage) -> ReceivedMessage {
    ReceivedMessage {
        lock_token: LockToken(uuid::Uuid::new_v4().to_string()),
        ..m.clone()
    }
}

async fn check(store: Arc<dyn StoreAndQueue>, outbox: Arc<dyn StoreAndQueue>, clock: ManualClock) {
    let orders = queue("orders");
    store
        .ensure_queue(&orders, &QueueSettings::default())
        .await
        .unwrap();
    let actor = builders::submitter();

    // Submissions: accepted and duplicate end their messages; a conflict (dead-lettered
    // by the caller) and a delivery whose lock was lost do not.
    let a = builders::order(1);
    let conflict = orderly_core::store::NewOrder {
        details: builders::details(2),
        ..a.clone()
    };
    let b = builders::order(3);
    let m = held(&*store, &orders, &["a", "a-again", "conflict", "b"]).await;
    let messages = [m[0].clone(), m[1].clone(), m[2].clone(), lock_lost(&m[3])];
    let batch = [
        submission(a.clone()),
        submission(a.clone()),
        submission(conflict),
        submission(b.clone()),
    ];
    let Consumed { outcomes, consumed } = store
        .submit_consuming(&batch, &actor, &messages)
        .await
        .unwrap();
    assert!(
        matches!(outcomes[0], Ok(SubmitOutcome::Accepted)),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[1], Ok(SubmitOutcome::Duplicate)),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[2], Err(Error::OrderIdConflict(_))),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[3], Ok(SubmitOutcome::Accepted)),
        "{outcomes:?}"
    );
    assert_eq!(consumed, [true, true, false, false]);
    // Consumed: settling again finds the lock gone. Not consumed: still held.
    assert!(matches!(
        Transport::complete(&*store, &m[0]).await,
        Err(TransportError::LockLost { .. })
    ));
    Transport::complete(&*store, &m[2]).await.unwrap();
    // The lost hold's message comes back (its order is then a duplicate); nothing else.
    assert_eq!(redelivered(&*store, &clock, &orders).await, ["b"]);

    // A batch that fails commits nothing and ends no delivery.
    let nowhere = Submission {
        order: builders::order(4),
        sends: vec![Envelope {
            queue: queue("no-such-queue"),
            message: OutgoingMessage::new("n", b"n".to_vec()),
        }],
    };
    let m = held(&*store, &orders, &["failing"]).await;
    assert!(
        store
            .submit_consuming(&[nowhere], &actor, &m)
            .await
            .is_err()
    );
    Transport::complete(&*store, &m[0]).await.unwrap();

    // One message per item, or nothing is done.
    let refused = store
        .submit_consuming(&[submission(builders::order(5))], &actor, &[])
        .await;
    assert!(
        matches!(&refused, Err(Error::Invalid(v)) if v.field == "messages"),
        "{refused:?}"
    );

    // Step writes: applied and refused for good (a stale step) both end their reply.
    let replies = queue("replies");
    store
        .ensure_queue(&replies, &QueueSettings::default())
        .await
        .unwrap();
    let owner = InstanceId::parse("scheduler-consume").unwrap();
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: owner.clone(),
            limit: 10,
            timeout: MINUTE,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let write = |fence: &Fence, expect: i32| succeeded(fence, expect, "key", Vec::new());
    let m = held(&*store, &replies, &["applied", "stale"]).await;
    let writes = [write(&claimed[0].fence, 0), write(&claimed[1].fence, 5)];
    let Consumed { outcomes, consumed } = store.record_steps_consuming(&writes, &m).await.unwrap();
    assert!(outcomes[0].is_ok(), "{outcomes:?}");
    assert!(
        matches!(outcomes[1], Err(Error::StaleStep { .. })),
        "{outcomes:?}"
    );
    assert_eq!(consumed, [true, true]);
    let steps = store.steps(&claimed[0].fence.order_id).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, StepStatus::Succeeded);
    assert!(redelivered(&*store, &clock, &replies).await.is_empty());

    // A store whose messages go through the outbox (another transport) ends nothing.
    let m = held(&*store, &orders, &["via-outbox"]).await;
    let Consumed { outcomes, consumed } = outbox
        .submit_consuming(&[submission(builders::order(6))], &actor, &m)
        .await
        .unwrap();
    assert!(matches!(outcomes[0], Ok(SubmitOutcome::Accepted)));
    assert_eq!(consumed, [false]);
    Transport::complete(&*store, &m[0]).await.unwrap();
}

/// Taking messages and acting on them in one transaction. Replies: the write `plan`
/// gives for a message is applied with its sends and ends that message; a write refused
/// for good ends it too; a message without a write stays held by the caller; a message
/// out of deliveries first in line is dead-lettered and what comes after is the
/// caller's. Orders: accepted and duplicates end their messages, a conflict does not.
/// `one_statement`: the dialect takes in one statement that also dead-letters
/// (PostgreSQL), so what follows a dead-lettered message is acted on in the same
/// transaction; otherwise (SQLite) it is handed over held.
async fn check_take(
    store: Arc<dyn StoreAndQueue>,
    outbox: Arc<dyn StoreAndQueue>,
    clock: ManualClock,
    one_statement: bool,
) {
    let actor = builders::submitter();
    for n in 10..12 {
        store
            .submit(&builders::order(n), &actor, &[])
            .await
            .unwrap();
    }
    let (replies, next) = (queue("replies"), queue("agent.next"));
    for q in [&replies, &next] {
        store
            .ensure_queue(q, &QueueSettings::default())
            .await
            .unwrap();
    }
    let owner = InstanceId::parse("scheduler-take").unwrap();
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: owner.clone(),
            limit: 10,
            timeout: MINUTE,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let write = |fence: &Fence, expect: i32| {
        let next = Envelope {
            queue: queue("agent.next"),
            message: OutgoingMessage::new(format!("next-{}", fence.order_id), b"n".to_vec()),
        };
        succeeded(fence, expect, "take", vec![next])
    };
    let (a, b) = (claimed[0].fence.clone(), claimed[1].fence.clone());
    let plan = move |m: &ReceivedMessage| match m.message_id.as_str() {
        "applied" => Some(write(&a, 0)),
        "stale" => Some(write(&b, 5)),
        _ => None,
    };
    let sent: Vec<_> = ["applied", "stale", "left"]
        .iter()
        .map(|id| OutgoingMessage::new(*id, id.as_bytes().to_vec()))
        .collect();
    store.send(&replies, &sent).await.unwrap();
    let taken = store
        .take_and_record(&replies, 10, Duration::ZERO, &plan)
        .await
        .unwrap()
        .expect("a store on its own queue takes and records");
    let ids: Vec<&str> = taken
        .messages
        .iter()
        .map(|m| m.message_id.as_str())
        .collect();
    assert_eq!(ids, ["applied", "stale", "left"]);
    assert!(
        matches!(&taken.recorded[0], Some((Ok(()), true))),
        "{:?}",
        taken.recorded
    );
    assert!(
        matches!(
            &taken.recorded[1],
            Some((Err(Error::StaleStep { .. }), true))
        ),
        "{:?}",
        taken.recorded
    );
    assert!(taken.recorded[2].is_none(), "{:?}", taken.recorded);
    // Applied with its send; the stale write changed nothing and sent nothing.
    let steps = store.steps(&claimed[0].fence.order_id).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, StepStatus::Succeeded);
    assert!(
        store
            .steps(&claimed[1].fence.order_id)
            .await
            .unwrap()
            .is_empty()
    );
    let requests = store.receive(&next, 10, Duration::ZERO).await.unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].message_id,
        format!("next-{}", claimed[0].fence.order_id)
    );
    Transport::complete(&*store, &requests[0]).await.unwrap();
    // Consumed messages are gone; the one without a write is still held: no receive
    // and no take delivers it while its lock holds, and it comes back when it ends.
    assert!(matches!(
        Transport::complete(&*store, &taken.messages[0]).await,
        Err(TransportError::LockLost { .. })
    ));
    let take_now = async || {
        store
            .take_and_record(&replies, 10, Duration::ZERO, &plan)
            .await
            .unwrap()
            .unwrap()
    };
    let nothing = store.receive(&replies, 10, Duration::ZERO).await.unwrap();
    assert!(nothing.is_empty(), "{nothing:?}");
    let again = take_now().await;
    assert!(again.messages.is_empty(), "{:?}", again.messages);
    clock.advance(QueueSettings::default().lock_duration + Duration::from_secs(1));
    let back = take_now().await;
    let ids: Vec<_> = back
        .messages
        .iter()
        .map(|m| (m.message_id.as_str(), m.delivery_count))
        .collect();
    assert_eq!(ids, [("left", 2)]);
    // The first delivery's lock ended: its settle is refused; the second's holds.
    assert!(matches!(
        Transport::complete(&*store, &taken.messages[2]).await,
        Err(TransportError::LockLost { .. })
    ));
    Transport::complete(&*store, &back.messages[0])
        .await
        .unwrap();

    // Nothing there: empty, after the wait.
    let empty = take_now().await;
    assert!(empty.messages.is_empty() && empty.recorded.is_empty());

    // A waiting taker gets a reply sent while it waits.
    let sender = store.clone();
    let later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sender
            .send(
                &queue("replies"),
                &[OutgoingMessage::new("late", b"l".to_vec())],
            )
            .await
            .unwrap();
    });
    let waited = store
        .take_and_record(&replies, 10, Duration::from_secs(30), &plan)
        .await
        .unwrap()
        .unwrap();
    later.await.unwrap();
    assert_eq!(waited.messages.len(), 1);
    assert_eq!(waited.messages[0].message_id, "late");
    Transport::complete(&*store, &waited.messages[0])
        .await
        .unwrap();

    // Out of deliveries and first in line: dead-lettered; the rest acted on (one
    // statement) or held and nothing recorded.
    let poison_q = queue("replies.poison");
    store
        .ensure_queue(
            &poison_q,
            &QueueSettings {
                max_delivery_count: 1,
                ..QueueSettings::default()
            },
        )
        .await
        .unwrap();
    let m = held(&*store, &poison_q, &["poison"]).await;
    store.abandon(&m[0]).await.unwrap();
    store
        .send(&poison_q, &[OutgoingMessage::new("applied", b"a".to_vec())])
        .await
        .unwrap();
    let taken = store
        .take_and_record(&poison_q, 10, Duration::ZERO, &plan)
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<&str> = taken
        .messages
        .iter()
        .map(|m| m.message_id.as_str())
        .collect();
    assert_eq!(ids, ["applied"]);
    if one_statement {
        // Acted on (its step was recorded above: stale) and consumed with it.
        assert!(
            matches!(
                &taken.recorded[0],
                Some((Err(Error::StaleStep { .. }), true))
            ),
            "{:?}",
            taken.recorded
        );
        assert!(
            Transport::complete(&*store, &taken.messages[0])
                .await
                .is_err(),
            "consumed with the change, not held"
        );
    } else {
        assert!(taken.recorded[0].is_none());
        Transport::complete(&*store, &taken.messages[0])
            .await
            .unwrap();
    }
    let dead = store.dead_letters(&poison_q, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.message_id, "poison");

    // A store on the outbox does not take: the caller receives.
    assert!(
        outbox
            .take_and_record(&replies, 10, Duration::ZERO, &plan)
            .await
            .unwrap()
            .is_none()
    );

    // Orders taken and submitted in one transaction: accepted and duplicate end their
    // messages; a conflict does not (the caller dead-letters it); a message without a
    // submission stays held.
    let orders = queue("orders");
    store
        .ensure_queue(&orders, &QueueSettings::default())
        .await
        .unwrap();
    let first = builders::order(20);
    let first_id = first.order_id.clone();
    let conflict = orderly_core::store::NewOrder {
        details: builders::details(21),
        ..first.clone()
    };
    let by_id = move |m: &ReceivedMessage| match m.message_id.as_str() {
        "new" | "again" => Some(submission(first.clone())),
        "conflict" => Some(submission(conflict.clone())),
        _ => None,
    };
    let sent: Vec<_> = ["new", "again", "conflict", "junk"]
        .iter()
        .map(|id| OutgoingMessage::new(*id, id.as_bytes().to_vec()))
        .collect();
    store.send(&orders, &sent).await.unwrap();
    let taken = store
        .take_and_submit(&orders, 10, Duration::ZERO, &actor, &by_id)
        .await
        .unwrap()
        .expect("a store on its own queue takes and submits");
    let ids: Vec<&str> = taken
        .messages
        .iter()
        .map(|m| m.message_id.as_str())
        .collect();
    assert_eq!(ids, ["new", "again", "conflict", "junk"]);
    let r = &taken.recorded;
    assert!(
        matches!(&r[0], Some((Ok(SubmitOutcome::Accepted), true))),
        "{r:?}"
    );
    assert!(
        matches!(&r[1], Some((Ok(SubmitOutcome::Duplicate), true))),
        "{r:?}"
    );
    assert!(
        matches!(&r[2], Some((Err(Error::OrderIdConflict(_)), false))),
        "{r:?}"
    );
    assert!(r[3].is_none(), "{r:?}");
    Transport::complete(&*store, &taken.messages[2])
        .await
        .unwrap();
    Transport::complete(&*store, &taken.messages[3])
        .await
        .unwrap();
    assert!(redelivered(&*store, &clock, &orders).await.is_empty());
    let view = store.get(&first_id).await.unwrap();
    assert_eq!(
        view.state.process_state,
        orderly_core::ProcessState::Pending
    );
    assert!(
        outbox
            .take_and_submit(&orders, 10, Duration::ZERO, &actor, &by_id)
            .await
            .unwrap()
            .is_none()
    );
}

/// The messages a batch of step writes causes, sent with it: to several queues at
/// once, each in the order the writes give them; at the time one was scheduled for;
/// none for a write refused; a queue that detects duplicates drops a repeated id as
/// it does for any send. A delivery whose lock was lost is not ended, though its write
/// applies (the caller's settle then fails, and a later redelivery finds the step
/// recorded); one still held is.
async fn check_sends(store: Arc<dyn StoreAndQueue>, clock: ManualClock) {
    let actor = builders::submitter();
    for n in 30..34 {
        store
            .submit(&builders::order(n), &actor, &[])
            .await
            .unwrap();
    }
    let (replies, a, b, dedup) = (
        queue("replies"),
        queue("agent.a"),
        queue("agent.b"),
        queue("agent.dedup"),
    );
    // As orderly creates them: replies and step requests detect no duplicates.
    for q in [&replies, &a, &b] {
        store
            .ensure_queue(
                q,
                &QueueSettings {
                    duplicate_detection_window: Duration::ZERO,
                    ..QueueSettings::default()
                },
            )
            .await
            .unwrap();
    }
    store
        .ensure_queue(&dedup, &QueueSettings::default())
        .await
        .unwrap();
    let claimed = store
        .claim(&ClaimRequest {
            workflows: Default::default(),
            owner: InstanceId::parse("scheduler-sends").unwrap(),
            limit: 10,
            timeout: 10 * MINUTE,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    let fences: Vec<Fence> = claimed.iter().map(|c| c.fence.clone()).collect();
    let to = |q: &QueueName, id: &str| Envelope {
        queue: q.clone(),
        message: OutgoingMessage::new(id, id.as_bytes().to_vec()),
    };
    let write = |fence: &Fence, expect: i32, sends| {
        succeeded(fence, expect, &format!("sends-{}", fence.order_id), sends)
    };
    let mut later = to(&a, "a-later");
    later.message.scheduled_enqueue_time =
        Some(orderly_core::Clock::now(&clock) + chrono::Duration::seconds(40));
    let writes = [
        write(&fences[0], 0, vec![to(&a, "a-1"), later]),
        write(&fences[1], 0, vec![to(&b, "b-1"), to(&b, "b-2")]),
        write(&fences[2], 5, vec![to(&a, "a-stale"), to(&b, "b-stale")]),
        write(&fences[3], 0, vec![to(&a, "a-2")]),
    ];
    let m = held(&*store, &replies, &["r0", "r1", "r2", "r3"]).await;
    let messages = [m[0].clone(), m[1].clone(), m[2].clone(), lock_lost(&m[3])];
    let Consumed { outcomes, consumed } = store
        .record_steps_consuming(&writes, &messages)
        .await
        .unwrap();
    assert!(
        outcomes[0].is_ok() && outcomes[1].is_ok() && outcomes[3].is_ok(),
        "{outcomes:?}"
    );
    assert!(
        matches!(outcomes[2], Err(Error::StaleStep { .. })),
        "{outcomes:?}"
    );
    assert_eq!(consumed, [true, true, true, false]);
    for f in [&fences[0], &fences[1], &fences[3]] {
        let steps = store.steps(&f.order_id).await.unwrap();
        assert_eq!(steps.len(), 1, "{}", f.order_id);
        assert_eq!(steps[0].status, StepStatus::Succeeded);
    }
    assert!(store.steps(&fences[2].order_id).await.unwrap().is_empty());
    let ids = |got: &[ReceivedMessage]| -> Vec<String> {
        got.iter().map(|m| m.message_id.clone()).collect()
    };
    let got_a = store.receive(&a, 10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got_a), ["a-1", "a-2"]);
    let got_b = store.receive(&b, 10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got_b), ["b-1", "b-2"]);
    for got in got_a.iter().chain(&got_b) {
        Transport::complete(&*store, got).await.unwrap();
    }
    // The lost hold is still the queue's: its holder settles it.
    Transport::complete(&*store, &m[3]).await.unwrap();
    // The scheduled one, at its time; the ended replies are gone for good.
    clock.advance(Duration::from_secs(41));
    let got_a = store.receive(&a, 10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got_a), ["a-later"]);
    Transport::complete(&*store, &got_a[0]).await.unwrap();
    assert!(redelivered(&*store, &clock, &replies).await.is_empty());

    // To a queue that detects duplicates: an id sent again within its window is dropped.
    let m = held(&*store, &replies, &["r4", "r5"]).await;
    let writes = [
        write(&fences[0], 1, vec![to(&dedup, "d-1")]),
        write(&fences[1], 1, vec![to(&dedup, "d-1"), to(&a, "a-3")]),
    ];
    let Consumed { outcomes, consumed } = store.record_steps_consuming(&writes, &m).await.unwrap();
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(consumed, [true, true]);
    let got = store.receive(&dedup, 10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got), ["d-1"]);
    Transport::complete(&*store, &got[0]).await.unwrap();
    let got = store.receive(&a, 10, Duration::ZERO).await.unwrap();
    assert_eq!(ids(&got), ["a-3"]);
    Transport::complete(&*store, &got[0]).await.unwrap();
}

/// Runs `check` on a SQLite store on its own queue and one on the outbox, over one file.
async fn on_sqlite<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn StoreAndQueue>, Arc<dyn StoreAndQueue>, ManualClock) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let clock = ManualClock::starting_now();
    let f = sqlite_factory(TimeSource::Clock(Arc::new(clock.clone())));
    let open = |delivery| {
        let (url, time) = (f.url(), f.time.clone());
        async move {
            Arc::new(
                SqliteStore::open(&url, time)
                    .await
                    .unwrap()
                    .with_delivery(delivery),
            ) as Arc<dyn StoreAndQueue>
        }
    };
    check(
        open(Delivery::Queue).await,
        open(Delivery::Outbox).await,
        clock,
    )
    .await;
    StoreFactory::cleanup(&f).await;
}

/// [`on_sqlite`] on a PostgreSQL schema.
async fn on_postgres<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn StoreAndQueue>, Arc<dyn StoreAndQueue>, ManualClock) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let clock = ManualClock::starting_now();
    let f = pg_factory(TimeSource::Clock(Arc::new(clock.clone()))).await;
    let store = Arc::new(f.store().await) as Arc<dyn StoreAndQueue>;
    let outbox =
        Arc::new(f.store().await.with_delivery(Delivery::Outbox)) as Arc<dyn StoreAndQueue>;
    check(store, outbox, clock).await;
    StoreFactory::cleanup(&f).await;
}

#[tokio::test]
async fn sqlite_consumes_the_messages_of_what_it_records() {
    on_sqlite(check).await;
}

#[tokio::test]
async fn postgres_consumes_the_messages_of_what_it_records() {
    on_postgres(check).await;
}

#[tokio::test]
async fn sqlite_takes_and_acts_in_one_transaction() {
    on_sqlite(|s, o, c| check_take(s, o, c, false)).await;
}

#[tokio::test]
async fn postgres_takes_and_acts_in_one_transaction() {
    on_postgres(|s, o, c| check_take(s, o, c, true)).await;
}

#[tokio::test]
async fn sqlite_sends_what_a_batch_of_step_writes_causes_with_it() {
    on_sqlite(|s, _, c| check_sends(s, c)).await;
}

#[tokio::test]
async fn postgres_sends_what_a_batch_of_step_writes_causes_with_it() {
    on_postgres(|s, _, c| check_sends(s, c)).await;
}
