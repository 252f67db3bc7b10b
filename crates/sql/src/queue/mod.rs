//! The embedded SQL queue: the transport port on the state store's own database, so
//! it needs nothing extra, and a state change and the message it causes can later
//! commit in one transaction. Written once for both dialects over the
//! [`Driver`]; each dialect provides the receive ([`crate::driver::Receive`]), the
//! batch insert (which notifies other processes at commit) and
//! `start_listening` (wake-ups from other processes).
//!
//! Receivers do not busy-poll: they wait on a per-queue in-process signal, raised by
//! sends in this process and by others' (PostgreSQL's `LISTEN`/`NOTIFY`, SQLite's
//! watcher of the file's `data_version`), and poll
//! at a slow interval as a fallback that works behind any proxy.
//!
//! [`send`] writes messages (on their own or with a state change), [`receive`] takes
//! and settles them, [`transport`] and [`inspect`] are the ports' implementations;
//! the wake-ups they raise and wait on are [`crate::wakeups`].

mod inspect;
mod receive;
mod send;
#[cfg(test)]
mod tests;
mod transport;

use const_format::concatcp;
use orderly_core::transport::{OutgoingMessage, QueueName, ReceivedMessage, TransportError};

use crate::driver::{Driver, MessageRow, q};
use crate::rows::{Cols, DEAD_LETTER_COLUMNS};
use crate::store::SqlStore;
use crate::time::Ts;
use crate::wakeups::Settings;

pub(crate) const Q_SETTINGS: &str =
    "SELECT lock_duration_ms, max_delivery_count, dedup_window_ms FROM queues WHERE name = $1";

pub(crate) const Q_DECLARE: &str = "INSERT INTO queues \
    (name, lock_duration_ms, max_delivery_count, dedup_window_ms, created_at) VALUES ($1, $2, $3, $4, $5) \
    ON CONFLICT (name) DO UPDATE SET lock_duration_ms = excluded.lock_duration_ms, \
    max_delivery_count = excluded.max_delivery_count, dedup_window_ms = excluded.dedup_window_ms";

/// Creates queue `$1` unless it exists (an existing queue keeps its settings); a row
/// back means it was created.
pub(crate) const Q_ENSURE: &str = "INSERT INTO queues \
    (name, lock_duration_ms, max_delivery_count, dedup_window_ms, created_at) VALUES ($1, $2, $3, $4, $5) \
    ON CONFLICT (name) DO NOTHING RETURNING name";

/// Forgets up to 100 message ids whose duplicate-detection window ended by `$1`. In
/// expiry order, so the expiry index is read even where the planner has no statistics
/// yet (a new or fast-changing table): unordered, PostgreSQL scanned the whole table
/// on every sweep to find nothing.
pub(crate) const Q_DEDUP_SWEEP: &str = "DELETE FROM queue_dedup WHERE (queue, message_id) IN \
    (SELECT queue, message_id FROM queue_dedup WHERE expires_at <= $1 ORDER BY expires_at LIMIT 100)";

/// Settling checks the delivery's hold: `$1` seq, `$2` lock token, still locked at `$3`.
const HELD: &str = " WHERE seq = $1 AND lock_token = $2 AND locked_until > $3";

pub(crate) const Q_COMPLETE: &str = concatcp!("DELETE FROM queue_messages", HELD);

pub(crate) const Q_ABANDON: &str = concatcp!(
    "UPDATE queue_messages SET lock_token = NULL, locked_until = NULL, visible_at = $3",
    HELD
);

pub(crate) const Q_RENEW: &str = concatcp!(
    "UPDATE queue_messages SET locked_until = $4, visible_at = $4",
    HELD,
    " RETURNING locked_until"
);

/// Copies a held message to the dead letters with reason `$4`, description `$5`.
pub(crate) const Q_DEAD_LETTER: &str = concatcp!(
    "INSERT INTO queue_dead_letters (",
    DEAD_LETTER_COLUMNS,
    ") SELECT seq, queue, message_id, correlation_id, properties, body, enqueued_at, delivery_count, \
     $4, $5, $3 FROM queue_messages",
    HELD
);

pub(crate) const Q_DELETE: &str = "DELETE FROM queue_messages WHERE seq = $1";

pub(crate) const Q_DEAD_LETTERS: &str = concatcp!(
    "SELECT ",
    DEAD_LETTER_COLUMNS,
    " FROM queue_dead_letters WHERE queue = $1 ORDER BY dead_lettered_at, seq LIMIT $2"
);

/// Every queue's depth at `$1`.
pub(crate) const Q_DEPTHS: &str = "SELECT q.name AS queue, \
    (SELECT count(*) FROM queue_messages m WHERE m.queue = q.name AND m.visible_at <= $1 \
        AND (m.locked_until IS NULL OR m.locked_until <= $1)) AS ready, \
    (SELECT count(*) FROM queue_messages m WHERE m.queue = q.name AND m.locked_until > $1) AS locked, \
    (SELECT count(*) FROM queue_messages m WHERE m.queue = q.name AND m.visible_at > $1 \
        AND (m.locked_until IS NULL OR m.locked_until <= $1)) AS scheduled, \
    (SELECT count(*) FROM queue_dead_letters d WHERE d.queue = q.name) AS dead_lettered \
    FROM queues q ORDER BY q.name";

/// Dead letters of `$1` (all, or message id `$2`) back on the queue, visible at `$3`.
pub(crate) const Q_REQUEUE: &str = "INSERT INTO queue_messages \
    (queue, message_id, correlation_id, properties, body, enqueued_at, visible_at) \
    SELECT queue, message_id, correlation_id, properties, body, enqueued_at, $3 \
    FROM queue_dead_letters WHERE queue = $1 AND (CAST($2 AS TEXT) IS NULL OR message_id = $2) \
    ORDER BY seq";

pub(crate) const Q_FORGET_DEAD: &str = "DELETE FROM queue_dead_letters \
    WHERE queue = $1 AND (CAST($2 AS TEXT) IS NULL OR message_id = $2)";

type Result<T> = std::result::Result<T, TransportError>;

fn db(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unavailable(
        format!("the SQL queue (in the state store's database) is unavailable: {e}").into(),
    )
}

fn millis(ms: i64) -> chrono::Duration {
    chrono::Duration::milliseconds(ms)
}

/// Hold by hold, whether the completion ended it: `ended` holds the seq and lock token
/// of each message it deleted.
fn verdicts(
    held: &[&ReceivedMessage],
    ended: &std::collections::HashMap<i64, String>,
) -> Vec<bool> {
    held.iter()
        .map(|m| ended.get(&m.sequence_number) == Some(&m.lock_token.0))
        .collect()
}

/// The rows to insert for validated `messages`, and how many of them repeat an earlier
/// id of the same batch (with duplicate detection on, the first of equal ids wins).
fn message_rows<'m>(
    messages: impl ExactSizeIterator<Item = &'m OutgoingMessage>,
    detect_duplicates: bool,
) -> Result<(Vec<MessageRow<'m>>, usize)> {
    let mut ids = std::collections::HashSet::with_capacity(messages.len());
    let mut repeated = 0;
    let mut rows = Vec::with_capacity(messages.len());
    for m in messages {
        if detect_duplicates && !ids.insert(m.message_id.as_str()) {
            repeated += 1;
            continue;
        }
        rows.push(MessageRow {
            message_id: &m.message_id,
            correlation_id: m.correlation_id.as_deref(),
            properties: serde_json::to_string(&m.properties)
                .map_err(|e| TransportError::Unavailable(Box::new(e)))?,
            body: &m.body,
            scheduled_at: m
                .scheduled_enqueue_time
                .map(|t| Ts(orderly_core::clock::truncate_micros(t))),
        });
    }
    Ok((rows, repeated))
}

impl<D: Driver> SqlStore<D> {
    /// The settings of `queue` (`QueueNotFound` if it was never declared), from the
    /// cache while fresh.
    pub(super) async fn queue_settings(
        &self,
        conn: &mut D::Conn,
        queue: &QueueName,
    ) -> Result<Settings> {
        if let Some(settings) = self.wakeups.cached_settings(queue.as_str()) {
            return Ok(settings);
        }
        let settings = Self::read_settings(conn, queue).await?;
        self.wakeups
            .remember_settings(queue.as_str(), Some(settings));
        Ok(settings)
    }

    pub(super) async fn read_settings(conn: &mut D::Conn, queue: &QueueName) -> Result<Settings> {
        let row = q(Q_SETTINGS)
            .bind(queue.as_str())
            .fetch_optional::<D>(conn)
            .await
            .map_err(db)?
            .ok_or_else(|| TransportError::QueueNotFound(queue.clone()))?;
        let c = Cols(&row);
        Ok(Settings {
            lock_ms: c.get("lock_duration_ms")?,
            max_deliveries: c.get("max_delivery_count")?,
            dedup_ms: c.get("dedup_window_ms")?,
        })
    }
}
