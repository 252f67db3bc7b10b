//! Conformance cases for settling under load and misuse: concurrent consumers, lost
//! locks, renewals, duplicates, scheduled messages, bad requests, batched settling,
//! poison messages, long work, and queues made on demand.

use super::{
    DELIVERY_BOUND, NO_WAIT, TransportCtx, declared, msg, queue, receive_n, receive_one,
    receive_until, settings,
};
use orderly_core::Clock;
use orderly_core::transport::{
    MAX_BODY_BYTES, OutgoingMessage, QueueSettings, ReceivedMessage, TransportError,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Competing consumers: every message to exactly one of them.
pub async fn concurrent_consumers_receive_disjoint_messages(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "work", settings(60, 10)).await;
    let sent: Vec<OutgoingMessage> = (0..300).map(|i| msg(&format!("m-{i}"), "x")).collect();
    for chunk in sent.chunks(50) {
        t.send(&q, chunk).await.unwrap();
    }
    // Each consumer takes until all 300 are consumed (by anyone), waiting a little
    // when it finds none: a transport may deliver what was sent a moment later.
    let consumed = Arc::new(AtomicUsize::new(0));
    let deadline = tokio::time::Instant::now() + DELIVERY_BOUND;
    let mut consumers = Vec::new();
    for _ in 0..4 {
        let handle = ctx.factory.open().await;
        let q = q.clone();
        let consumed = consumed.clone();
        consumers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while consumed.load(Ordering::SeqCst) < 300 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} of 300 consumed within {DELIVERY_BOUND:?}",
                    consumed.load(Ordering::SeqCst)
                );
                let got = handle
                    .receive(&q, 7, Duration::from_millis(200))
                    .await
                    .unwrap();
                for m in got {
                    handle.complete(&m).await.unwrap();
                    consumed.fetch_add(1, Ordering::SeqCst);
                    mine.push(m.message_id);
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for c in consumers {
        all.extend(c.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a message went to two consumers");
    assert_eq!(all.len(), 300, "every message consumed");
}

/// Settling with a lost lock fails loudly instead of pretending.
pub async fn settling_after_the_lock_was_lost_is_an_error(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "steps", settings(30, 10)).await;
    t.send(&q, &[msg("m", "x")]).await.unwrap();
    let stale = receive_one(&*t, &q).await;
    ctx.clock.advance(Duration::from_secs(31));
    let lost = |r: Result<(), TransportError>| {
        assert!(matches!(r, Err(TransportError::LockLost { .. })), "{r:?}")
    };
    lost(t.complete(&stale).await);
    lost(t.abandon(&stale).await);
    lost(t.renew_lock(&stale).await.map(|_| ()));
    lost(t.dead_letter(&stale, "Late", "too late").await);
    let verdicts = t
        .complete_messages(std::slice::from_ref(&stale))
        .await
        .unwrap();
    lost(verdicts.into_iter().next().unwrap());
    let replies = queue("late-replies");
    t.declare_queue(&replies, &settings(30, 10)).await.unwrap();
    let verdicts = t
        .send_and_complete(
            &[orderly_core::transport::Envelope {
                queue: replies.clone(),
                message: msg("late-reply", "y"),
            }],
            std::slice::from_ref(&stale),
        )
        .await
        .unwrap();
    lost(verdicts.into_iter().next().unwrap());
    let late_reply = receive_one(&*t, &replies).await;
    assert_eq!(
        late_reply.message_id, "late-reply",
        "the send still went out"
    );
    t.complete(&late_reply).await.unwrap();
    let current = receive_one(&*t, &q).await;
    assert_eq!(
        current.delivery_count, 2,
        "the message was not settled by the stale holder"
    );
    lost(t.complete(&stale).await);
    t.complete(&current).await.unwrap();
    lost(t.complete(&current).await);
}

/// Long work renews its lock and keeps the message.
pub async fn renewing_the_lock_keeps_the_message_held(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "steps", settings(30, 10)).await;
    t.send(&q, &[msg("m", "x")]).await.unwrap();
    let m = receive_one(&*t, &q).await;
    ctx.clock.advance(Duration::from_secs(20));
    let until = t.renew_lock(&m).await.unwrap();
    assert_eq!(until, ctx.clock.now() + chrono::Duration::seconds(30));
    ctx.clock.advance(Duration::from_secs(20));
    assert!(
        t.receive(&q, 1, NO_WAIT).await.unwrap().is_empty(),
        "still held after 40 s thanks to the renewal"
    );
    t.complete(&m).await.unwrap();
}

/// Service Bus-style duplicate detection on message id. Judged by what is delivered:
/// Service Bus drops duplicates without telling the sender, so a transport may count
/// them as accepted.
pub async fn duplicate_message_ids_are_dropped_within_the_window(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "orders", QueueSettings::default()).await;
    // What is delivered up to and including a marker sent after the messages in
    // question (a message of another id, so never a duplicate): on a queue delivered in
    // send order, a repeat that was let through comes before its marker. Waited for,
    // so a transport that hands deliveries over asynchronously is judged by what it
    // delivered, not by how soon.
    let delivered_before = |marker: &'static str| {
        let t = t.clone();
        let q = q.clone();
        async move {
            t.send(&q, &[msg(marker, marker)]).await.unwrap();
            let got = receive_until(&*t, &q, 10, marker, |got| {
                got.iter().any(|m| m.message_id == marker)
            })
            .await;
            for m in &got {
                t.complete(m).await.unwrap();
            }
            got.iter()
                .filter(|m| m.message_id != marker)
                .map(|m| String::from_utf8_lossy(&m.body).into_owned())
                .collect::<Vec<String>>()
        }
    };
    let first = t
        .send(&q, &[msg("same", "1"), msg("same", "2")])
        .await
        .unwrap();
    assert_eq!(first.accepted + first.duplicates, 2);
    t.send(&q, &[msg("same", "3")]).await.unwrap();
    assert_eq!(delivered_before("marker-1").await, ["1"]);
    t.send(&q, &[msg("same", "4")]).await.unwrap();
    assert!(
        delivered_before("marker-2").await.is_empty(),
        "a repeat within the window is dropped"
    );
    ctx.clock.advance(Duration::from_secs(601));
    t.send(&q, &[msg("same", "5")]).await.unwrap();
    assert_eq!(
        delivered_before("marker-3").await,
        ["5"],
        "past the window the id is new again"
    );
}

/// A scheduled message waits for its time.
pub async fn scheduled_messages_stay_invisible_until_their_time(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "retries", QueueSettings::default()).await;
    let at = ctx.clock.now() + chrono::Duration::seconds(60);
    let mut later = msg("later", "x");
    later.scheduled_enqueue_time = Some(at);
    t.send(&q, &[later]).await.unwrap();
    assert!(t.receive(&q, 1, NO_WAIT).await.unwrap().is_empty());
    // Sent again to a queue already in use (a transport may send differently once it
    // knows the queue).
    let mut later_too = msg("later-too", "y");
    later_too.scheduled_enqueue_time = Some(at);
    t.send(&q, &[later_too]).await.unwrap();
    ctx.clock.advance(Duration::from_secs(59));
    assert!(t.receive(&q, 1, NO_WAIT).await.unwrap().is_empty());
    ctx.clock.advance(Duration::from_secs(1));
    let first = receive_one(&*t, &q).await;
    t.complete(&first).await.unwrap();
    let second = receive_one(&*t, &q).await;
    let mut ids = [first.message_id, second.message_id];
    ids.sort();
    assert_eq!(ids, ["later", "later-too"]);
}

/// Unknown queues, oversized payloads and bad arguments are typed errors; a batch with
/// one bad message sends nothing.
pub async fn bad_requests_are_refused_with_typed_errors_and_send_nothing(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "orders", QueueSettings::default()).await;
    let nowhere = queue("no-such-queue");
    assert!(
        matches!(t.send(&nowhere, &[msg("m", "x")]).await, Err(TransportError::QueueNotFound(n)) if n == nowhere)
    );
    assert!(matches!(
        t.receive(&nowhere, 1, NO_WAIT).await,
        Err(TransportError::QueueNotFound(_))
    ));
    let big = OutgoingMessage::new("big", vec![0u8; MAX_BODY_BYTES + 1]);
    match t.send(&q, &[msg("ok", "x"), big]).await {
        Err(TransportError::PayloadTooLarge { size, limit }) => assert!(size > limit),
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    assert!(
        t.receive(&q, 10, NO_WAIT).await.unwrap().is_empty(),
        "nothing of the refused batch was sent"
    );
    assert!(
        matches!(t.send(&q, &[msg("", "x")]).await, Err(TransportError::Invalid(e)) if e.field == "message_id")
    );
    assert!(
        matches!(t.receive(&q, 0, NO_WAIT).await, Err(TransportError::Invalid(e)) if e.field == "max")
    );
    let bad = QueueSettings {
        max_delivery_count: 0,
        ..QueueSettings::default()
    };
    assert!(
        matches!(t.declare_queue(&q, &bad).await, Err(TransportError::Invalid(e)) if e.field == "max_delivery_count")
    );
}

/// Batched completion: one verdict per message, matched on the delivery's own hold.
pub async fn complete_messages_settles_each_message_it_still_holds(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "replies", settings(30, 10)).await;
    t.send(&q, &[msg("a", "1"), msg("b", "2"), msg("c", "3")])
        .await
        .unwrap();
    let first = receive_one(&*t, &q).await;
    ctx.clock.advance(Duration::from_secs(31));
    // `a` is delivered again (new hold), and `b` and `c` (a receive returns what is
    // there once its first message is: collect up to three).
    let batch = receive_n(&*t, &q, 3).await;
    let mut settle: Vec<ReceivedMessage> = batch
        .iter()
        .filter(|m| m.message_id != "c")
        .cloned()
        .collect();
    settle.push(first.clone());
    let verdicts = t.complete_messages(&settle).await.unwrap();
    assert_eq!(verdicts.len(), 3);
    assert!(verdicts[0].is_ok() && verdicts[1].is_ok(), "{verdicts:?}");
    assert!(
        matches!(verdicts[2], Err(TransportError::LockLost { .. })),
        "the old hold on `a` is not honoured"
    );
    assert!(t.complete_messages(&[]).await.unwrap().is_empty());
    let c = batch.iter().find(|m| m.message_id == "c").unwrap();
    t.complete(c).await.unwrap();
    ctx.clock.advance(Duration::from_secs(3600));
    let left = t.receive(&q, 10, NO_WAIT).await.unwrap();
    let left: Vec<_> = left
        .iter()
        .map(|m| (m.message_id.as_str(), m.delivery_count))
        .collect();
    assert!(
        left.is_empty(),
        "all three settled exactly once, yet these came back: {left:?}"
    );
    assert!(
        t.receive(&q, 10, NO_WAIT).await.unwrap().is_empty(),
        "all three settled exactly once"
    );
}

/// Replies out and requests settled in one call; a stale hold gets `LockLost` and does
/// not hold back the sends. Both with the replies' queue detecting duplicates and
/// without (the transports may settle and send in one statement only without).
pub async fn send_and_complete_sends_and_settles_in_one_call(ctx: &TransportCtx) {
    let plain = QueueSettings {
        duplicate_detection_window: Duration::ZERO,
        ..settings(30, 10)
    };
    for (name, replies_settings) in [("checked", settings(30, 10)), ("plain", plain)] {
        send_and_complete_case(ctx, name, &replies_settings).await;
    }
}

async fn send_and_complete_case(ctx: &TransportCtx, name: &str, replies_settings: &QueueSettings) {
    use orderly_core::transport::Envelope;
    let (t, work) = declared(ctx, &format!("work-{name}"), settings(30, 10)).await;
    let replies = queue(&format!("replies-{name}"));
    t.declare_queue(&replies, replies_settings).await.unwrap();
    t.send(&work, &[msg("w1", "1"), msg("w2", "2"), msg("w3", "3")])
        .await
        .unwrap();
    let held = receive_n(&*t, &work, 2).await;
    let reply = |id: &str| Envelope {
        queue: replies.clone(),
        message: msg(id, "done"),
    };
    let verdicts = t
        .send_and_complete(&[reply("r1"), reply("r2")], &held)
        .await
        .unwrap();
    assert!(verdicts.iter().all(Result::is_ok), "{verdicts:?}");
    let got = receive_n(&*t, &replies, 2).await;
    t.complete_messages(&got).await.unwrap();
    let mut ids: Vec<_> = got.iter().map(|m| m.message_id.clone()).collect();
    ids.sort();
    assert_eq!(ids, ["r1", "r2"]);
    // A hold that lost its lock: the send still goes out, the verdict says LockLost.
    let stale = receive_one(&*t, &work).await;
    assert_eq!(stale.message_id, "w3");
    ctx.clock.advance(Duration::from_secs(31));
    let fresh = receive_one(&*t, &work).await;
    let verdicts = t
        .send_and_complete(&[reply("r3")], std::slice::from_ref(&stale))
        .await
        .unwrap();
    assert!(
        matches!(verdicts[0], Err(TransportError::LockLost { .. })),
        "{verdicts:?}"
    );
    let r3 = receive_one(&*t, &replies).await;
    assert_eq!(r3.message_id, "r3");
    t.complete(&fresh).await.unwrap();
    ctx.clock.advance(Duration::from_secs(3600));
    assert!(
        t.receive(&work, 10, NO_WAIT).await.unwrap().is_empty(),
        "{name}: w1 and w2 were completed"
    );
}

/// Poison handling: undecodable, invalid or oversized bodies are dead-lettered with a
/// reason that names the problem; the good messages around them are delivered.
pub async fn poison_messages_are_dead_lettered_with_the_problem_and_consuming_goes_on(
    ctx: &TransportCtx,
) {
    use orderly_core::transport::receive_json;
    let (t, q) = declared(ctx, "orders", QueueSettings::default()).await;
    let good = r#"{"customer_id":"c","currency":"EUR","lines":[{"sku":"a","quantity":1,"unit_price_minor":5}]}"#;
    let invalid = r#"{"customer_id":"c","currency":"EUR","lines":[{"sku":"a","quantity":0,"unit_price_minor":5}]}"#;
    let big = format!(
        r#"{{"customer_id":"{}","currency":"EUR","lines":[]}}"#,
        "x".repeat(2_000)
    );
    t.send(
        &q,
        &[
            msg("good-1", good),
            msg("garbage", "not json {"),
            msg("invalid", invalid),
            msg("big", &big),
            msg("good-2", good),
        ],
    )
    .await
    .unwrap();
    // All five were sent: receive until each is decoded or dead-lettered (a transport
    // may hand them over in more than one batch).
    let (mut decoded, mut poisoned) = (Vec::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + DELIVERY_BOUND;
    while decoded.len() + poisoned.len() < 5 {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "5 sent, {} decoded and {} dead-lettered within {DELIVERY_BOUND:?}",
            decoded.len(),
            poisoned.len()
        );
        let (more, bad) = receive_json::<orderly_core::OrderDetails>(&*t, &q, 10, left, 1_024)
            .await
            .unwrap();
        decoded.extend(more);
        poisoned.extend(bad);
    }
    assert_eq!(
        decoded
            .iter()
            .map(|(_, m)| m.message_id.as_str())
            .collect::<Vec<_>>(),
        ["good-1", "good-2"]
    );
    for (_, m) in &decoded {
        t.complete(m).await.unwrap();
    }
    let reasons: Vec<(&str, &str)> = poisoned
        .iter()
        .map(|p| (p.message_id.as_str(), p.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            ("garbage", "BodyUndecodable"),
            ("invalid", "BodyUndecodable"),
            ("big", "PayloadTooLarge")
        ]
    );
    assert!(
        poisoned[1].description.contains("lines[0].quantity"),
        "names the field: {}",
        poisoned[1].description
    );
    let dead = t.dead_letters(&q, 10).await.unwrap();
    assert_eq!(dead.len(), 3, "kept for inspection");
    assert!(
        dead.iter()
            .any(|d| d.message.message_id == "big" && d.description.contains("1024-byte limit"))
    );
    ctx.clock.advance(Duration::from_secs(3600));
    assert!(
        t.receive(&q, 10, NO_WAIT).await.unwrap().is_empty(),
        "nothing left behind"
    );
}

/// Work that outlasts the lock keeps its message while `while_holding` renews it; the
/// message is not delivered to anyone else meanwhile.
pub async fn long_work_keeps_its_message_by_renewing_the_lock(ctx: &TransportCtx) {
    use orderly_core::transport::while_holding;
    let (t, q) = declared(ctx, "steps", settings(30, 10)).await;
    t.send(&q, &[msg("slow", "x")]).await.unwrap();
    let m = receive_one(&*t, &q).await;
    let other = ctx.factory.open().await;
    let clock = ctx.clock.clone();
    let seen_by_other = while_holding(&*t, &m, Duration::from_millis(40), async {
        let mut seen = Vec::new();
        // 100 s of work in 20 s steps, each step well inside one renewed lock.
        for _ in 0..5 {
            clock.advance(Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(150)).await;
            seen.extend(other.receive(&q, 1, NO_WAIT).await.unwrap());
        }
        seen
    })
    .await
    .unwrap();
    assert!(
        seen_by_other.is_empty(),
        "the message stayed with its holder: {seen_by_other:?}"
    );
    t.complete(&m).await.unwrap();

    // Without renewal the same work loses the message: the holder is told, and the
    // message is delivered again (to whichever consumer the transport picks).
    t.send(&q, &[msg("unrenewed", "y")]).await.unwrap();
    let lost = receive_one(&*t, &q).await;
    ctx.clock.advance(Duration::from_secs(31));
    let lost_lock = while_holding(
        &*t,
        &lost,
        Duration::from_millis(10),
        tokio::time::sleep(Duration::from_secs(5)),
    )
    .await;
    assert!(
        matches!(lost_lock, Err(TransportError::LockLost { .. })),
        "the holder learns it lost the message"
    );
    let mut again = Vec::new();
    for handle in [&t, &other].into_iter().cycle().take(20) {
        again = handle
            .receive(&q, 1, Duration::from_millis(300))
            .await
            .unwrap();
        if let Some(m) = again.first() {
            assert_eq!((m.message_id.as_str(), m.delivery_count), ("unrenewed", 2));
            handle.complete(m).await.unwrap();
            break;
        }
    }
    assert_eq!(again.len(), 1, "delivered again after the lock ran out");
}

/// `ensure_queue` makes a missing queue usable, and leaves an existing queue's settings
/// (here a 5 s lock) as they were: roles call it on every start.
pub async fn ensure_queue_creates_a_missing_queue_and_keeps_an_existing_one(ctx: &TransportCtx) {
    let t = ctx.factory.open().await;
    let fresh = queue("ensured");
    assert!(
        t.ensure_queue(&fresh, &settings(30, 10)).await.unwrap(),
        "a missing queue is created"
    );
    assert!(
        !t.ensure_queue(&fresh, &settings(30, 10)).await.unwrap(),
        "the second time it exists"
    );
    t.send(&fresh, &[msg("e-1", "x")]).await.unwrap();
    let got = receive_one(t.as_ref(), &fresh).await;
    t.complete(&got).await.unwrap();

    let (t, tuned) = declared(ctx, "tuned", settings(5, 10)).await;
    assert!(!t.ensure_queue(&tuned, &settings(60, 10)).await.unwrap());
    t.send(&tuned, &[msg("t-1", "x")]).await.unwrap();
    let first = receive_one(t.as_ref(), &tuned).await;
    ctx.clock.advance(Duration::from_secs(6));
    // Under the 60 s lock ensure_queue offered it would still be held.
    let again = t.receive(&tuned, 1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        again.len(),
        1,
        "the 5 s lock the queue was declared with still applies"
    );
    assert_eq!(again[0].message_id, first.message_id);
    assert_eq!(again[0].delivery_count, 2);
    t.complete(&again[0]).await.unwrap();
}
