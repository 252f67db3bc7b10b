//! The default queue names.

/// Where clients post order-submitted messages.
pub const ORDERS: &str = "orders";
/// Where agents send step replies to the schedulers.
pub const REPLIES: &str = "replies";
/// Where operator alerts go.
pub const ALERTS: &str = "alerts";

use super::{QueueName, QueueSettings};

/// The settings orderly creates `queue` with where it creates queues (the SQL
/// transport). `orders` and `alerts` detect duplicates (over 10 minutes): a client
/// may post an order again, and alerts are few. `replies` and the step request
/// queues do not: a duplicate there changes nothing, and detecting them costs a row
/// written, indexed and swept for every message of every step. On the SQL transport
/// a step's request is sent only in the transaction that records it, and an agent's
/// reply with the completion of its request; the one repeat that remains possible (an
/// agent whose lock ran out while it worked replies, and so does the agent that took
/// the request after it) is refused by the store, whose record of a reply is
/// fenced by the owner's epoch and guarded by the step the order is at, and the
/// remote call behind it carried the same idempotency key. Service Bus queues are
/// provisioned by their operators, with duplicate detection on (the outbox relay may
/// publish a message twice).
pub fn settings(queue: &QueueName) -> QueueSettings {
    match queue.as_str() {
        ORDERS | ALERTS => QueueSettings::default(),
        _ => QueueSettings {
            duplicate_detection_window: std::time::Duration::ZERO,
            ..QueueSettings::default()
        },
    }
}

/// The settings `queue` is provisioned with on Service Bus (`orderly provision`, the
/// emulator's Config.json): the lock and deliveries of [`settings`], and duplicate
/// detection on every queue over the default window, since the outbox relay may
/// publish a message twice.
pub fn provisioned(queue: &QueueName) -> QueueSettings {
    QueueSettings {
        duplicate_detection_window: QueueSettings::default().duplicate_detection_window,
        ..settings(queue)
    }
}
