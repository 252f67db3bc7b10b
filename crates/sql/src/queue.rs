//! The embedded SQL queue: the transport port on the state store's own database, so
//! it needs nothing extra, and a state change and the message it causes can later
//! commit in one transaction. Written once for both dialects over the
//! [`Driver`]; each dialect provides the receive ([`crate::driver::Receive`]), the
//! batch insert (which notifies other processes at commit) and
//! `start_listening` (wake-ups from other processes).
//!
//! Receivers do not busy-poll: they wait on a per-queue in-process signal, raised by
//! sends in this process and (PostgreSQL) by `LISTEN`/`NOTIFY` from others, and poll
//! at a slow interval as a fallback that works behind any proxy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use async_trait::async_trait;
use orderly_core::ValidationError;
use orderly_core::transport::{
    DeadLetter, MAX_MESSAGES, OutgoingMessage, QueueName, QueueSettings, ReceivedMessage,
    SendOutcome, Transport, TransportError,
};

use crate::driver::{Driver, LookThenTake, MessageRow, Receive, SendFor, q};
use crate::rows::{Cols, dead_letter_columns};
use crate::store::SqlStore;
use crate::time::Ts;

/// One queue's wake-up (or the claimers', where what is sent is claimable orders): a
/// signal that something may be waiting, and a count of the sends heard (this process's
/// commits, other processes' notifications), so a waiter can tell whether anything was
/// sent since it last looked.
#[derive(Debug)]
pub(crate) struct QueueSignal {
    pub(crate) notify: Notify,
    sent: std::sync::atomic::AtomicU64,
    /// `sent` as it was when the latest look began: that look takes everything it can
    /// see or, when it cannot, wakes another receiver.
    answered: std::sync::atomic::AtomicU64,
}

impl Default for QueueSignal {
    fn default() -> Self {
        // `answered` behind `sent`: the first look is always made.
        Self {
            notify: Notify::new(),
            sent: 1.into(),
            answered: 0.into(),
        }
    }
}

impl QueueSignal {
    /// Sends heard so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A look began when `sent` was `before`: it takes all it can see, or wakes another
    /// receiver when it cannot.
    fn look_began(&self, before: u64) {
        self.answered
            .fetch_max(before, std::sync::atomic::Ordering::AcqRel);
    }

    /// Nothing was sent since the latest look began.
    fn all_answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Acquire) == self.sent()
    }

    /// Something was sent: one waiting receiver is woken (or, with none waiting, the
    /// next to wait goes at once), and every receiver's next look is made.
    fn sent_one(&self) {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.notify.notify_one();
    }

    /// Anything may have been sent: every receiver looks.
    fn anything(&self) {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.notify.notify_waiters();
    }
}

/// Per-queue signals that a message may be waiting.
#[derive(Debug)]
pub(crate) struct Wakeups {
    queues: Mutex<HashMap<String, Arc<QueueSignal>>>,
    /// The fallback poll interval.
    pub poll: Duration,
    /// Whether the cross-process listener was started.
    pub listening: std::sync::atomic::AtomicBool,
    /// Whether other processes' sends are heard now (PostgreSQL, while its `LISTEN`
    /// stands): only then may a receive skip its first look (`until_found`).
    pub hearing: std::sync::atomic::AtomicBool,
    /// Names this store in its notifications, so its listener ignores its own: this
    /// process's receivers were woken at commit already, and waking them again only
    /// sent them to find nothing (a round trip and a transaction on the server each).
    origin: String,
    /// Sends through this database so far: every [`SWEEP_EVERY`]th also removes
    /// expired duplicate-detection rows (housekeeping, kept off most sends).
    pub sends: std::sync::atomic::AtomicU64,
    /// Orders became claimable: one waiting scheduler is woken, and the count tells a
    /// scheduler that was busy claiming when it happened not to wait for the next one.
    pub claims: QueueSignal,
    /// Signalled after each commit that wrote to the outbox (a permit is kept when no
    /// relay waits, so a write during a relay pass is not missed).
    pub outbox: Notify,
    /// Each queue's settings as last read, and when: every receive and send needs
    /// them, and a statement of its own costs a round trip inside the write lock.
    settings: Mutex<HashMap<String, (Settings, std::time::Instant)>>,
}

/// How long a queue's settings read from the database are used before being read
/// again: a change declared by another process takes effect within this (one
/// declared through this process at once).
pub(crate) const SETTINGS_FRESH: Duration = Duration::from_secs(1);

/// What is first in line on a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// No visible message.
    Empty,
    /// A message to deliver.
    Ready,
    /// A message delivered too often: to be dead-lettered.
    Exhausted,
}

/// How often a send also sweeps expired duplicate-detection rows. Correctness does not
/// depend on it: an expired row counts as absent when the next send checks it.
pub(crate) const SWEEP_EVERY: u64 = 32;

impl Wakeups {
    pub fn new(poll: Duration) -> Self {
        Self {
            queues: Mutex::default(),
            poll,
            listening: false.into(),
            hearing: false.into(),
            origin: uuid::Uuid::new_v4().simple().to_string(),
            sends: 0.into(),
            claims: QueueSignal::default(),
            outbox: Notify::new(),
            settings: Mutex::default(),
        }
    }

    /// The settings of `queue` if read less than [`SETTINGS_FRESH`] ago.
    fn cached_settings(&self, queue: &str) -> Option<Settings> {
        let cache = self
            .settings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache
            .get(queue)
            .filter(|(_, read)| read.elapsed() < SETTINGS_FRESH)
            .map(|(settings, _)| *settings)
    }

    fn remember_settings(&self, queue: &str, settings: Option<Settings>) {
        let mut cache = self
            .settings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match settings {
            Some(s) => {
                cache.insert(queue.to_owned(), (s, std::time::Instant::now()));
            }
            None => {
                cache.remove(queue);
            }
        }
    }

    /// The signal of `queue`.
    pub fn of(&self, queue: &str) -> Arc<QueueSignal> {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.entry(queue.to_owned()).or_default().clone()
    }

    /// Messages were sent to `queue`: wakes one waiting receiver. It takes what it can;
    /// one that took a whole batch wakes the next (`until_found`), so a burst is shared
    /// out while a trickle no longer sends every receiver to look and all but one to
    /// find nothing.
    pub fn wake(&self, queue: &str) {
        self.of(queue).sent_one();
    }

    /// Orders became claimable: wakes one waiting scheduler (it claims a whole batch;
    /// the others are not woken to find nothing, and one that was busy sees the count
    /// moved and looks again).
    pub fn wake_claimers(&self) {
        self.claims.sent_one();
    }

    /// The notification that `what` (a queue's name, or [`CLAIMABLE`]) was filled by
    /// this store: `what` and this store's origin, apart by a space (neither holds one).
    pub fn notice(&self, what: &str) -> String {
        format!("{what} {}", self.origin)
    }

    /// The origin this store's notices carry ([`Self::notice`]).
    pub(crate) fn origin(&self) -> &str {
        &self.origin
    }

    /// A notification heard by the listener (see [`Self::notice`]). This store's own
    /// are ignored: its receivers were woken when it committed. One without an origin
    /// (an older version's) wakes as well.
    pub fn heard(&self, payload: &str) {
        let what = match payload.split_once(' ') {
            Some((_, origin)) if origin == self.origin => return,
            Some((what, _)) => what,
            None => payload,
        };
        if what == CLAIMABLE {
            self.wake_claimers();
        } else {
            self.wake(what);
        }
    }

    /// Wakes every waiting receiver (after a lost listener connection, say).
    pub fn wake_all(&self) {
        let queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.values().for_each(|n| n.anything());
        self.claims.anything();
    }
}

/// The notification that orders became claimable (submitted, released, sent back to
/// Pending): not a queue name (those cannot start with `#`).
pub(crate) const CLAIMABLE: &str = "#claimable";

/// The notification channel for sends (PostgreSQL `NOTIFY`; payload: the queue, or
/// [`CLAIMABLE`]).
pub(crate) const CHANNEL: &str = "orderly_queue_sends";

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
macro_rules! held {
    () => {
        " WHERE seq = $1 AND lock_token = $2 AND locked_until > $3"
    };
}

pub(crate) const Q_COMPLETE: &str = concat!("DELETE FROM queue_messages", held!());

pub(crate) const Q_ABANDON: &str = concat!(
    "UPDATE queue_messages SET lock_token = NULL, locked_until = NULL, visible_at = $3",
    held!()
);

pub(crate) const Q_RENEW: &str = concat!(
    "UPDATE queue_messages SET locked_until = $4, visible_at = $4",
    held!(),
    " RETURNING locked_until"
);

/// Copies a held message to the dead letters with reason `$4`, description `$5`.
pub(crate) const Q_DEAD_LETTER: &str = concat!(
    "INSERT INTO queue_dead_letters (",
    dead_letter_columns!(),
    ") SELECT seq, queue, message_id, correlation_id, properties, body, enqueued_at, delivery_count, \
     $4, $5, $3 FROM queue_messages",
    held!()
);

pub(crate) const Q_DELETE: &str = "DELETE FROM queue_messages WHERE seq = $1";

pub(crate) const Q_DEAD_LETTERS: &str = concat!(
    "SELECT ",
    dead_letter_columns!(),
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

#[derive(Debug, Clone, Copy)]
struct Settings {
    lock_ms: i64,
    max_deliveries: i32,
    dedup_ms: i64,
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
    /// The messages `sends` (each with the order id of the write that sends it) as rows
    /// a write inserts itself ([`Driver::write_steps_sending`],
    /// [`Driver::insert_orders_sending`]): `None` unless each is valid and goes to a
    /// queue that detects no duplicates, which those statements cannot check. Each
    /// queue's settings are read here if they are not known (`QueueNotFound` for one
    /// never declared, as a send's).
    pub(crate) async fn sends_for<'w>(
        &self,
        conn: &mut D::Conn,
        sends: impl Iterator<Item = (&'w str, &'w [orderly_core::transport::Envelope])>,
    ) -> Result<Option<Vec<SendFor<'w>>>> {
        let mut rows_for = Vec::new();
        for (order_id, envelopes) in sends {
            for envelope in envelopes {
                if envelope.message.validate().is_err() {
                    return Ok(None);
                }
                let settings = self.queue_settings(&mut *conn, &envelope.queue).await?;
                if settings.dedup_ms > 0 {
                    return Ok(None);
                }
                let (mut rows, _) = message_rows(std::iter::once(&envelope.message), false)?;
                let Some(row) = rows.pop() else {
                    return Ok(None);
                };
                rows_for.push(SendFor {
                    order_id,
                    queue: &envelope.queue,
                    row,
                });
            }
        }
        Ok(Some(rows_for))
    }
}

/// How an item of a write that sent ([`SqlStore::settle_sent`]) ends its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// In the write's own statement: its write was applied.
    InWrite,
    /// Now, after the write: its item is settled for good all the same.
    After,
    /// Not: kept, to be tried again or settled by the caller.
    Kept,
}

impl<D: Driver> SqlStore<D> {
    /// What a write that sent ([`Driver::write_steps_sending`],
    /// [`Driver::insert_orders_sending`]) leaves to do in its transaction, item by item
    /// (`items` of them, one per message of `messages`, if given): whether its delivery
    /// ended, as `ending` says it does (those ended after the write, in one
    /// statement). Without messages none ended.
    pub(crate) async fn settle_sent(
        &self,
        conn: &mut D::Conn,
        now: chrono::DateTime<chrono::Utc>,
        sent: &crate::driver::SentWith,
        items: usize,
        messages: Option<&[ReceivedMessage]>,
        ending: impl Fn(usize) -> Ending,
    ) -> orderly_core::Result<Vec<bool>> {
        let Some(messages) = messages else {
            return Ok(vec![false; items]);
        };
        let all: Vec<&ReceivedMessage> = messages.iter().collect();
        let mut ended = verdicts(&all, &sent.completed);
        let mut late = Vec::new();
        let mut consumed = 0;
        for (i, e) in ended.iter_mut().enumerate() {
            match ending(i) {
                Ending::InWrite => consumed += 1,
                Ending::After => {
                    *e = false;
                    consumed += 1;
                    late.push(i);
                }
                Ending::Kept => *e = false,
            }
        }
        if consumed > 0 {
            self.driver.stats().batch("consume", consumed);
        }
        if !late.is_empty() {
            let held: Vec<&ReceivedMessage> = late.iter().map(|&i| &messages[i]).collect();
            let (_, late_ended) = self
                .enqueue_all(conn, now, &[], &held)
                .await
                .map_err(|e| orderly_core::Error::Send(Box::new(e)))?;
            for (i, e) in late.into_iter().zip(late_ended) {
                ended[i] = e;
            }
        }
        Ok(ended)
    }
}

impl<D: Driver> SqlStore<D> {
    /// The settings of `queue` (`QueueNotFound` if it was never declared), from the
    /// cache while fresh.
    async fn queue_settings(&self, conn: &mut D::Conn, queue: &QueueName) -> Result<Settings> {
        if let Some(settings) = self.wakeups.cached_settings(queue.as_str()) {
            return Ok(settings);
        }
        let settings = Self::read_settings(conn, queue).await?;
        self.wakeups
            .remember_settings(queue.as_str(), Some(settings));
        Ok(settings)
    }

    async fn read_settings(conn: &mut D::Conn, queue: &QueueName) -> Result<Settings> {
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

    /// Enqueues validated `messages` inside the caller's transaction: duplicate
    /// detection, insert, and (PostgreSQL) the notification sent at commit; the holds
    /// `held` are completed by the same statement. Returns, with what the send did, hold
    /// by hold whether it ended it.
    async fn enqueue(
        &self,
        conn: &mut D::Conn,
        now: chrono::DateTime<chrono::Utc>,
        queue: &QueueName,
        messages: &[OutgoingMessage],
        held: &[&ReceivedMessage],
    ) -> Result<(SendOutcome, Vec<bool>)> {
        let mut outcome = SendOutcome::default();
        let settings = self.queue_settings(&mut *conn, queue).await?;
        let nth = self
            .wakeups
            .sends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if settings.dedup_ms > 0 && nth.is_multiple_of(SWEEP_EVERY) {
            q(Q_DEDUP_SWEEP)
                .bind(Ts(now))
                .execute::<D>(&mut *conn)
                .await
                .map_err(db)?;
        }
        let (rows, repeated) = message_rows(messages.iter(), settings.dedup_ms > 0)?;
        outcome.duplicates += repeated;
        let dedup_ms = (settings.dedup_ms > 0).then_some(settings.dedup_ms);
        let notice = self.wakeups.notice(queue.as_str());
        let done = D::insert_messages(
            &mut *conn,
            Ts(now),
            queue.as_str(),
            dedup_ms,
            &rows,
            held,
            &notice,
        )
        .await
        .map_err(db)?;
        outcome.duplicates += rows.len() - done.inserted;
        outcome.accepted += done.inserted;
        Ok((outcome, verdicts(held, &done.completed)))
    }

    /// Enqueues the messages a state change causes, inside its transaction, and
    /// completes the holds `held` (with the first send, in its statement, if there is
    /// one). Returns the queues to wake once the transaction has committed and, hold
    /// by hold, whether it was ended.
    pub(crate) async fn enqueue_all(
        &self,
        conn: &mut D::Conn,
        now: chrono::DateTime<chrono::Utc>,
        sends: &[orderly_core::transport::Envelope],
        held: &[&ReceivedMessage],
    ) -> Result<(Vec<QueueName>, Vec<bool>)> {
        let mut by_queue: Vec<(&QueueName, Vec<OutgoingMessage>)> = Vec::new();
        for envelope in sends {
            envelope.message.validate()?;
            match by_queue.iter_mut().find(|(q, _)| *q == &envelope.queue) {
                Some((_, messages)) => messages.push(envelope.message.clone()),
                None => by_queue.push((&envelope.queue, vec![envelope.message.clone()])),
            }
        }
        if by_queue.is_empty() {
            if held.is_empty() {
                return Ok((Vec::new(), Vec::new()));
            }
            // Nothing to send: the statement only completes.
            let done = D::insert_messages(conn, Ts(now), "", None, &[], held, "")
                .await
                .map_err(db)?;
            return Ok((Vec::new(), verdicts(held, &done.completed)));
        }
        let mut woken = Vec::new();
        let mut ended = Vec::new();
        for (i, (queue, messages)) in by_queue.into_iter().enumerate() {
            let holds = if i == 0 { held } else { &[] };
            let (sent, done) = self
                .enqueue(&mut *conn, now, queue, &messages, holds)
                .await?;
            if i == 0 {
                ended = done;
            }
            if sent.accepted > 0 {
                woken.push(queue.clone());
            }
        }
        Ok((woken, ended))
    }

    /// Sends `messages` (validated) to `queue` and completes the holds `consumed` as one
    /// statement that is its own transaction ([`Driver::send_and_complete_alone`]),
    /// where the dialect can and the queue's settings are known; returns what the send
    /// did and, hold by hold, whether it ended it. `None`: the caller runs them in a
    /// transaction (SQLite; settings not read yet; a sweep of expired duplicate records
    /// due).
    async fn send_and_complete_alone<'m>(
        &self,
        queue: Option<&QueueName>,
        messages: impl ExactSizeIterator<Item = &'m OutgoingMessage>,
        consumed: &[ReceivedMessage],
    ) -> Result<Option<(SendOutcome, Vec<bool>)>> {
        if !D::SQL.sends_alone {
            return Ok(None);
        }
        let dedup_ms = match queue {
            Some(queue) => match self.wakeups.cached_settings(queue.as_str()) {
                Some(settings) => settings.dedup_ms,
                None => return Ok(None),
            },
            None => 0,
        };
        if dedup_ms > 0 {
            // The transaction's path counts this send and sweeps when it is due.
            let nth = self
                .wakeups
                .sends
                .load(std::sync::atomic::Ordering::Relaxed);
            if nth.is_multiple_of(SWEEP_EVERY) {
                return Ok(None);
            }
            self.wakeups
                .sends
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let (rows, repeated) = message_rows(messages, dedup_ms > 0)?;
        let queue_name = queue.map_or("", |q| q.as_str());
        let held: Vec<&ReceivedMessage> = consumed.iter().collect();
        let notice = if rows.is_empty() {
            String::new()
        } else {
            self.wakeups.notice(queue_name)
        };
        let Some(done) = self
            .driver
            .send_and_complete_alone(
                queue_name,
                (dedup_ms > 0).then_some(dedup_ms),
                &rows,
                &held,
                &notice,
            )
            .await?
        else {
            return Ok(None);
        };
        if done.inserted > 0 {
            self.wakeups.wake(queue_name);
        }
        let outcome = SendOutcome {
            accepted: done.inserted,
            duplicates: repeated + rows.len() - done.inserted,
        };
        Ok(Some((outcome, verdicts(&held, &done.completed))))
    }

    /// Wakes receivers of `queues` (after the commit that filled them).
    pub(crate) fn wake_queues(&self, queues: &[QueueName]) {
        queues.iter().for_each(|q| self.wakeups.wake(q.as_str()));
    }

    /// Locks up to `max` visible messages not delivered too often (those delivered too
    /// often are dead-lettered by the same statement, or, looking first, when one is
    /// first in line: [`Self::receive_now`]).
    async fn take(&self, queue: &QueueName, max: u32) -> Result<Vec<ReceivedMessage>> {
        match D::SQL.q_receive {
            Receive::OneStatement { alone, .. } => {
                let mut conn = self.driver.acquire().await?;
                self.driver.stats().write_alone();
                Ok(self.take_first(&mut conn, alone, queue, max).await?.0)
            }
            Receive::LookThenTake(look) => {
                let (mut tx, now) = self.begin().await?;
                let messages = self.take_in(&mut tx, look.take, now, queue, max).await?;
                D::commit(tx).await.map_err(db)?;
                Ok(messages)
            }
        }
    }

    /// [`Receive::OneStatement`]'s `receive` on `conn`, alone or as the first statement
    /// of a transaction: the messages it took and the clock it read.
    pub(crate) async fn take_first(
        &self,
        conn: &mut D::Conn,
        receive: &'static str,
        queue: &QueueName,
        max: u32,
    ) -> Result<(Vec<ReceivedMessage>, chrono::DateTime<chrono::Utc>)> {
        let settings = self.queue_settings(&mut *conn, queue).await?;
        let token = uuid::Uuid::new_v4().to_string();
        let rows = q(receive)
            .bind(queue.as_str())
            .bind(self.driver.now_param())
            .bind(i64::from(max))
            .bind(settings.max_deliveries)
            .bind(&token)
            .bind(settings.lock_ms)
            .fetch_all::<D>(&mut *conn)
            .await
            .map_err(db)?;
        // Every row carries the clock and the count; one row at least comes back.
        let first = rows
            .first()
            .map(Cols)
            .ok_or_else(|| TransportError::Unavailable("the take returned no row".into()))?;
        let now = first.ts("now")?;
        let dead = first.get::<i64>("dead_lettered")?;
        if dead > 0 {
            tracing::warn!(
                queue = %queue,
                count = dead,
                max_delivery_count = settings.max_deliveries,
                "messages dead-lettered: delivered too often without being completed"
            );
        }
        let mut taken = Vec::with_capacity(rows.len());
        for row in &rows {
            if Cols(row).get::<Option<i64>>("seq")?.is_some() {
                taken.push(row);
            }
        }
        Ok((self.delivered(queue, &token, &taken)?, now))
    }

    /// [`Self::take`] inside the caller's transaction, by `take` (one of
    /// [`LookThenTake`]'s).
    pub(crate) async fn take_in(
        &self,
        tx: &mut D::Conn,
        take: &'static str,
        now: chrono::DateTime<chrono::Utc>,
        queue: &QueueName,
        max: u32,
    ) -> Result<Vec<ReceivedMessage>> {
        let settings = self.queue_settings(&mut *tx, queue).await?;
        let token = uuid::Uuid::new_v4().to_string();
        let rows = q(take)
            .bind(queue.as_str())
            .bind(Ts(now))
            .bind(i64::from(max))
            .bind(settings.max_deliveries)
            .bind(&token)
            .bind(Ts(now + millis(settings.lock_ms)))
            .fetch_all::<D>(&mut *tx)
            .await
            .map_err(db)?;
        self.delivered(queue, &token, &rows)
    }

    /// What is first in line on `queue`, read without the write lock.
    pub(crate) async fn head(&self, look: LookThenTake, queue: &QueueName) -> Result<Head> {
        // The read's connection goes back to the pool before a write begins (an
        // in-memory database has only one).
        let mut conn = self.driver.acquire().await?;
        let ready = q(look.any_ready)
            .bind(queue.as_str())
            .bind(self.driver.now_param())
            .fetch_optional::<D>(&mut conn)
            .await
            .map_err(db)?;
        // An unknown queue is refused even when nothing is there.
        let settings = self.queue_settings(&mut conn, queue).await?;
        Ok(match ready {
            None => Head::Empty,
            Some(row) if Cols(&row).get::<i32>("delivery_count")? >= settings.max_deliveries => {
                Head::Exhausted
            }
            Some(_) => Head::Ready,
        })
    }

    /// Looks with `look` until it finds something or `wait` passes (`None`), sleeping
    /// between looks until a send to `queue` wakes it or the fallback poll passes. The
    /// wake-up is registered before each look, so no send in between is missed.
    ///
    /// `look` says with what it found whether it took all it could see (fewer than it
    /// asked for). A receive that may wait does not begin with a look when nothing was
    /// sent since a look began (one still running, or one that took all it saw): it
    /// waits for a send, the poll or the end of its wait, and looks then (always once
    /// at least). Woken for a send that such a look answers, it waits again. It skips
    /// only while other processes' sends are heard too (PostgreSQL's `LISTEN`); on SQLite they are
    /// not, and every receive begins with a look. Messages that come back without a
    /// send (a lock that ran out, a scheduled time reached) are found by the poll, as by
    /// a receiver that was waiting. One that took a whole batch wakes another
    /// receiver: more may be there.
    pub(crate) async fn until_found<T, E, F, Fut>(
        &self,
        queue: &QueueName,
        wait: Duration,
        mut look: F,
    ) -> std::result::Result<Option<T>, E>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<Option<(T, bool)>, E>>,
    {
        let deadline = tokio::time::Instant::now() + wait;
        let signal = self.wakeups.of(queue.as_str());
        // Every send heard so far is answered by a look begun since (this process's
        // and, while they are heard, other processes'): no look of one's own.
        let answered = || {
            self.wakeups
                .hearing
                .load(std::sync::atomic::Ordering::Acquire)
                && signal.all_answered()
        };
        let mut skip = !wait.is_zero() && answered();
        loop {
            let woken = signal.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if !std::mem::take(&mut skip) {
                // This look answers every send heard so far, from its start: a receiver
                // that comes back while it runs waits for the next send rather than
                // looking beside it (it would find this look's messages locked, and
                // nothing: a statement, on the take-and-act path a transaction, for
                // nothing). A look that cannot answer them all, having taken a whole
                // batch or failed, wakes another receiver.
                signal.look_began(signal.sent());
                match look().await {
                    Ok(Some((found, true))) => return Ok(Some(found)),
                    Ok(Some((found, false))) => {
                        signal.sent_one();
                        return Ok(Some(found));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        signal.sent_one();
                        return Err(e);
                    }
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok(None);
                }
            }
            self.driver.start_listening(&self.wakeups);
            let nap = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(self.wakeups.poll);
            let by_send = tokio::time::timeout(nap, woken).await.is_ok();
            // Woken for a send that a look begun since then answers (another
            // receiver's, running or done): nothing here, wait for the next. Woken by
            // the poll or the end of the wait: look.
            skip = by_send && answered() && tokio::time::Instant::now() < deadline;
        }
    }

    /// The messages locked under `token`, in queue order.
    fn delivered<R: std::borrow::Borrow<D::Row>>(
        &self,
        queue: &QueueName,
        token: &str,
        rows: &[R],
    ) -> Result<Vec<ReceivedMessage>> {
        let mut messages = rows
            .iter()
            .map(|r| Cols(r.borrow()).message(token))
            .collect::<orderly_core::Result<Vec<_>>>()?;
        messages.sort_by_key(|m| m.sequence_number);
        self.driver
            .stats()
            .batch(&format!("receive {queue}"), messages.len());
        Ok(messages)
    }

    /// One attempt: lock up to `max` visible messages for a new delivery.
    pub(crate) async fn receive_now(
        &self,
        queue: &QueueName,
        max: u32,
    ) -> Result<Vec<ReceivedMessage>> {
        let look = match D::SQL.q_receive {
            Receive::OneStatement { .. } => return self.take(queue, max).await,
            Receive::LookThenTake(look) => look,
        };
        // A cheap read first: an idle receiver takes no write lock.
        match self.head(look, queue).await? {
            Head::Empty => return Ok(Vec::new()),
            Head::Ready => return self.take(queue, max).await,
            Head::Exhausted => {}
        }
        // The first visible message was delivered too often: dead-letter those among
        // the candidates, deliver the rest.
        let (mut tx, now) = self.begin().await?;
        let settings = self.queue_settings(&mut tx, queue).await?;
        let candidates = q(look.candidates)
            .bind(queue.as_str())
            .bind(Ts(now))
            .bind(i64::from(max))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok((c.get::<i64>("seq")?, c.get::<i32>("delivery_count")?))
            })
            .collect::<orderly_core::Result<Vec<(i64, i32)>>>()?;
        let (exhausted, deliver): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|(_, count)| *count >= settings.max_deliveries);
        if !exhausted.is_empty() {
            let seqs: Vec<i64> = exhausted.iter().map(|(seq, _)| *seq).collect();
            q(look.dead_letter_exhausted)
                .bind(seqs.clone())
                .bind(Ts(now))
                .execute::<D>(&mut tx)
                .await
                .map_err(db)?;
            q(look.delete_many)
                .bind(seqs.clone())
                .execute::<D>(&mut tx)
                .await
                .map_err(db)?;
            tracing::warn!(
                queue = %queue,
                count = seqs.len(),
                max_delivery_count = settings.max_deliveries,
                "messages dead-lettered: delivered too often without being completed"
            );
        }
        if deliver.is_empty() {
            D::commit(tx).await.map_err(db)?;
            return Ok(Vec::new());
        }
        let token = uuid::Uuid::new_v4().to_string();
        let seqs: Vec<i64> = deliver.iter().map(|(seq, _)| *seq).collect();
        let rows = q(look.lock)
            .bind(seqs.clone())
            .bind(&token)
            .bind(Ts(now + millis(settings.lock_ms)))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        self.delivered(queue, &token, &rows)
    }

    /// Runs `sql` on a message this receiver holds; `LockLost` when it
    /// matches nothing. `$4`, `$5` are the optional extra arguments.
    async fn settle(
        &self,
        sql: &'static str,
        message: &ReceivedMessage,
        extra: Option<(&str, &str)>,
    ) -> Result<()> {
        let (mut tx, now) = self.begin().await?;
        let mut query = q(sql)
            .bind(message.sequence_number)
            .bind(&message.lock_token.0)
            .bind(Ts(now));
        if let Some((a, b)) = extra {
            query = query.bind(a).bind(b);
        }
        let n = query.execute::<D>(&mut tx).await.map_err(db)?;
        if n == 0 {
            return Err(TransportError::LockLost {
                queue: message.queue.clone(),
                message_id: message.message_id.clone(),
            });
        }
        if extra.is_some() {
            q(Q_DELETE)
                .bind(message.sequence_number)
                .execute::<D>(&mut tx)
                .await
                .map_err(db)?;
        }
        D::commit(tx).await.map_err(db)?;
        if sql == Q_ABANDON {
            self.wakeups.wake(message.queue.as_str());
        }
        Ok(())
    }
}

#[async_trait]
impl<D: Driver> Transport for SqlStore<D> {
    async fn declare_queue(&self, queue: &QueueName, settings: &QueueSettings) -> Result<()> {
        settings.validate()?;
        let (mut tx, now) = self.begin().await?;
        q(Q_DECLARE)
            .bind(queue.as_str())
            .bind(settings.lock_duration.as_millis() as i64)
            .bind(i32::try_from(settings.max_delivery_count).unwrap_or(i32::MAX))
            .bind(settings.duplicate_detection_window.as_millis() as i64)
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        let committed = D::commit(tx).await.map_err(db);
        // Read again at the next use, whatever the commit's outcome.
        self.wakeups.remember_settings(queue.as_str(), None);
        committed
    }

    async fn ensure_queue(&self, queue: &QueueName, settings: &QueueSettings) -> Result<bool> {
        settings.validate()?;
        let (mut tx, now) = self.begin().await?;
        let created = q(Q_ENSURE)
            .bind(queue.as_str())
            .bind(settings.lock_duration.as_millis() as i64)
            .bind(i32::try_from(settings.max_delivery_count).unwrap_or(i32::MAX))
            .bind(settings.duplicate_detection_window.as_millis() as i64)
            .bind(Ts(now))
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?
            .is_some();
        D::commit(tx).await.map_err(db)?;
        Ok(created)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %queue, count = messages.len()))]
    async fn send(&self, queue: &QueueName, messages: &[OutgoingMessage]) -> Result<SendOutcome> {
        if messages.len() > MAX_MESSAGES as usize {
            return Err(ValidationError::new(
                "messages",
                format!("at most {MAX_MESSAGES} per send"),
            )
            .into());
        }
        for m in messages {
            m.validate()?;
        }
        if messages.is_empty() {
            return Ok(SendOutcome::default());
        }
        if let Some((outcome, _)) = self
            .send_and_complete_alone(Some(queue), messages.iter(), &[])
            .await?
        {
            return Ok(outcome);
        }
        let (mut tx, now) = self.begin().await?;
        let (outcome, _) = self.enqueue(&mut tx, now, queue, messages, &[]).await?;
        D::commit(tx).await.map_err(db)?;
        if outcome.accepted > 0 {
            self.wakeups.wake(queue.as_str());
        }
        Ok(outcome)
    }

    async fn receive(
        &self,
        queue: &QueueName,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>> {
        if max == 0 || max > MAX_MESSAGES {
            return Err(ValidationError::new("max", format!("must be 1 to {MAX_MESSAGES}")).into());
        }
        let found = self
            .until_found(queue, wait, || async {
                let messages = self.receive_now(queue, max).await?;
                let all = messages.len() < max as usize;
                Ok::<_, TransportError>((!messages.is_empty()).then_some((messages, all)))
            })
            .await?;
        Ok(found.unwrap_or_default())
    }

    async fn complete(&self, message: &ReceivedMessage) -> Result<()> {
        self.settle(Q_COMPLETE, message, None).await
    }

    async fn complete_messages(&self, messages: &[ReceivedMessage]) -> Result<Vec<Result<()>>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        self.send_and_complete(&[], messages).await
    }

    async fn send_and_complete(
        &self,
        sends: &[orderly_core::transport::Envelope],
        consumed: &[ReceivedMessage],
    ) -> Result<Vec<Result<()>>> {
        self.driver.stats().batch("settle", consumed.len());
        // Sends to one queue (an agent's replies), or none, may go with the completions
        // in one statement.
        let alone = match sends.first().map(|e| &e.queue) {
            Some(queue) if sends.iter().any(|e| &e.queue != queue) => None,
            queue => {
                for e in sends {
                    e.message.validate()?;
                }
                let messages = sends.iter().map(|e| &e.message);
                self.send_and_complete_alone(queue, messages, consumed)
                    .await?
            }
        };
        let ended = match alone {
            Some((_, ended)) => ended,
            None => {
                let (mut tx, now) = self.begin().await?;
                let held: Vec<&ReceivedMessage> = consumed.iter().collect();
                let (woken, ended) = self.enqueue_all(&mut tx, now, sends, &held).await?;
                D::commit(tx).await.map_err(db)?;
                self.wake_queues(&woken);
                ended
            }
        };
        Ok(consumed
            .iter()
            .zip(ended)
            .map(|(m, ended)| {
                if ended {
                    Ok(())
                } else {
                    Err(TransportError::LockLost {
                        queue: m.queue.clone(),
                        message_id: m.message_id.clone(),
                    })
                }
            })
            .collect())
    }

    async fn abandon(&self, message: &ReceivedMessage) -> Result<()> {
        self.settle(Q_ABANDON, message, None).await
    }

    async fn dead_letter(
        &self,
        message: &ReceivedMessage,
        reason: &str,
        description: &str,
    ) -> Result<()> {
        if reason.is_empty() {
            return Err(ValidationError::new("reason", "a dead letter needs a reason").into());
        }
        let reason = orderly_core::store::bounded_text(reason);
        let description = orderly_core::store::bounded_text(description);
        self.settle(Q_DEAD_LETTER, message, Some((reason, description)))
            .await
    }

    async fn renew_lock(&self, message: &ReceivedMessage) -> Result<chrono::DateTime<chrono::Utc>> {
        let (mut tx, now) = self.begin().await?;
        let settings = self.queue_settings(&mut tx, &message.queue).await?;
        let until = q(Q_RENEW)
            .bind(message.sequence_number)
            .bind(&message.lock_token.0)
            .bind(Ts(now))
            .bind(Ts(now + millis(settings.lock_ms)))
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?
            .map(|r| Cols(&r).ts("locked_until"))
            .transpose()?;
        let until = until.ok_or_else(|| TransportError::LockLost {
            queue: message.queue.clone(),
            message_id: message.message_id.clone(),
        })?;
        D::commit(tx).await.map_err(db)?;
        Ok(until)
    }

    async fn dead_letters(&self, queue: &QueueName, limit: u32) -> Result<Vec<DeadLetter>> {
        let rows = q(Q_DEAD_LETTERS)
            .bind(queue.as_str())
            .bind(i64::from(limit.min(MAX_MESSAGES)))
            .fetch_all::<D>(&mut *self.driver.acquire().await?)
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| Cols(r).dead_letter())
            .collect::<orderly_core::Result<Vec<_>>>()?)
    }
}

#[async_trait]
impl<D: Driver> orderly_core::transport::QueueInspector for SqlStore<D> {
    /// The queue lives in the store's database: answering a statement is enough.
    async fn ping(&self) -> Result<()> {
        orderly_core::store::OperatorStore::ping(self)
            .await
            .map_err(|e| orderly_core::transport::TransportError::Unavailable(e.into()))
    }

    async fn depths(&self) -> Result<Vec<orderly_core::transport::QueueDepth>> {
        let mut conn = self.driver.acquire().await?;
        let now = self.driver.now(&mut conn).await?;
        let rows = q(Q_DEPTHS)
            .bind(Ts(now))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                let name: String = c.get("queue")?;
                Ok(orderly_core::transport::QueueDepth {
                    queue: QueueName::parse(name)?,
                    ready: c.get("ready")?,
                    locked: c.get("locked")?,
                    scheduled: c.get("scheduled")?,
                    dead_lettered: c.get("dead_lettered")?,
                })
            })
            .collect()
    }

    async fn requeue_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize> {
        let (mut tx, now) = self.begin().await?;
        let n = q(Q_REQUEUE)
            .bind(queue.as_str())
            .bind(message_id)
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        q(Q_FORGET_DEAD)
            .bind(queue.as_str())
            .bind(message_id)
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        Ok(n as usize)
    }

    async fn discard_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize> {
        let (mut tx, _) = self.begin().await?;
        let n = q(Q_FORGET_DEAD)
            .bind(queue.as_str())
            .bind(message_id)
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `f` is ready when polled once.
    /// Whether `wakeups`' receivers on `queue` are woken by `heard(payload)`.
    fn wakes(wakeups: &Wakeups, queue: &str, payload: &str) -> bool {
        let signal = wakeups.of(queue);
        let woken = signal.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        wakeups.heard(payload);
        ready(woken)
    }

    #[test]
    fn a_store_ignores_its_own_notifications_and_hears_everyone_elses() {
        let (mine, theirs) = (Wakeups::new(POLL_FOR_TESTS), Wakeups::new(POLL_FOR_TESTS));
        assert!(!wakes(&mine, "replies", &mine.notice("replies")));
        assert!(wakes(&mine, "replies", &theirs.notice("replies")));
        assert!(!wakes(&mine, "orders", &theirs.notice("replies")));
        // An older version's notification names only the queue.
        assert!(wakes(&mine, "replies", "replies"));

        let seen = mine.claims.sent();
        mine.heard(&mine.notice(CLAIMABLE));
        assert_eq!(mine.claims.sent(), seen);
        mine.heard(&theirs.notice(CLAIMABLE));
        assert_eq!(mine.claims.sent(), seen + 1);
        // A lost listener: the claimers look again too, waiting or not.
        mine.wake_all();
        assert_eq!(mine.claims.sent(), seen + 2);
    }

    fn ready(f: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::future::Future::poll(f, &mut cx).is_ready()
    }

    #[test]
    fn a_send_wakes_one_waiting_receiver_and_a_lost_listener_wakes_them_all() {
        let wakeups = Wakeups::new(POLL_FOR_TESTS);
        let signal = wakeups.of("replies");
        let (a, b) = (signal.notify.notified(), signal.notify.notified());
        tokio::pin!(a);
        tokio::pin!(b);
        a.as_mut().enable();
        b.as_mut().enable();
        wakeups.wake("replies");
        let (a_woken, b_woken) = (ready(a.as_mut()), ready(b.as_mut()));
        assert!(a_woken != b_woken, "one of the two: {a_woken} {b_woken}");
        wakeups.wake_all();
        assert!(ready(a.as_mut()) && ready(b.as_mut()));
        // With nobody waiting, a send is kept for the next receiver to wait.
        wakeups.wake("replies");
        let c = signal.notify.notified();
        tokio::pin!(c);
        c.as_mut().enable();
        assert!(ready(c.as_mut()));
    }

    #[test]
    fn sends_count_as_answered_only_until_the_next_send() {
        let s = QueueSignal::default();
        assert!(!s.all_answered(), "the first look is always made");
        let before = s.sent();
        s.look_began(before);
        assert!(s.all_answered());
        // A send committed after a look began: the look may not have seen it.
        let before = s.sent();
        s.sent_one();
        s.look_began(before);
        assert!(!s.all_answered());
        let before = s.sent();
        s.look_began(before);
        assert!(s.all_answered());
        // A look that read the count earlier, marking last, does not undo a later one.
        s.look_began(before - 1);
        assert!(s.all_answered());
        s.anything();
        assert!(!s.all_answered());
    }

    /// A store whose receives may skip a look, as on PostgreSQL while its `LISTEN`
    /// stands (other processes' sends are heard), on the paused clock; and its queue.
    async fn hearing_store() -> (crate::SqliteStore, QueueName) {
        let store = crate::SqliteStore::open("sqlite::memory:", orderly_core::TimeSource::Database)
            .await
            .unwrap();
        store
            .wakeups
            .hearing
            .store(true, std::sync::atomic::Ordering::Release);
        tokio::time::pause();
        (store, QueueName::parse("replies").unwrap())
    }

    /// Drives `f` for `d` of the (paused) clock; whether it finished.
    async fn drive<F: std::future::Future>(f: std::pin::Pin<&mut F>, d: Duration) -> bool {
        tokio::select! {
            biased;
            _ = f => true,
            _ = tokio::time::sleep(d) => false,
        }
    }

    /// Two receivers of one queue: one that comes back while the other's look runs does
    /// not look beside it (it would find that look's messages locked: a statement for
    /// nothing), but waits; and a look that fails wakes it at once, not at its poll.
    #[tokio::test]
    async fn a_receiver_back_while_a_look_runs_waits_and_a_failed_look_wakes_it() {
        let (store, queue) = hearing_store().await;
        let wait = Duration::from_secs(60);
        let (a_looks, b_looks) = (
            std::sync::atomic::AtomicUsize::new(0),
            std::sync::atomic::AtomicUsize::new(0),
        );
        let release = tokio::sync::Semaphore::new(0);
        let a = store.until_found(&queue, wait, || async {
            a_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let _ = release.acquire().await;
            Err::<Option<((), bool)>, &str>("the connection was lost")
        });
        let b = store.until_found(&queue, wait, || async {
            b_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, &str>(Some(((), true)))
        });
        tokio::pin!(a);
        tokio::pin!(b);
        assert!(!drive(a.as_mut(), Duration::from_millis(1)).await);
        assert_eq!(a_looks.load(std::sync::atomic::Ordering::Relaxed), 1);

        // B comes back while A's look runs: no look of its own, however long A takes
        // (short of B's poll).
        assert!(!drive(b.as_mut(), POLL / 2).await);
        assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 0);

        // A's look fails: B looks at once.
        release.add_permits(1);
        assert!(drive(a.as_mut(), Duration::from_millis(1)).await);
        let started = tokio::time::Instant::now();
        assert!(drive(b.as_mut(), POLL).await);
        assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(started.elapsed() < POLL / 10, "{:?}", started.elapsed());
    }

    /// A waiting receiver woken for a send that another receiver's look, begun after
    /// it, answers does not look too (it would find that look's messages locked); the
    /// next send it is woken for, it looks.
    #[tokio::test]
    async fn a_receiver_woken_for_a_send_a_later_look_answers_waits_for_the_next() {
        let (store, queue) = hearing_store().await;
        let wait = Duration::from_secs(60);
        let b_looks = std::sync::atomic::AtomicUsize::new(0);
        let b = store.until_found(&queue, wait, || async {
            let n = b_looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok::<_, &str>((n > 0).then_some(((), true)))
        });
        tokio::pin!(b);
        // B looks, finds nothing, and waits.
        assert!(!drive(b.as_mut(), Duration::from_millis(1)).await);
        assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 1);

        // A send wakes B; before B runs, A begins a look, which answers it.
        store.wakeups.wake(queue.as_str());
        let release = tokio::sync::Semaphore::new(0);
        let a = store.until_found(&queue, wait, || async {
            let _ = release.acquire().await;
            Ok::<_, &str>(Some(((), true)))
        });
        tokio::pin!(a);
        assert!(!drive(a.as_mut(), Duration::from_millis(1)).await);
        assert!(!drive(b.as_mut(), POLL / 2).await);
        assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 1);
        release.add_permits(1);
        assert!(drive(a.as_mut(), Duration::from_millis(1)).await);

        // The next send: B looks at once.
        store.wakeups.wake(queue.as_str());
        let started = tokio::time::Instant::now();
        assert!(drive(b.as_mut(), POLL).await);
        assert_eq!(b_looks.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert!(started.elapsed() < POLL / 10, "{:?}", started.elapsed());
    }

    /// The SQLite store's fallback poll (the test's store is one).
    const POLL: Duration = Duration::from_millis(200);

    const POLL_FOR_TESTS: Duration = Duration::from_secs(1);
}
