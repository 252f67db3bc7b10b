//! Consuming with care: bodies decoded as JSON, a refused message dead-lettered
//! with its reason, and a lock renewed while the work that holds it runs.

use super::{QueueName, ReceivedMessage, Transport, TransportError};
use std::time::Duration;

/// Why a consumer refused a message it received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poison {
    /// The message.
    pub message_id: String,
    /// `PayloadTooLarge` or `BodyUndecodable`.
    pub reason: &'static str,
    /// What exactly is wrong, e.g. the field and the rule it breaks.
    pub description: String,
}

/// Receives up to `max` messages from `queue` and decodes each body as JSON `T`. A body
/// over `max_body` bytes, or one that does not decode (including a `T` whose
/// deserializer validates and refuses it), is dead-lettered with a reason naming the
/// problem and reported in the second list; the caller keeps consuming. Nothing is
/// dropped silently: if dead-lettering itself fails, the message stays locked and comes
/// back until the queue's maximum delivery count dead-letters it.
pub async fn receive_json<T: serde::de::DeserializeOwned>(
    transport: &dyn Transport,
    queue: &QueueName,
    max: u32,
    wait: Duration,
    max_body: usize,
) -> Result<(Vec<(T, ReceivedMessage)>, Vec<Poison>), TransportError> {
    let received = transport.receive(queue, max, wait).await?;
    Ok(decode_json(transport, received, max_body).await)
}

/// Dead-letters `message` with `reason` (a short name) and `description` (what was
/// wrong), counted in `orderly_dead_lettered_total` by queue and reason. A failure is
/// logged and the message left locked: it comes back, and in the end the queue's
/// maximum delivery count dead-letters it, so it is never lost.
pub async fn reject(
    transport: &dyn Transport,
    message: &ReceivedMessage,
    reason: &str,
    description: &str,
) {
    metrics::counter!("orderly_dead_lettered_total", "queue" => message.queue.as_str().to_owned(), "reason" => reason.to_owned())
        .increment(1);
    if let Err(e) = transport.dead_letter(message, reason, description).await {
        tracing::warn!(queue = %message.queue, message_id = %message.message_id, error = %e, "could not dead-letter the message; it will come back");
    }
}

/// Decodes messages already received as JSON `T`; those too large or undecodable are
/// dead-lettered with the reason (as [`receive_json`] does).
pub async fn decode_json<T: serde::de::DeserializeOwned>(
    transport: &dyn Transport,
    received: Vec<ReceivedMessage>,
    max_body: usize,
) -> (Vec<(T, ReceivedMessage)>, Vec<Poison>) {
    let mut decoded = Vec::new();
    let mut poisoned = Vec::new();
    for message in received {
        let (reason, description) = if message.body.len() > max_body {
            (
                "PayloadTooLarge",
                format!(
                    "body of {} bytes is over the {max_body}-byte limit",
                    message.body.len()
                ),
            )
        } else {
            match serde_json::from_slice::<T>(&message.body) {
                Ok(value) => {
                    decoded.push((value, message));
                    continue;
                }
                Err(e) => (
                    "BodyUndecodable",
                    format!("not a valid {}: {e}", short_type_name::<T>()),
                ),
            }
        };
        reject(transport, &message, reason, &description).await;
        poisoned.push(Poison {
            message_id: message.message_id,
            reason,
            description,
        });
    }
    (decoded, poisoned)
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Runs `work` while holding `message`: its lock is renewed every `every` (choose about
/// a third of the queue's lock duration), so work that outlasts one lock keeps the
/// message. If a renewal fails, the work is dropped (cancelled) and the error returned:
/// with its lock lost, the message may already be in another consumer's hands.
pub async fn while_holding<F: std::future::Future>(
    transport: &dyn Transport,
    message: &ReceivedMessage,
    every: Duration,
    work: F,
) -> Result<F::Output, TransportError> {
    let work = std::pin::pin!(work);
    let mut work = work;
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            () = tokio::time::sleep(every) => {
                transport.renew_lock(message).await?;
            }
        }
    }
}
