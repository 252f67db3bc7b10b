//! The transactional outbox of the SQL store: used when messages go to an external
//! transport (Azure Service Bus). State changes write their messages here, in their own
//! transaction; [`Outbox::relay_once`](orderly_core::transport::Outbox) publishes them.
//! A relay leases a batch, so several relays share the work and one that dies only
//! delays its batch until the lease runs out.

use std::time::Duration;

use async_trait::async_trait;
use orderly_core::InstanceId;
use orderly_core::transport::{
    Envelope, OUTBOX_MAX_ATTEMPTS, Outbox, OutboxDeadLetter, OutgoingMessage, QueueName,
    RelayOutcome, Transport, TransportError,
};

use crate::driver::{Driver, q};
use crate::rows::Cols;
use crate::store::SqlStore;
use crate::time::Ts;

type Result<T> = std::result::Result<T, TransportError>;

fn db(e: sqlx::Error) -> TransportError {
    TransportError::Unavailable(
        format!("the outbox (in the state store's database) is unavailable: {e}").into(),
    )
}

fn after(now: chrono::DateTime<chrono::Utc>, d: Duration) -> Ts {
    Ts(now + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX))
}

/// How long a relay holds a leased batch before another may take it over.
pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// Wait before retrying messages the target refused.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

pub(crate) const O_INSERT: &str = "INSERT INTO outbox \
    (queue, message_id, correlation_id, properties, body, scheduled_at, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub(crate) const O_BACKLOG: &str =
    "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL";

pub(crate) const O_DEAD_COUNT: &str = "SELECT count(*) AS n FROM outbox WHERE dead_at IS NOT NULL";

/// The dead letters, oldest first: `$1` limit.
pub(crate) const O_DEAD_LETTERS: &str = "SELECT seq, queue, message_id, attempts, dead_reason, \
    created_at, dead_at FROM outbox WHERE dead_at IS NOT NULL ORDER BY seq LIMIT $1";

/// Every dead letter back to be published.
pub(crate) const O_REQUEUE_DEAD: &str = "UPDATE outbox SET dead_at = NULL, dead_reason = NULL, \
    attempts = 0, leased_until = NULL, relay = NULL WHERE dead_at IS NOT NULL";

/// Deletes up to `$2` rows published before `$1`.
pub(crate) const O_PRUNE: &str = "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox \
    WHERE sent_at IS NOT NULL AND sent_at < $1 ORDER BY sent_at LIMIT $2)";

/// One queue's messages leased to a relay: their seqs with the attempts so far, and
/// the messages, in the order they were written.
struct Leased {
    queue: QueueName,
    seqs: Vec<(i64, i32)>,
    messages: Vec<OutgoingMessage>,
}

impl<D: Driver> SqlStore<D> {
    /// The `n` of a one-row count.
    async fn count(&self, statement: &'static str) -> Result<i64> {
        let mut conn = self.driver.acquire().await?;
        let row = q(statement).fetch_one::<D>(&mut conn).await.map_err(db)?;
        Ok(Cols(&row).get("n")?)
    }

    /// Writes the messages a state change causes to the outbox, inside its
    /// transaction.
    pub(crate) async fn write_outbox(
        &self,
        conn: &mut D::Conn,
        now: chrono::DateTime<chrono::Utc>,
        sends: &[Envelope],
    ) -> Result<()> {
        for Envelope { queue, message } in sends {
            message.validate()?;
            let properties = serde_json::to_string(&message.properties)
                .map_err(|e| TransportError::Unavailable(Box::new(e)))?;
            q(O_INSERT)
                .bind(queue.as_str())
                .bind(&message.message_id)
                .bind(message.correlation_id.as_deref())
                .bind(properties)
                .bind(&message.body)
                .bind(
                    message
                        .scheduled_enqueue_time
                        .map(|t| Ts(orderly_core::clock::truncate_micros(t))),
                )
                .bind(Ts(now))
                .execute::<D>(&mut *conn)
                .await
                .map_err(db)?;
        }
        Ok(())
    }

    /// Leases up to `limit` unsent messages to `relay`, by queue in the order they were
    /// written.
    async fn lease(&self, relay: &InstanceId, limit: u32) -> Result<Vec<Leased>> {
        let (mut tx, now) = self.begin().await?;
        let rows = q(D::SQL.o_lease)
            .bind(relay.as_str())
            .bind(after(now, LEASE))
            .bind(Ts(now))
            .bind(i64::from(
                limit.clamp(1, orderly_core::transport::MAX_MESSAGES),
            ))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        let mut leased = rows
            .iter()
            .map(|r| {
                let c = Cols(r);
                let properties: String = c.get("properties")?;
                Ok((
                    (c.get::<i64>("seq")?, c.get::<i32>("attempts")?),
                    c.get::<String>("queue")?,
                    OutgoingMessage {
                        message_id: c.get("message_id")?,
                        correlation_id: c.get("correlation_id")?,
                        properties: serde_json::from_str(&properties)
                            .map_err(|e| orderly_core::Error::Corrupt(e.to_string()))?,
                        body: c.get("body")?,
                        scheduled_enqueue_time: c.opt_ts("scheduled_at")?,
                    },
                ))
            })
            .collect::<orderly_core::Result<Vec<_>>>()?;
        leased.sort_by_key(|((seq, _), _, _)| *seq);
        let mut batches: Vec<Leased> = Vec::new();
        for (seq, queue, message) in leased {
            let queue = QueueName::parse(queue)?;
            match batches.iter_mut().find(|b| b.queue == queue) {
                Some(b) => {
                    b.seqs.push(seq);
                    b.messages.push(message);
                }
                None => batches.push(Leased {
                    queue,
                    seqs: vec![seq],
                    messages: vec![message],
                }),
            }
        }
        Ok(batches)
    }

    /// Sends one queue's leased messages to `target` and marks them by what happened:
    /// sent, dead (the queue does not exist, the target refuses the message as it is, or
    /// out of attempts) or failed (retried after a pause). When the target refuses a
    /// batch as invalid (one message too large, say), each message goes alone, so only
    /// the one refused is set aside and the others are sent.
    async fn publish(
        &self,
        relay: &InstanceId,
        target: &dyn Transport,
        batch: Leased,
        outcome: &mut RelayOutcome,
    ) -> Result<()> {
        let Leased {
            queue,
            seqs: leased,
            messages,
        } = batch;
        match target.send(&queue, &messages).await {
            Err(TransportError::Invalid(e)) if messages.len() > 1 => {
                tracing::warn!(queue = %queue, count = messages.len(), error = %e, "outbox: the target refused the batch; sending its messages one by one");
                for (one, message) in leased.into_iter().zip(messages) {
                    let result = target.send(&queue, std::slice::from_ref(&message)).await;
                    self.mark(relay, &queue, &[one], result.map(|_| ()), outcome)
                        .await?;
                }
                Ok(())
            }
            result => {
                self.mark(relay, &queue, &leased, result.map(|_| ()), outcome)
                    .await
            }
        }
    }

    /// Marks `leased` (seq, attempts so far) by the `result` of sending them.
    async fn mark(
        &self,
        relay: &InstanceId,
        queue: &QueueName,
        leased: &[(i64, i32)],
        result: std::result::Result<(), TransportError>,
        outcome: &mut RelayOutcome,
    ) -> Result<()> {
        let seqs: Vec<i64> = leased.iter().map(|(seq, _)| *seq).collect();
        match result {
            Ok(()) => {
                self.mark_sent(relay, &seqs).await?;
                outcome.sent += seqs.len();
            }
            Err(TransportError::QueueNotFound(_)) => {
                let reason = format!("QueueNotFound: queue {queue} does not exist");
                tracing::warn!(queue = %queue, count = seqs.len(), "outbox: the queue does not exist; messages set aside as dead letters");
                self.mark_dead(relay, &seqs, &reason).await?;
                outcome.dead += seqs.len();
            }
            Err(TransportError::Invalid(e)) => {
                // As it is, the target never takes it: retrying cannot help.
                let reason = format!("Invalid: refused by the target: {e}");
                tracing::warn!(queue = %queue, count = seqs.len(), error = %e, "outbox: the target refuses the message as it is; set aside as a dead letter");
                self.mark_dead(relay, &seqs, &reason).await?;
                outcome.dead += seqs.len();
            }
            Err(e) => {
                // The lease counted this attempt: those out of attempts are set aside,
                // the rest retried after a pause.
                let (spent, left): (Vec<_>, Vec<_>) = leased
                    .iter()
                    .partition(|(_, attempts)| *attempts >= OUTBOX_MAX_ATTEMPTS);
                let spent: Vec<i64> = spent.iter().map(|(seq, _)| *seq).collect();
                let left: Vec<i64> = left.iter().map(|(seq, _)| *seq).collect();
                tracing::warn!(queue = %queue, count = seqs.len(), error = %e, "outbox relay could not publish; will retry");
                if !left.is_empty() {
                    self.mark_failed(relay, &left, &e.to_string()).await?;
                    outcome.failed += left.len();
                }
                if !spent.is_empty() {
                    let reason = format!("gave up after {OUTBOX_MAX_ATTEMPTS} attempts: {e}");
                    self.mark_dead(relay, &spent, &reason).await?;
                    outcome.dead += spent.len();
                }
            }
        }
        Ok(())
    }

    async fn mark_sent(&self, relay: &InstanceId, seqs: &[i64]) -> Result<()> {
        let (mut tx, now) = self.begin().await?;
        q(D::SQL.o_sent)
            .bind(seqs.to_vec())
            .bind(relay.as_str())
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)
    }

    async fn mark_dead(&self, relay: &InstanceId, seqs: &[i64], reason: &str) -> Result<()> {
        let (mut tx, now) = self.begin().await?;
        q(D::SQL.o_dead)
            .bind(seqs.to_vec())
            .bind(relay.as_str())
            .bind(Ts(now))
            .bind(orderly_core::store::bounded_text(reason))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)
    }

    async fn mark_failed(&self, relay: &InstanceId, seqs: &[i64], error: &str) -> Result<()> {
        let (mut tx, now) = self.begin().await?;
        q(D::SQL.o_failed)
            .bind(seqs.to_vec())
            .bind(relay.as_str())
            .bind(orderly_core::store::bounded_text(error))
            .bind(after(now, RETRY_AFTER))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)
    }
}

#[async_trait]
impl<D: Driver> Outbox for SqlStore<D> {
    #[tracing::instrument(level = "debug", skip_all, fields(instance_id = %relay, limit))]
    async fn relay_once(
        &self,
        relay: &InstanceId,
        target: &dyn Transport,
        limit: u32,
    ) -> Result<RelayOutcome> {
        let mut outcome = RelayOutcome::default();
        for batch in self.lease(relay, limit).await? {
            self.publish(relay, target, batch, &mut outcome).await?;
        }
        Ok(outcome)
    }

    async fn outbox_backlog(&self) -> Result<i64> {
        self.count(O_BACKLOG).await
    }

    async fn outbox_dead_count(&self) -> Result<i64> {
        self.count(O_DEAD_COUNT).await
    }

    async fn outbox_dead_letters(&self, limit: u32) -> Result<Vec<OutboxDeadLetter>> {
        let rows = q(O_DEAD_LETTERS)
            .bind(i64::from(limit))
            .fetch_all::<D>(&mut *self.driver.acquire().await?)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                Ok(OutboxDeadLetter {
                    seq: c.get("seq")?,
                    queue: c.get("queue")?,
                    message_id: c.get("message_id")?,
                    attempts: c.get("attempts")?,
                    reason: c.get::<Option<String>>("dead_reason")?.unwrap_or_default(),
                    created_at: c.ts("created_at")?,
                    dead_at: c.ts("dead_at")?,
                })
            })
            .collect::<orderly_core::Result<Vec<_>>>()
            .map_err(Into::into)
    }

    async fn requeue_outbox_dead_letters(&self) -> Result<u64> {
        let mut tx = self.driver.begin_write().await?;
        let n = q(O_REQUEUE_DEAD).execute::<D>(&mut tx).await.map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        if n > 0 {
            self.wakeups.outbox.notify_one();
        }
        Ok(n)
    }

    async fn prune_sent(&self, older_than: std::time::Duration, limit: u32) -> Result<u64> {
        let (mut tx, now) = self.begin().await?;
        let before = chrono::Duration::from_std(older_than)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let before = Ts(before);
        let n = q(O_PRUNE)
            .bind(before)
            .bind(i64::from(limit))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        Ok(n)
    }

    async fn wait_written(&self, within: std::time::Duration) {
        let _ = tokio::time::timeout(within, self.wakeups.outbox.notified()).await;
    }
}
