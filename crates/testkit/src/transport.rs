//! The transport conformance suite: peek-lock semantics every transport must show.
//! [`transport_conformance!`] stamps each case out as a test for one implementation.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orderly_core::ManualClock;
use orderly_core::transport::{
    OutgoingMessage, QueueName, QueueSettings, ReceivedMessage, Transport,
};

mod delivery;
mod settling;

pub use delivery::*;
pub use settling::*;

/// Opens handles on one transport under test.
#[async_trait]
pub trait TransportFactory: Send + Sync {
    /// A new independent handle (its own connections) on the same transport.
    async fn open(&self) -> Arc<dyn Transport>;
    /// Removes what the case created (called when it passed).
    async fn cleanup(&self) {}
}

/// Declares `queue`, sends it `n` messages (ids `tag-0`, `tag-1`, ...) and receives
/// and completes them all: the churn a queue's table sees under work.
pub async fn churn(transport: &(impl Transport + ?Sized), queue: &QueueName, tag: &str, n: usize) {
    transport
        .declare_queue(queue, &QueueSettings::default())
        .await
        .unwrap();
    for chunk in (0..n).collect::<Vec<_>>().chunks(250) {
        let batch: Vec<OutgoingMessage> = chunk
            .iter()
            .map(|i| OutgoingMessage::new(format!("{tag}-{i}"), b"x".to_vec()))
            .collect();
        transport.send(queue, &batch).await.unwrap();
    }
    let mut done = 0;
    while done < n {
        let got = transport.receive(queue, 250, Duration::ZERO).await.unwrap();
        assert!(!got.is_empty(), "{done} of {n} received");
        for verdict in transport.complete_messages(&got).await.unwrap() {
            verdict.unwrap();
        }
        done += got.len();
    }
}

/// What a transport case gets.
pub struct TransportCtx {
    /// The clock the transport reads for locks, schedules and duplicate windows.
    pub clock: ManualClock,
    /// Opens handles.
    pub factory: Box<dyn TransportFactory>,
}

/// Stamps out every transport case as a `#[tokio::test]`; `$fixture` is an async fn
/// returning a fresh [`TransportCtx`].
#[macro_export]
macro_rules! transport_conformance {
    ($fixture:path) => {
        $crate::transport_conformance!(@cases $fixture;
            sent_messages_are_received_with_id_correlation_properties_and_body,
            a_waiting_receiver_is_woken_by_a_send,
            an_expired_lock_makes_the_message_visible_again_with_a_higher_delivery_count,
            abandon_makes_the_message_visible_at_once,
            a_message_past_its_maximum_delivery_count_is_dead_lettered_with_the_reason,
            a_message_past_its_maximum_behind_others_is_never_delivered_again,
            dead_letter_on_request_keeps_the_reason,
            concurrent_consumers_receive_disjoint_messages,
            settling_after_the_lock_was_lost_is_an_error,
            renewing_the_lock_keeps_the_message_held,
            duplicate_message_ids_are_dropped_within_the_window,
            scheduled_messages_stay_invisible_until_their_time,
            bad_requests_are_refused_with_typed_errors_and_send_nothing,
            complete_messages_settles_each_message_it_still_holds,
            send_and_complete_sends_and_settles_in_one_call,
            poison_messages_are_dead_lettered_with_the_problem_and_consuming_goes_on,
            long_work_keeps_its_message_by_renewing_the_lock,
            ensure_queue_creates_a_missing_queue_and_keeps_an_existing_one,
        );
    };
    // Cases run only on request (`--run-ignored only`), e.g. against a real broker.
    (@ignored $reason:literal, $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            #[ignore = $reason]
            async fn $case() {
                let ctx = $fixture().await;
                $crate::transport::$case(&ctx).await;
                ctx.factory.cleanup().await;
            }
        )*
    };
    (@cases $fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let ctx = $fixture().await;
                $crate::transport::$case(&ctx).await;
                ctx.factory.cleanup().await;
            }
        )*
    };
}

const NO_WAIT: Duration = Duration::ZERO;

fn queue(name: &str) -> QueueName {
    QueueName::parse(name).unwrap()
}

async fn declared(
    ctx: &TransportCtx,
    name: &str,
    settings: QueueSettings,
) -> (Arc<dyn Transport>, QueueName) {
    let t = ctx.factory.open().await;
    let q = queue(name);
    t.declare_queue(&q, &settings).await.unwrap();
    (t, q)
}

fn settings(lock_secs: u64, max_deliveries: u32) -> QueueSettings {
    QueueSettings {
        lock_duration: Duration::from_secs(lock_secs),
        max_delivery_count: max_deliveries,
        duplicate_detection_window: Duration::from_secs(600),
    }
}

fn msg(id: &str, body: &str) -> OutgoingMessage {
    OutgoingMessage::new(id, body.as_bytes().to_vec())
}

/// How long a case waits for messages it knows were sent. A transport may hand a sent
/// message to its receiver asynchronously (Service Bus delivers it over the receiver's
/// own link, on the client's own tasks), so a receive right after a send can come back
/// empty on a loaded machine. A case that expects messages waits for them, up to this
/// bound, and fails naming what it still missed; only a case that expects *nothing*
/// receives without waiting.
pub const DELIVERY_BOUND: Duration = Duration::from_secs(15);

/// Receives from `q` until `enough` says the messages collected so far are all that
/// was expected, within [`DELIVERY_BOUND`]; past it the case fails naming what came.
/// Each receive asks for what is left of `max` in all (at least one).
async fn receive_until(
    t: &dyn Transport,
    q: &QueueName,
    max: u32,
    what: &str,
    mut enough: impl FnMut(&[ReceivedMessage]) -> bool,
) -> Vec<ReceivedMessage> {
    let deadline = tokio::time::Instant::now() + DELIVERY_BOUND;
    let mut got: Vec<ReceivedMessage> = Vec::new();
    while !enough(&got) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{what} was sent but not received within {DELIVERY_BOUND:?} on {q}; received: {:?}",
            ids(&got)
        );
        let want = max.saturating_sub(u32::try_from(got.len()).unwrap_or(u32::MAX));
        got.extend(t.receive(q, want.max(1), left).await.unwrap());
    }
    got
}

/// Exactly `n` messages, known to be sent, received within [`DELIVERY_BOUND`].
pub async fn receive_n(t: &dyn Transport, q: &QueueName, n: usize) -> Vec<ReceivedMessage> {
    let max = u32::try_from(n).unwrap_or(u32::MAX);
    let got = receive_until(t, q, max, &format!("{n} messages"), |got| got.len() >= n).await;
    assert_eq!(got.len(), n, "more than the {n} expected: {:?}", ids(&got));
    got
}

async fn receive_one(t: &dyn Transport, q: &QueueName) -> ReceivedMessage {
    receive_n(t, q, 1).await.remove(0)
}

fn ids(got: &[ReceivedMessage]) -> Vec<&str> {
    got.iter().map(|m| m.message_id.as_str()).collect()
}
