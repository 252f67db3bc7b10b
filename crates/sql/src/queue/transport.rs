//! The [`Transport`] port on the SQL queue.

use std::time::Duration;

use async_trait::async_trait;
use orderly_core::ValidationError;
use orderly_core::transport::{
    DeadLetter, MAX_MESSAGES, OutgoingMessage, QueueName, QueueSettings, ReceivedMessage,
    SendOutcome, Transport, TransportError,
};

use super::{
    Q_ABANDON, Q_COMPLETE, Q_DEAD_LETTER, Q_DEAD_LETTERS, Q_DECLARE, Q_ENSURE, Q_RENEW, Result, db,
    millis,
};
use crate::driver::{Driver, q};
use crate::rows::Cols;
use crate::store::SqlStore;
use crate::time::Ts;

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
