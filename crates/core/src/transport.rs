//! The transport port: queues with Service Bus's peek-lock semantics. A received
//! message stays invisible to other receivers while its lock holds; the receiver then
//! completes it (gone), abandons it (visible again at once), dead-letters it (kept for
//! inspection, with a reason), or renews the lock. A lock that expires makes the
//! message visible again with a higher delivery count; past the queue's maximum
//! delivery count it is dead-lettered instead of delivered.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::validation::ValidationError;

mod consume;
mod outbox;
pub mod queues;

pub use consume::*;
pub use outbox::*;

/// Largest message body accepted (Service Bus standard tier's limit).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most messages one send or receive handles.
pub const MAX_MESSAGES: u32 = 1_000;

/// A queue's name: 1 to 260 characters of letters, digits and `- _ . /`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueueName(String);

impl QueueName {
    /// Parses a queue name.
    pub fn parse(raw: impl Into<String>) -> Result<Self, ValidationError> {
        let raw = raw.into();
        if raw.is_empty() || raw.len() > 260 {
            return Err(ValidationError::new("queue", "must be 1 to 260 characters"));
        }
        if let Some(bad) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "-_./".contains(*c)))
        {
            return Err(ValidationError::new(
                "queue",
                format!("contains {bad:?}; allowed are letters, digits and - _ . /"),
            ));
        }
        Ok(Self(raw))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for QueueName {
    type Error = ValidationError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<QueueName> for String {
    fn from(q: QueueName) -> Self {
        q.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a queue behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a received message stays locked to its receiver.
    pub lock_duration: Duration,
    /// Deliveries after which a message is dead-lettered instead of delivered again.
    pub max_delivery_count: u32,
    /// A message id seen within this window is dropped as a duplicate; zero: no
    /// duplicate detection.
    pub duplicate_detection_window: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            lock_duration: Duration::from_secs(30),
            max_delivery_count: 10,
            duplicate_detection_window: Duration::from_secs(600),
        }
    }
}

impl QueueSettings {
    /// Refuses settings Service Bus would refuse.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.lock_duration < Duration::from_secs(1)
            || self.lock_duration > Duration::from_secs(300)
        {
            return Err(ValidationError::new(
                "lock_duration",
                "must be 1 s to 5 min",
            ));
        }
        if self.max_delivery_count == 0 {
            return Err(ValidationError::new(
                "max_delivery_count",
                "must be at least 1",
            ));
        }
        if self.duplicate_detection_window > Duration::from_secs(7 * 24 * 3600) {
            return Err(ValidationError::new(
                "duplicate_detection_window",
                "must be at most 7 days",
            ));
        }
        Ok(())
    }
}

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// Unique per logical message: a resend with the same id within the duplicate
    /// detection window is dropped.
    pub message_id: String,
    /// Ties a reply to its request.
    pub correlation_id: Option<String>,
    /// Application properties.
    pub properties: BTreeMap<String, String>,
    /// The payload.
    pub body: Vec<u8>,
    /// Not visible to receivers before this time.
    pub scheduled_enqueue_time: Option<DateTime<Utc>>,
}

impl OutgoingMessage {
    /// A message with a body and id, nothing else.
    pub fn new(message_id: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        Self {
            message_id: message_id.into(),
            correlation_id: None,
            properties: BTreeMap::new(),
            body: body.into(),
            scheduled_enqueue_time: None,
        }
    }

    /// Checks the id and the size; the error names the problem.
    pub fn validate(&self) -> Result<(), TransportError> {
        if self.message_id.is_empty() || self.message_id.len() > 128 {
            return Err(ValidationError::new("message_id", "must be 1 to 128 characters").into());
        }
        let size = self.body.len()
            + self
                .properties
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if size > MAX_BODY_BYTES {
            return Err(TransportError::PayloadTooLarge {
                size,
                limit: MAX_BODY_BYTES,
            });
        }
        Ok(())
    }
}

/// A message and the queue it goes to: what a state change causes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Where it goes.
    pub queue: QueueName,
    /// What it is.
    pub message: OutgoingMessage,
}

/// Proof of a receiver's hold on one delivery.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LockToken(pub String);

/// A message received in peek-lock mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// The queue it came from.
    pub queue: QueueName,
    /// The sender's message id.
    pub message_id: String,
    /// The sender's correlation id.
    pub correlation_id: Option<String>,
    /// Application properties.
    pub properties: BTreeMap<String, String>,
    /// The payload.
    pub body: Vec<u8>,
    /// Deliveries so far, this one included (1 on first delivery).
    pub delivery_count: u32,
    /// When it was sent.
    pub enqueued_at: DateTime<Utc>,
    /// The lock holds until then unless renewed.
    pub locked_until: DateTime<Utc>,
    /// The hold to present to settle or renew.
    pub lock_token: LockToken,
    /// The transport's own handle on the stored message.
    pub sequence_number: i64,
}

/// A message kept in a dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message as it was.
    pub message: ReceivedMessage,
    /// Why, in a word (`MaxDeliveryCountExceeded`, `BodyUndecodable`, ...).
    pub reason: String,
    /// Why, in a sentence.
    pub description: String,
    /// When.
    pub dead_lettered_at: DateTime<Utc>,
}

/// What `send` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendOutcome {
    /// Messages enqueued.
    pub accepted: usize,
    /// Messages dropped as duplicates of one sent within the window.
    pub duplicates: usize,
}

/// What went wrong in a transport call.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The lock expired or was taken by another delivery: the message was not settled.
    #[error("lock on message {message_id} in {queue} was lost")]
    LockLost {
        /// The queue.
        queue: QueueName,
        /// The message.
        message_id: String,
    },
    /// No such queue.
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    /// The message is over the size limit.
    #[error("message of {size} bytes is over the {limit}-byte limit")]
    PayloadTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The request is invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The transport cannot do this (e.g. Service Bus queue depths over AMQP).
    #[error("not supported by this transport: {0}")]
    Unsupported(String),
    /// The transport could not be reached or failed; the call may be retried. The
    /// source names the system (the SQL queue, Service Bus) and, where known, the queue.
    #[error("{0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl TransportError {
    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, TransportError::Unavailable(_))
    }
}

/// A queue transport with peek-lock semantics.
#[async_trait]
pub trait Transport: Send + Sync {
    /// Creates `queue` with `settings`, or updates the settings of an existing one.
    async fn declare_queue(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError>;

    /// Makes sure `queue` exists: creates it with `settings` if it does not, and leaves
    /// an existing queue's settings as they are (an operator may have tuned them).
    /// Returns whether it was created. Where queues are infrastructure (Service Bus), a
    /// missing queue is `QueueNotFound`.
    async fn ensure_queue(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError>;

    /// Sends messages to `queue`, all or none.
    async fn send(
        &self,
        queue: &QueueName,
        messages: &[OutgoingMessage],
    ) -> Result<SendOutcome, TransportError>;

    /// Receives up to `max` messages, waiting at most `wait` for the first one.
    async fn receive(
        &self,
        queue: &QueueName,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, TransportError>;

    /// Removes a received message for good. `LockLost` if its lock no longer holds.
    async fn complete(&self, message: &ReceivedMessage) -> Result<(), TransportError>;

    /// Completes several received messages; each gets its own verdict (`LockLost` for
    /// those whose lock no longer holds). Implementations may do it in one round trip.
    async fn complete_messages(
        &self,
        messages: &[ReceivedMessage],
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut verdicts = Vec::with_capacity(messages.len());
        for m in messages {
            verdicts.push(self.complete(m).await);
        }
        Ok(verdicts)
    }

    /// Sends `sends` and completes `consumed`: in one transaction where the transport
    /// can (the embedded SQL queue, where then neither happens without the other),
    /// otherwise the sends first, then the completions (at-least-once: a failure in
    /// between leaves the consumed messages to come back, and the repeated sends are
    /// dropped by message id). One verdict per consumed message; a lost lock does not
    /// hold back the sends.
    async fn send_and_complete(
        &self,
        sends: &[Envelope],
        consumed: &[ReceivedMessage],
    ) -> Result<Vec<Result<(), TransportError>>, TransportError> {
        let mut by_queue: Vec<(&QueueName, Vec<OutgoingMessage>)> = Vec::new();
        for e in sends {
            match by_queue.iter_mut().find(|(q, _)| *q == &e.queue) {
                Some((_, msgs)) => msgs.push(e.message.clone()),
                None => by_queue.push((&e.queue, vec![e.message.clone()])),
            }
        }
        for (queue, messages) in by_queue {
            self.send(queue, &messages).await?;
        }
        self.complete_messages(consumed).await
    }

    /// Gives a received message back: visible again at once.
    async fn abandon(&self, message: &ReceivedMessage) -> Result<(), TransportError>;

    /// Moves a received message to the dead-letter queue with a reason.
    async fn dead_letter(
        &self,
        message: &ReceivedMessage,
        reason: &str,
        description: &str,
    ) -> Result<(), TransportError>;

    /// Extends the lock by the queue's lock duration; returns the new expiry.
    async fn renew_lock(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>, TransportError>;

    /// The dead-lettered messages of `queue`, oldest first.
    async fn dead_letters(
        &self,
        queue: &QueueName,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, TransportError>;
}

/// How many messages a queue holds, by condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueDepth {
    /// The queue.
    pub queue: QueueName,
    /// Visible to receivers now.
    pub ready: i64,
    /// Held by a receiver.
    pub locked: i64,
    /// Scheduled for later (or abandoned with a delay).
    pub scheduled: i64,
    /// Dead-lettered, kept for inspection.
    pub dead_lettered: i64,
}

/// What operators need from a transport beyond messaging: depths, and dead letters put
/// back on their queue once the cause is fixed.
#[async_trait]
pub trait QueueInspector: Send + Sync {
    /// The depth of every declared queue, by name.
    async fn depths(&self) -> Result<Vec<QueueDepth>, TransportError>;

    /// The depths an operator asks for, counted even where that is costly (Service
    /// Bus counts by peeking every message); [`Self::depths`] by default. Metrics
    /// scrapes use [`Self::depths`], which such a transport declines.
    async fn count_depths(&self) -> Result<Vec<QueueDepth>, TransportError> {
        self.depths().await
    }

    /// Whether the transport answers (for readiness probes).
    async fn ping(&self) -> Result<(), TransportError> {
        self.depths().await.map(|_| ())
    }

    /// Puts dead letters of `queue` back on it (all of them, or those with one message
    /// id), as new deliveries visible at once; returns how many.
    async fn requeue_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize, TransportError>;

    /// Removes dead letters of `queue` for good (all of them, or those with one
    /// message id): an operator judged them not worth processing. Returns how many.
    async fn discard_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize, TransportError>;
}
