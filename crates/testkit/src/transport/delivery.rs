//! Conformance cases for delivery: what is sent is received, a waiting receiver is
//! woken, locks expire, abandon and dead-lettering keep their reasons.

use super::{
    NO_WAIT, TransportCtx, declared, msg, receive_n, receive_one, receive_until, settings,
};
use orderly_core::transport::{QueueSettings, TransportError};
use std::collections::BTreeMap;
use std::time::Duration;

/// At-least-once delivery with everything the sender set.
pub async fn sent_messages_are_received_with_id_correlation_properties_and_body(
    ctx: &TransportCtx,
) {
    let (t, q) = declared(ctx, "orders", QueueSettings::default()).await;
    let mut m = msg("m-1", "{\"order\":1}");
    m.correlation_id = Some("c-1".into());
    m.properties = BTreeMap::from([("kind".to_owned(), "order-submitted".to_owned())]);
    let outcome = t.send(&q, &[m.clone(), msg("m-2", "two")]).await.unwrap();
    assert_eq!((outcome.accepted, outcome.duplicates), (2, 0));
    let got = receive_n(&*t, &q, 2).await;
    assert_eq!(
        got.iter()
            .map(|m| m.message_id.as_str())
            .collect::<Vec<_>>(),
        ["m-1", "m-2"],
        "in send order"
    );
    let first = &got[0];
    assert_eq!(first.body, m.body);
    assert_eq!(first.correlation_id.as_deref(), Some("c-1"));
    assert_eq!(first.properties, m.properties);
    assert_eq!(first.delivery_count, 1);
    assert_eq!(first.queue, q);
    assert!(
        t.receive(&q, 10, NO_WAIT).await.unwrap().is_empty(),
        "locked messages are not delivered twice"
    );
    for m in &got {
        t.complete(m).await.unwrap();
    }
    ctx.clock.advance(Duration::from_secs(3600));
    assert!(
        t.receive(&q, 10, NO_WAIT).await.unwrap().is_empty(),
        "completed messages are gone"
    );
}

/// An idle receiver does not miss a send, and is woken by it rather than by its timeout.
pub async fn a_waiting_receiver_is_woken_by_a_send(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "replies", QueueSettings::default()).await;
    let receiver = ctx.factory.open().await;
    let rq = q.clone();
    let waiting = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let got = receiver
            .receive(&rq, 1, Duration::from_secs(30))
            .await
            .unwrap();
        (got, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    t.send(&q, &[msg("wake", "up")]).await.unwrap();
    let (got, waited) = waiting.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, "wake");
    assert!(
        waited < Duration::from_secs(25),
        "woken by the send, not by the 30 s timeout"
    );
    assert!(
        t.receive(&q, 1, Duration::from_millis(300))
            .await
            .unwrap()
            .is_empty(),
        "an empty wait ends empty"
    );
}

/// Lock expiry: the message comes back with its delivery counted.
pub async fn an_expired_lock_makes_the_message_visible_again_with_a_higher_delivery_count(
    ctx: &TransportCtx,
) {
    let (t, q) = declared(ctx, "steps", settings(30, 10)).await;
    t.send(&q, &[msg("m", "x")]).await.unwrap();
    let first = receive_one(&*t, &q).await;
    ctx.clock.advance(Duration::from_secs(29));
    assert!(
        t.receive(&q, 1, NO_WAIT).await.unwrap().is_empty(),
        "still locked"
    );
    ctx.clock.advance(Duration::from_secs(2));
    let second = receive_one(&*t, &q).await;
    assert_eq!(second.message_id, "m");
    assert_eq!((first.delivery_count, second.delivery_count), (1, 2));
    assert_ne!(first.lock_token, second.lock_token);
    t.complete(&second).await.unwrap();
}

/// Abandon gives the message back without waiting for the lock to expire.
pub async fn abandon_makes_the_message_visible_at_once(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "steps", settings(60, 10)).await;
    t.send(&q, &[msg("m", "x")]).await.unwrap();
    let first = receive_one(&*t, &q).await;
    t.abandon(&first).await.unwrap();
    let again = receive_one(&*t, &q).await;
    assert_eq!(again.delivery_count, 2);
    t.complete(&again).await.unwrap();
}

/// Poison protection: too many deliveries and the message is kept aside with why.
pub async fn a_message_past_its_maximum_delivery_count_is_dead_lettered_with_the_reason(
    ctx: &TransportCtx,
) {
    let (t, q) = declared(ctx, "agent", settings(10, 3)).await;
    t.send(&q, &[msg("poison", "x"), msg("fine", "y")])
        .await
        .unwrap();
    let mut fine_done = false;
    for delivery in 1..=3 {
        // Each delivery of the poison is waited for (it was sent, or just abandoned);
        // `fine` comes with one of them, whichever.
        let got = receive_until(&*t, &q, 10, "the poison", |got| {
            got.iter().any(|m| m.message_id == "poison")
        })
        .await;
        for m in &got {
            if m.message_id == "poison" {
                assert_eq!(m.delivery_count, delivery);
                t.abandon(m).await.unwrap();
            } else {
                assert_eq!(m.message_id, "fine");
                t.complete(m).await.unwrap();
                fine_done = true;
            }
        }
    }
    if !fine_done {
        let fine = receive_one(&*t, &q).await;
        assert_eq!(fine.message_id, "fine");
        t.complete(&fine).await.unwrap();
    }
    assert!(
        t.receive(&q, 10, NO_WAIT).await.unwrap().is_empty(),
        "not delivered a 4th time"
    );
    let dead = t.dead_letters(&q, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.message_id, "poison");
    assert_eq!(dead[0].message.body, b"x");
    assert_eq!(dead[0].message.delivery_count, 3);
    assert_eq!(dead[0].reason, "MaxDeliveryCountExceeded");
    assert!(dead[0].description.contains('3'), "{}", dead[0].description);
}

/// A message that used up its deliveries while another became visible ahead of it
/// is not delivered again with the one ahead, and ends in the dead letters.
pub async fn a_message_past_its_maximum_behind_others_is_never_delivered_again(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "agent", settings(10, 2)).await;
    t.send(&q, &[msg("poison", "x")]).await.unwrap();
    let first = receive_one(&*t, &q).await;
    t.abandon(&first).await.unwrap();
    let second = receive_one(&*t, &q).await;
    assert_eq!(second.delivery_count, 2);
    // "ahead" becomes visible while the poison is held, so it is first in line when
    // the poison comes back with no deliveries left.
    t.send(&q, &[msg("ahead", "y")]).await.unwrap();
    // Later by the transport's clock (the stand-in's is the real one).
    ctx.clock.advance(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(20)).await;
    t.abandon(&second).await.unwrap();
    let mut delivered = Vec::new();
    for m in receive_until(&*t, &q, 10, "ahead", |got| {
        got.iter().any(|m| m.message_id == "ahead")
    })
    .await
    {
        delivered.push((m.message_id.clone(), m.delivery_count));
        t.complete(&m).await.unwrap();
    }
    for m in t.receive(&q, 10, NO_WAIT).await.unwrap() {
        delivered.push((m.message_id.clone(), m.delivery_count));
    }
    assert_eq!(
        delivered,
        vec![("ahead".to_owned(), 1)],
        "the poison is not delivered a third time"
    );
    let dead = t.dead_letters(&q, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message.message_id, "poison");
    assert_eq!(dead[0].reason, "MaxDeliveryCountExceeded");
}

/// Explicit dead-lettering keeps the message, the reason and the description.
pub async fn dead_letter_on_request_keeps_the_reason(ctx: &TransportCtx) {
    let (t, q) = declared(ctx, "orders", QueueSettings::default()).await;
    t.send(&q, &[msg("bad", "not json")]).await.unwrap();
    let m = receive_one(&*t, &q).await;
    t.dead_letter(
        &m,
        "BodyUndecodable",
        "expected an order-submitted JSON object at line 1 column 1",
    )
    .await
    .unwrap();
    assert!(t.receive(&q, 1, NO_WAIT).await.unwrap().is_empty());
    let dead = t.dead_letters(&q, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "BodyUndecodable");
    assert!(dead[0].description.contains("line 1 column 1"));
    assert_eq!(dead[0].message.body, b"not json");
    assert!(
        matches!(t.complete(&m).await, Err(TransportError::LockLost { .. })),
        "gone from the queue"
    );
}
