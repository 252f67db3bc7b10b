//! Azure Service Bus as an orderly transport.
//!
//! Designed around the known behaviour of `azservicebus` 0.25 (docs/architecture.md, "The Service Bus client"):
//! every call has a short try-timeout and few retries (a failing call otherwise takes
//! minutes); receivers prefetch at least one message (with none, a receive that times
//! out can leave the link stuck); a receiver or sender whose call fails is dropped and
//! recreated on the next call; sends are idempotent by message id (Service Bus
//! duplicate detection absorbs a resend); a process-level rustls crypto provider is
//! installed before connecting. Message locks are renewed by the caller
//! (`Transport::renew_lock`): the client does not renew them itself.
//!
//! Queues are provisioned as infrastructure (Bicep, Terraform, the portal): Service Bus
//! offers no queue creation over AMQP. [`QueueAdmin`] is how `declare_queue` reaches
//! whatever creates them; in production that is [`Provisioned`], which checks nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azservicebus::receiver::DeadLetterOptions;
use azservicebus::{ServiceBusReceivedMessage, SubQueue};
use chrono::{DateTime, Utc};
use orderly_core::transport::{
    DeadLetter, MAX_MESSAGES, OutgoingMessage, QueueName, QueueSettings, ReceivedMessage,
    SendOutcome, Transport, TransportError,
};
use orderly_core::{Clock, ValidationError};
use std::sync::Mutex as StdMutex;
use std::sync::atomic::AtomicU64;
use tokio::sync::Mutex;

/// Messages a receiver may hold unsettled at once (fe2o3 grants new credit only as
/// deliveries are settled). At least 1: with none, a receive that times out can leave
/// the link stuck (docs/architecture.md, "The Service Bus client").
pub const PREFETCH: u32 = 32;

mod operate;
pub use operate::PEEK_COUNT_CAP;

mod connection;
mod convert;
mod entra;
mod settings;

use connection::*;
use convert::*;
pub use convert::{batches, wire_size};
pub use settings::*;

/// Shortest time a receive waits: over a network, "no wait" would return before
/// messages already in the queue had a chance to arrive.
pub const MIN_RECEIVE_WAIT: Duration = Duration::from_millis(300);

/// After the first message of a receive, how long to wait for the rest: only what is
/// already prefetched or arriving at once is taken, so a receive returns within a few
/// milliseconds of its first message.
const DRAIN_WAIT: Duration = Duration::from_millis(10);

/// The Service Bus transport: one AMQP connection at a time (rebuilt with back-off and
/// jitter when it or its session dies, links re-created lazily), a sender and a
/// receiver per queue. Every network call is bounded by the try-timeout; no lock is
/// held across a network call but a link's own (for that link's calls) and the
/// client's (for an attach).
pub struct ServiceBusTransport {
    settings: ServiceBusSettings,
    slot: Mutex<ConnectionSlot>,
    held: StdMutex<HashMap<(String, String), Held>>,
    admin: Arc<dyn QueueAdmin>,
    clock: Arc<dyn Clock>,
    reconnects: AtomicU64,
}

impl std::fmt::Debug for ServiceBusTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusTransport")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Transport for ServiceBusTransport {
    async fn declare_queue(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        settings.validate()?;
        self.admin.declare(queue, settings).await
    }

    async fn ensure_queue(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError> {
        settings.validate()?;
        let created = self.admin.ensure(queue, settings).await?;
        // Service Bus refuses a link to an entity that does not exist (amqp:not-found):
        // a sender's attach is the check, and consumes nothing.
        let conn = self.connection().await?;
        let result = self.sender(&conn, queue).await.map(|_| ());
        self.judge(&conn, queue, Links::Sender, &result);
        result.map(|()| created)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %queue, count = messages.len()))]
    async fn send(
        &self,
        queue: &QueueName,
        messages: &[OutgoingMessage],
    ) -> Result<SendOutcome, TransportError> {
        if messages.len() > MAX_MESSAGES as usize {
            return Err(ValidationError::new(
                "messages",
                format!("at most {MAX_MESSAGES} per send"),
            )
            .into());
        }
        for m in messages {
            m.validate()?;
            to_service_bus(m)?;
        }
        if messages.is_empty() {
            return Ok(SendOutcome::default());
        }
        // One batch per broker call, each within the entity's size; one after the
        // other, each retried on its own (a repeat of one already taken is dropped by
        // message id).
        let parts = batches(
            queue,
            messages,
            self.settings.max_message_bytes,
            self.settings.max_batch_bytes,
        )?;
        if parts.len() > 1 {
            tracing::debug!(queue = %queue, batches = parts.len(), "send split by size");
        }
        for part in parts {
            self.send_batch(queue, part).await?;
        }
        Ok(SendOutcome {
            accepted: messages.len(),
            duplicates: 0,
        })
    }

    async fn receive(
        &self,
        queue: &QueueName,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, TransportError> {
        if max == 0 || max > MAX_MESSAGES {
            return Err(ValidationError::new("max", format!("must be 1 to {MAX_MESSAGES}")).into());
        }
        let conn = self.connection().await?;
        let receiver = match self.receiver(&conn, queue, SubQueue::None).await {
            Ok(r) => r,
            Err(e) => {
                let failed = Err::<(), _>(e);
                self.judge(&conn, queue, Links::Receiver, &failed);
                return failed.map(|()| Vec::new());
            }
        };
        let limit = self.settings.try_timeout;
        let deadline = tokio::time::Instant::now() + wait.max(MIN_RECEIVE_WAIT);
        let mut got: Vec<ServiceBusReceivedMessage> = Vec::new();
        let result: Result<(), TransportError> = async {
            // Wait for the first message, slice by slice (a settlement of this queue
            // gets the link between two slices), then take what else is already here.
            loop {
                let now = tokio::time::Instant::now();
                let (want, slice) = if got.is_empty() {
                    if now >= deadline {
                        return Ok(());
                    }
                    (1, (deadline - now).min(RECEIVE_SLICE))
                } else {
                    (max - got.len() as u32, DRAIN_WAIT)
                };
                let batch = bounded(slice + limit, queue, "a receive", async {
                    receiver
                        .lock()
                        .await
                        .receive_messages_with_max_wait_time(want, slice)
                        .await
                })
                .await
                .and_then(|r| r.map_err(|e| classify(e, queue, None)))?;
                let first = got.is_empty();
                let arrived = batch.len();
                // A prefetched message whose lock ran out while it waited in the
                // buffer has been (or will be) delivered again: drop the stale copy.
                let now = self.clock.now();
                got.extend(
                    batch
                        .into_iter()
                        .filter(|m| m.locked_until().map(from_offset).is_none_or(|t| t > now)),
                );
                if got.len() as u32 >= max || (!first && arrived == 0) {
                    return Ok(());
                }
            }
        }
        .await;
        self.judge(&conn, queue, Links::Receiver, &result);
        // What was received before a failure is still handed out: settling it on a
        // dead link fails as a lost lock, and the broker delivers it again.
        if got.is_empty() {
            result?;
        }
        let mut held = self.held();
        // Forget holds whose lock has passed: settling them is refused anyway, and a
        // consumer that lets a lock run out on purpose (an agent past its deadline
        // sends nothing) would otherwise leave them here forever.
        let now = self.clock.now();
        held.retain(|_, h| {
            // One being renewed right now stays.
            h.message.try_lock().map_or(true, |m| {
                m.locked_until()
                    .map(from_offset)
                    .is_none_or(|until| until > now)
            })
        });
        Ok(got
            .into_iter()
            .map(|m| {
                let converted = Self::convert(queue, &m);
                held.insert(
                    (queue.as_str().to_owned(), converted.lock_token.0.clone()),
                    Held {
                        generation: conn.generation,
                        receiver: receiver.clone(),
                        message: Arc::new(Mutex::new(m)),
                    },
                );
                converted
            })
            .collect())
    }

    async fn complete(&self, message: &ReceivedMessage) -> Result<(), TransportError> {
        self.settle(message, "a completion", |link, m| {
            Box::pin(link.complete_message(m))
        })
        .await
    }

    async fn abandon(&self, message: &ReceivedMessage) -> Result<(), TransportError> {
        self.settle(message, "an abandon", |link, m| {
            Box::pin(link.abandon_message(m, None))
        })
        .await
    }

    async fn dead_letter(
        &self,
        message: &ReceivedMessage,
        reason: &str,
        description: &str,
    ) -> Result<(), TransportError> {
        if reason.is_empty() {
            return Err(ValidationError::new("reason", "a dead letter needs a reason").into());
        }
        let options = DeadLetterOptions {
            dead_letter_reason: Some(reason.to_owned()),
            dead_letter_error_description: Some(description.to_owned()),
            properties_to_modify: None,
        };
        self.settle(message, "a dead-lettering", move |link, m| {
            Box::pin(link.dead_letter_message(m, options))
        })
        .await
    }

    async fn renew_lock(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>, TransportError> {
        let key = (
            message.queue.as_str().to_owned(),
            message.lock_token.0.clone(),
        );
        let lost = || TransportError::LockLost {
            queue: message.queue.clone(),
            message_id: message.message_id.clone(),
        };
        // Take what the renewal needs and let go of the holds: no lock on them is kept
        // across the network call, only this message's own.
        let (generation, receiver, held_message) = {
            let held = self.held();
            let h = held.get(&key).ok_or_else(lost)?;
            (h.generation, h.receiver.clone(), h.message.clone())
        };
        let conn = self.current().await.ok_or_else(lost)?;
        if conn.generation != generation {
            self.held().remove(&key);
            return Err(lost());
        }
        let limit = self.settings.try_timeout;
        let renew = || async {
            bounded(limit, &message.queue, "a lock renewal", async {
                let mut m = held_message.lock().await;
                let renewed = receiver.lock().await.renew_message_lock(&mut m).await;
                renewed.map(|()| m.locked_until().map(from_offset).unwrap_or_default())
            })
            .await
            .and_then(|r| r.map_err(|e| classify(e, &message.queue, Some(&message.message_id))))
        };
        // A renewal is safe to repeat, and one whose answer the client lost (see
        // `timed_out`) is repeated once while the lock still holds.
        let mut result = renew().await;
        if result.as_ref().is_err_and(timed_out)
            && held_message
                .lock()
                .await
                .locked_until()
                .map(from_offset)
                .is_some_and(|until| until > self.clock.now())
        {
            tracing::debug!(queue = %message.queue, message_id = %message.message_id, "a lock renewal went unanswered; trying once more");
            result = renew().await;
        }
        self.judge(&conn, &message.queue, Links::Receiver, &result);
        if result.is_err() {
            self.held().remove(&key);
        }
        result
    }

    async fn dead_letters(
        &self,
        queue: &QueueName,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        let peeked = self
            .peek(queue, SubQueue::DeadLetter, limit.clamp(1, MAX_MESSAGES), 0)
            .await?;
        Ok(peeked
            .iter()
            .map(|m| Self::convert_dead(queue, m))
            .collect())
    }
}
