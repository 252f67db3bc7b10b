//! Sending: messages on their own, or written with the state change that causes them.

use orderly_core::transport::{OutgoingMessage, QueueName, ReceivedMessage, SendOutcome};

use super::{Q_DEDUP_SWEEP, Result, db, message_rows, verdicts};
use crate::driver::{Driver, Ending, SendFor, q};
use crate::store::SqlStore;
use crate::time::Ts;
use crate::wakeups::SWEEP_EVERY;

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
    /// Enqueues validated `messages` inside the caller's transaction: duplicate
    /// detection, insert, and (PostgreSQL) the notification sent at commit; the holds
    /// `held` are completed by the same statement. Returns, with what the send did, hold
    /// by hold whether it ended it.
    pub(super) async fn enqueue(
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
    pub(super) async fn send_and_complete_alone<'m>(
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
}
