//! Receiving: taking visible messages, waiting for them, and settling them.

use std::time::Duration;

use orderly_core::transport::{QueueName, ReceivedMessage, TransportError};

use super::{Q_ABANDON, Q_DELETE, Result, db, millis};
use crate::driver::{Driver, Head, LookThenTake, Receive, q};
use crate::rows::Cols;
use crate::store::SqlStore;
use crate::time::Ts;

impl<D: Driver> SqlStore<D> {
    /// Locks up to `max` visible messages not delivered too often (those delivered too
    /// often are dead-lettered by the same statement, or, looking first, when one is
    /// first in line: [`Self::receive_now`]).
    pub(super) async fn take(&self, queue: &QueueName, max: u32) -> Result<Vec<ReceivedMessage>> {
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
    /// waits for a send, the poll or the end of its wait. Woken for a send that such a
    /// look answers, it waits again. It skips only while other processes' sends are
    /// heard too (PostgreSQL's `LISTEN`, SQLite's watcher); while they are not, every
    /// receive begins with a look. Messages that come back without a send (a lock that
    /// ran out, a scheduled time reached) are looked for when they come due: after a
    /// look that found nothing, while sends are heard and no look found anything for a
    /// poll interval, the store says when the queue's next message comes due, and no look is needed until then (at most
    /// [`QUEUE_SAFETY_POLL`](crate::wakeups::QUEUE_SAFETY_POLL)); otherwise a poll
    /// interval after any look. At the end of that quiet or of its wait a receiver
    /// looks unless a look of the queue in this process pushed the quiet on, so an idle
    /// queue costs one look a quiet however many receivers wait on it and however
    /// short their waits (a receive may then end with no look of its own). One that
    /// took a whole batch wakes another receiver: more may be there.
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
                signal.look_began(signal.sent(), self.wakeups.poll);
                let began = tokio::time::Instant::now();
                match look().await {
                    Ok(Some((found, true))) => {
                        signal.found();
                        return Ok(Some(found));
                    }
                    Ok(Some((found, false))) => {
                        signal.found();
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
                // Found nothing, and will wait: once the queue has been idle for a
                // poll interval, until the next message comes due by the clock, where
                // that is known. While it is busy the next send ends the quiet anyway,
                // and the read would stand between this receiver and that send.
                if signal.idle_for(self.wakeups.poll)
                    && let Some(quiet) = self.queue_quiet_for(queue).await
                {
                    signal.quiet_until(began + quiet);
                }
            }
            self.driver.start_listening(&self.wakeups);
            let nap = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(signal.quiet_left().unwrap_or(self.wakeups.poll));
            let by_send = tokio::time::timeout(nap, woken).await.is_ok();
            let ended = tokio::time::Instant::now() >= deadline;
            // Woken for a send that a look begun since then answers (another
            // receiver's, running or done): nothing here, wait for the next. Woken by
            // the poll or the end of the wait: look, unless nothing was sent since a
            // look of this queue since which no look is needed yet.
            let recent = answered() && signal.quiet_left().is_some_and(|left| !left.is_zero());
            if ended && !by_send && recent {
                return Ok(None);
            }
            skip = !ended && answered() && (by_send || recent);
        }
    }

    /// How long after a look that found nothing in `queue` no other is needed but for
    /// a send: until its next message comes due (a lock that runs out, a scheduled
    /// time), at most [`QUEUE_SAFETY_POLL`](crate::wakeups::QUEUE_SAFETY_POLL). `None`
    /// (a poll interval, as after any look) while other processes' sends are not
    /// heard, while the clock is injected, while a message is due now that the look
    /// did not take, or when the store cannot tell.
    async fn queue_quiet_for(&self, queue: &QueueName) -> Option<Duration> {
        let next = q(D::SQL.next_visible)
            .bind(queue.as_str())
            .bind(self.driver.now_param());
        self.until_due(next, crate::wakeups::QUEUE_SAFETY_POLL, queue.as_str())
            .await
    }

    /// The messages locked under `token`, in queue order.
    pub(super) fn delivered<R: std::borrow::Borrow<D::Row>>(
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

    /// Up to `max` visible messages of `queue` at `now`, in queue order: their
    /// sequence numbers and delivery counts.
    async fn candidates(
        tx: &mut D::Tx,
        look: &LookThenTake,
        queue: &QueueName,
        now: chrono::DateTime<chrono::Utc>,
        max: u32,
    ) -> Result<Vec<(i64, i32)>> {
        let rows = q(look.candidates)
            .bind(queue.as_str())
            .bind(Ts(now))
            .bind(i64::from(max))
            .fetch_all::<D>(&mut **tx)
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok((c.get::<i64>("seq")?, c.get::<i32>("delivery_count")?))
            })
            .collect::<orderly_core::Result<Vec<_>>>()?)
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
        let candidates = Self::candidates(&mut tx, &look, queue, now, max).await?;
        let (exhausted, deliver): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|(_, count)| *count >= settings.max_deliveries);
        if !exhausted.is_empty() {
            let seqs: Vec<i64> = exhausted.iter().map(|(seq, _)| *seq).collect();
            Self::dead_letter_exhausted(&mut tx, &look, now, &seqs).await?;
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

    /// Moves the messages `seqs`, delivered too often, to the dead letters.
    async fn dead_letter_exhausted(
        tx: &mut D::Conn,
        look: &LookThenTake,
        now: chrono::DateTime<chrono::Utc>,
        seqs: &[i64],
    ) -> Result<()> {
        q(look.dead_letter_exhausted)
            .bind(seqs.to_vec())
            .bind(Ts(now))
            .execute::<D>(&mut *tx)
            .await
            .map_err(db)?;
        q(look.delete_many)
            .bind(seqs.to_vec())
            .execute::<D>(&mut *tx)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Runs `sql` on a message this receiver holds; `LockLost` when it
    /// matches nothing. `$4`, `$5` are the optional extra arguments.
    pub(super) async fn settle(
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
        if sql == Q_ABANDON {
            // Visible again now: other processes' receivers hear of it at commit.
            D::notify_sent(&mut tx, &self.wakeups.notice(message.queue.as_str()))
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
