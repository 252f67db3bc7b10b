//! The outbox port: messages written with a state change, relayed to their target
//! queue afterwards, retried with back-off, and dead-lettered when they never go.

use super::{Transport, TransportError};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::time::Duration;

/// What one relay pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayOutcome {
    /// Messages handed to the target (or found there already, by message id).
    pub sent: usize,
    /// Messages the target refused or could not take; retried after a back-off.
    pub failed: usize,
    /// Messages set aside as undeliverable (queue missing, or too many failures).
    pub dead: usize,
}

/// An outbox message set aside because it could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboxDeadLetter {
    /// Its place in the outbox.
    pub seq: i64,
    /// The queue it was for.
    pub queue: String,
    /// Its message id.
    pub message_id: String,
    /// Publication attempts made.
    pub attempts: i32,
    /// Why it was set aside.
    pub reason: String,
    /// When it was written.
    pub created_at: DateTime<Utc>,
    /// When it was set aside.
    pub dead_at: DateTime<Utc>,
}

/// Publication attempts after which an outbox message is set aside.
pub const OUTBOX_MAX_ATTEMPTS: i32 = 20;

/// A transactional outbox: the messages state changes caused, waiting to be published
/// to an external transport. Publishing is at-least-once; the target absorbs repeats by
/// message id (Service Bus duplicate detection).
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Leases up to `limit` unsent messages for `relay`, publishes them to `target`
    /// (grouped by queue, in the order they were written), and marks them sent. A
    /// failed publish keeps them, with the error, for a later pass; messages whose
    /// queue does not exist, or whose publication failed [`OUTBOX_MAX_ATTEMPTS`] times,
    /// are set aside as dead letters with the reason.
    async fn relay_once(
        &self,
        relay: &crate::InstanceId,
        target: &dyn Transport,
        limit: u32,
    ) -> Result<RelayOutcome, TransportError>;

    /// How many messages are not yet published (dead letters not counted).
    async fn outbox_backlog(&self) -> Result<i64, TransportError>;

    /// How many messages are set aside as undeliverable.
    async fn outbox_dead_count(&self) -> Result<i64, TransportError>;

    /// The messages set aside because they could not be delivered (their queue does not
    /// exist, or [`OUTBOX_MAX_ATTEMPTS`] publications failed), oldest first.
    async fn outbox_dead_letters(
        &self,
        limit: u32,
    ) -> Result<Vec<OutboxDeadLetter>, TransportError>;

    /// Puts every outbox dead letter back to be published (once the cause is fixed);
    /// returns how many.
    async fn requeue_outbox_dead_letters(&self) -> Result<u64, TransportError>;

    /// Deletes up to `limit` messages published more than `older_than` ago; returns how
    /// many.
    async fn prune_sent(&self, older_than: Duration, limit: u32) -> Result<u64, TransportError>;

    /// Waits until a state change through this process's handles on the store wrote to
    /// the outbox (since the last wait), or until `within` passed: a relay sleeps here
    /// between passes, woken at once by local writes; others' writes it finds by polling.
    async fn wait_written(&self, within: std::time::Duration) {
        tokio::time::sleep(within).await;
    }
}
