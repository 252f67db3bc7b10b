//! Step writes as a scheduler records them: a batch in one transaction, the writes
//! of messages taken in the same one, and the commit that wakes what they sent to.

use super::super::SqlStore;
use super::super::steps::{WrittenAndSent, check_update};
use crate::driver::Driver;
use crate::error::db;
use chrono::{DateTime, Utc};
use orderly_core::Result;
use orderly_core::store::{Consumed, StepWrite, Taken};
use orderly_core::transport::ReceivedMessage;

impl<D: Driver> SqlStore<D> {
    /// A batch of step writes in one transaction, ending the deliveries of the
    /// `messages` that asked for them where the write was applied or refused for good.
    pub(super) async fn record_step_batch(
        &self,
        writes: &[StepWrite],
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Consumed<Result<()>>> {
        if writes.is_empty() {
            return Ok(Consumed::none(Vec::new()));
        }
        for w in writes {
            w.updates.iter().try_for_each(check_update)?;
        }
        self.driver.stats().batch("record steps", writes.len());
        let (tx, now) = self.begin().await?;
        self.record_in(tx, now, writes, messages).await
    }

    /// Plans a write for each of `messages` (locked in `tx`), applies those planned and
    /// ends their messages in `tx`, and commits.
    pub(super) async fn record_taken(
        &self,
        tx: D::Tx,
        now: DateTime<Utc>,
        messages: Vec<ReceivedMessage>,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<StepWrite> + Send + Sync),
    ) -> Result<Taken> {
        // A write that fails validation is left to the caller, whose record refuses it.
        let planned: Vec<Option<StepWrite>> = messages
            .iter()
            .map(|m| plan(m).filter(|w| w.updates.iter().try_for_each(check_update).is_ok()))
            .collect();
        let (writes, asked): (Vec<StepWrite>, Vec<ReceivedMessage>) = planned
            .iter()
            .zip(&messages)
            .filter_map(|(w, m)| w.clone().map(|w| (w, m.clone())))
            .unzip();
        let mut recorded: Vec<Option<(Result<()>, bool)>> = messages.iter().map(|_| None).collect();
        if writes.is_empty() {
            D::commit(tx).await.map_err(db)?;
            return Ok(Taken { messages, recorded });
        }
        self.driver.stats().batch("record steps", writes.len());
        let Consumed { outcomes, consumed } =
            self.record_in(tx, now, &writes, Some(&asked)).await?;
        let slots = planned
            .iter()
            .enumerate()
            .filter(|(_, w)| w.is_some())
            .map(|(i, _)| i);
        for ((i, outcome), consumed) in slots.zip(outcomes).zip(consumed) {
            recorded[i] = Some((outcome, consumed));
        }
        Ok(Taken { messages, recorded })
    }

    /// Applies `writes` in `tx`, ends the messages of those settled for good (when
    /// `messages` are given, one per write) and commits with what they send.
    pub(super) async fn record_in(
        &self,
        mut tx: D::Tx,
        now: DateTime<Utc>,
        writes: &[StepWrite],
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Consumed<Result<()>>> {
        // The last step's record and the completion are one write; where the dialect
        // can, the sends and the completions of the deliveries are in it too.
        if let Some(done) = self.write_and_send(&mut tx, writes, now, messages).await? {
            return self.commit_written(tx, done).await;
        }
        let refusals = Self::apply_step_writes(&mut tx, writes, now).await?;
        let mut verdicts = Vec::with_capacity(writes.len());
        let mut sends = Vec::new();
        for (w, refused) in writes.iter().zip(refusals) {
            match refused {
                None => {
                    sends.extend(w.sends.iter().cloned());
                    verdicts.push(Ok(()));
                }
                Some(refused) => verdicts.push(Err(refused)),
            }
        }
        // A write refused for a reason that may pass keeps its reply, to be tried again;
        // one the store cannot use keeps it for the caller to dead-letter.
        let consuming = self.to_consume(messages, &verdicts, |v: &Result<()>| {
            v.as_ref()
                .err()
                .is_none_or(orderly_core::Error::is_moved_on)
        });
        let ended = self
            .commit_consuming(tx, now, &sends, &consuming.held)
            .await?;
        let consumed = consuming.consumed(ended);
        Ok(Consumed {
            outcomes: verdicts,
            consumed,
        })
    }

    /// Commits what [`Self::write_and_send`] did and wakes the queues it sent to.
    pub(super) async fn commit_written(
        &self,
        tx: D::Tx,
        done: WrittenAndSent,
    ) -> Result<Consumed<Result<()>>> {
        let WrittenAndSent {
            refusals,
            ended,
            woken,
        } = done;
        D::commit(tx).await.map_err(db)?;
        self.wake_queues(&woken);
        Ok(Consumed {
            outcomes: refusals
                .into_iter()
                .map(|r| r.map_or(Ok(()), Err))
                .collect(),
            consumed: ended,
        })
    }
}
