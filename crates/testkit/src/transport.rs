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

async fn receive_one(t: &dyn Transport, q: &QueueName) -> ReceivedMessage {
    let mut got = t.receive(q, 1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1, "expected one message");
    got.remove(0)
}
