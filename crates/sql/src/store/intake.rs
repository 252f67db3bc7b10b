//! Intake: a new order becomes Pending (`Submitted`), once.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::store::{
    Consumed, IntakeStore, NewOrder, Submission, SubmitOutcome, Taken, check_consuming,
};
use orderly_core::transport::{Envelope, QueueName, ReceivedMessage};
use orderly_core::{Actor, Error, Result};

use super::SqlStore;
use crate::driver::Ending;
use crate::driver::{Driver, HoldFor, NewOrderRow};

/// What [`SqlStore::submit_and_send`] did: the outcomes and deliveries ended, the
/// queues to wake once it has committed, and whether orders became claimable.
type SubmittedAndSent = (Consumed<Result<SubmitOutcome>>, Vec<QueueName>, bool);

impl<D: Driver> SqlStore<D> {
    /// Records the valid new orders of `orders` (details, Pending state row, first
    /// history entry) in the caller's transaction, the batch in one statement per
    /// table: each is `Accepted` once, for its first row; a repeat of a stored id is
    /// `Duplicate`, the same id with other details `OrderIdConflict`, and neither
    /// writes anything; an invalid order is its validation error.
    async fn record_orders(
        conn: &mut D::Conn,
        now: DateTime<Utc>,
        actor: &Actor,
        orders: &[&NewOrder],
    ) -> Result<Vec<Result<SubmitOutcome>>> {
        let (checked, rows) = order_rows(orders);
        let inserted = if rows.is_empty() {
            HashSet::new()
        } else {
            D::insert_orders(conn, now, actor.as_str(), &rows).await?
        };
        Self::outcomes_of(conn, orders, checked, &inserted).await
    }

    /// Each order's outcome once the ids `inserted` were inserted ([`Self::record_orders`]).
    async fn outcomes_of(
        conn: &mut D::Conn,
        orders: &[&NewOrder],
        checked: Vec<Result<()>>,
        inserted: &HashSet<String>,
    ) -> Result<Vec<Result<SubmitOutcome>>> {
        let mut outcomes = Vec::with_capacity(orders.len());
        let mut taken = HashSet::with_capacity(inserted.len());
        for (o, ok) in orders.iter().zip(checked) {
            if let Err(invalid) = ok {
                outcomes.push(Err(invalid));
                continue;
            }
            let id = o.order_id.as_str();
            if inserted.contains(id) && taken.insert(id) {
                outcomes.push(Ok(SubmitOutcome::Accepted));
                continue;
            }
            let stored = Self::fetch_details(conn, &o.order_id).await?;
            outcomes.push(if stored == o.details {
                Ok(SubmitOutcome::Duplicate)
            } else {
                Err(Error::OrderIdConflict(o.order_id.clone()))
            });
        }
        Ok(outcomes)
    }

    /// [`Self::submit_in`] in one statement where the dialect has it
    /// ([`Driver::insert_orders_sending`]) and the store sends through its queue: the
    /// new orders, the sends of those accepted, the end of their deliveries, and the
    /// notification that orders can be claimed. A duplicate's delivery ends after it,
    /// in a statement of its own; a conflict's or an invalid order's does not. `None`
    /// with nothing done where it cannot (or a send goes to a queue
    /// [`Self::sends_for`] refuses); the caller records, then sends.
    async fn submit_and_send(
        &self,
        tx: &mut D::Tx,
        now: DateTime<Utc>,
        batch: &[Submission],
        actor: &Actor,
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Option<SubmittedAndSent>> {
        if !D::SQL.writes_send || self.delivery != crate::Delivery::Queue {
            return Ok(None);
        }
        let orders: Vec<&NewOrder> = batch.iter().map(|s| &s.order).collect();
        let (checked, rows) = order_rows(&orders);
        if rows.is_empty() {
            return Ok(None);
        }
        let firsts = firsts_of(batch, &first_valid(&orders, &checked));
        let Some(sends) = self
            .sends_for(
                &mut *tx,
                firsts
                    .iter()
                    .map(|(_, s)| (s.order.order_id.as_str(), s.sends.as_slice())),
            )
            .await
            .map_err(|e| Error::Send(Box::new(e)))?
        else {
            return Ok(None);
        };
        let holds = holds_of(&firsts, messages);
        let Some(sent) = D::insert_orders_sending(
            &mut *tx,
            now,
            actor.as_str(),
            &rows,
            &sends,
            &holds,
            self.wakeups.origin(),
        )
        .await?
        else {
            return Ok(None);
        };
        let outcomes = Self::outcomes_of(&mut *tx, &orders, checked, &sent.applied).await?;
        let woken = sent.woken(&sends);
        let consumed = self
            .settle_sent(&mut *tx, now, &sent, batch.len(), messages, |i| {
                ending_of(&outcomes[i])
            })
            .await?;
        let claimable = !sent.applied.is_empty();
        Ok(Some((Consumed { outcomes, consumed }, woken, claimable)))
    }
}

/// The submissions of `batch` that can be accepted (`first`, by [`first_valid`]), with
/// their positions.
fn firsts_of<'b>(batch: &'b [Submission], first: &[bool]) -> Vec<(usize, &'b Submission)> {
    batch
        .iter()
        .zip(first)
        .enumerate()
        .filter(|(_, (_, first))| **first)
        .map(|(i, (s, _))| (i, s))
        .collect()
}

/// The deliveries an insert of `firsts` ends: those of the rows it may accept (none
/// without `messages`).
fn holds_of<'a>(
    firsts: &[(usize, &'a Submission)],
    messages: Option<&'a [ReceivedMessage]>,
) -> Vec<HoldFor<'a>> {
    messages.map_or_else(Vec::new, |messages| {
        firsts
            .iter()
            .map(|&(i, s)| HoldFor {
                order_id: s.order.order_id.as_str(),
                held: &messages[i],
            })
            .collect()
    })
}

/// How a submission's delivery ends, by its outcome: an accepted order's in the insert
/// itself, a duplicate's after it; a conflict's or an invalid order's not at all.
fn ending_of(outcome: &Result<SubmitOutcome>) -> Ending {
    match outcome {
        Ok(SubmitOutcome::Accepted) => Ending::InWrite,
        Ok(_) => Ending::After,
        Err(_) => Ending::Kept,
    }
}

/// Which rows of `orders` can be accepted: only an id's first valid row, which alone
/// sends and ends its delivery with the insert.
fn first_valid<T>(orders: &[&NewOrder], checked: &[Result<(), T>]) -> Vec<bool> {
    let mut seen = HashSet::with_capacity(orders.len());
    orders
        .iter()
        .zip(checked)
        .map(|(o, ok)| ok.is_ok() && seen.insert(o.order_id.as_str()))
        .collect()
}

/// The rows of the valid orders of `orders`, each id once (its first valid row: a
/// repeat is a duplicate or a conflict of that one), and each order's validation.
fn order_rows<'o>(orders: &[&'o NewOrder]) -> (Vec<Result<()>>, Vec<NewOrderRow<'o>>) {
    let checked: Vec<Result<()>> = orders
        .iter()
        .map(|o| o.validate().map_err(Error::from))
        .collect();
    let rows = orders
        .iter()
        .zip(&checked)
        .filter(|(_, ok)| ok.is_ok())
        .map(|(o, _)| *o)
        .filter({
            let mut seen = HashSet::with_capacity(orders.len());
            move |o| seen.insert(o.order_id.as_str())
        })
        .map(|o| NewOrderRow {
            order_id: o.order_id.as_str(),
            details: o.details.to_json(),
            reply_to: o.reply_to.as_deref(),
            workflow: o.workflow.as_deref(),
        })
        .collect();
    (checked, rows)
}

#[async_trait]
impl<D: Driver> IntakeStore for SqlStore<D> {
    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, order_id = %order.order_id, actor = %actor))]
    async fn submit(
        &self,
        order: &NewOrder,
        actor: &Actor,
        sends: &[Envelope],
    ) -> Result<SubmitOutcome> {
        order.validate()?;
        let (mut tx, now) = self.begin().await?;
        let outcome = Self::record_orders(&mut tx, now, actor, &[order])
            .await?
            .pop()
            .unwrap_or_else(|| unreachable!("one outcome per order"))?;
        if outcome == SubmitOutcome::Accepted {
            self.commit_claimable(tx, now, sends).await?;
        }
        Ok(outcome)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, batch = batch.len(), actor = %actor))]
    async fn submit_many(
        &self,
        batch: &[Submission],
        actor: &Actor,
    ) -> Result<Vec<Result<SubmitOutcome>>> {
        Ok(self.submit_batch(batch, actor, None).await?.outcomes)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, batch = batch.len(), actor = %actor))]
    async fn submit_consuming(
        &self,
        batch: &[Submission],
        actor: &Actor,
        messages: &[ReceivedMessage],
    ) -> Result<Consumed<Result<SubmitOutcome>>> {
        check_consuming(batch.len(), messages)?;
        self.submit_batch(batch, actor, Some(messages)).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, queue = %queue, actor = %actor))]
    async fn take_and_submit(
        &self,
        queue: &QueueName,
        max: u32,
        wait: std::time::Duration,
        actor: &Actor,
        plan: &(dyn for<'c> Fn(&'c ReceivedMessage) -> Option<Submission> + Send + Sync),
    ) -> Result<Option<Taken<SubmitOutcome>>> {
        if self.delivery != crate::Delivery::Queue {
            return Ok(None);
        }
        self.take_with(queue, max, wait, |tx, now, messages| async move {
            let planned: Vec<Option<Submission>> = messages.iter().map(plan).collect();
            let (batch, asked): (Vec<Submission>, Vec<ReceivedMessage>) = planned
                .iter()
                .zip(&messages)
                .filter_map(|(s, m)| s.clone().map(|s| (s, m.clone())))
                .unzip();
            let mut taken = Taken::held(messages);
            if batch.is_empty() {
                D::commit(tx).await.map_err(crate::error::db)?;
                return Ok(taken);
            }
            self.driver.stats().batch("submit", batch.len());
            let Consumed { outcomes, consumed } =
                self.submit_in(tx, now, &batch, actor, Some(&asked)).await?;
            let slots = planned
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_some())
                .map(|(i, _)| i);
            for ((i, outcome), consumed) in slots.zip(outcomes).zip(consumed) {
                taken.recorded[i] = Some((outcome, consumed));
            }
            Ok(taken)
        })
        .await
        .map(Some)
    }
}

impl<D: Driver> SqlStore<D> {
    /// A batch of submissions in one transaction, ending the deliveries of the
    /// `messages` that carried them where the order was accepted or a duplicate.
    async fn submit_batch(
        &self,
        batch: &[Submission],
        actor: &Actor,
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Consumed<Result<SubmitOutcome>>> {
        if batch.is_empty() {
            return Ok(Consumed::none(Vec::new()));
        }
        self.driver.stats().batch("submit", batch.len());
        let (tx, now) = self.begin().await?;
        self.submit_in(tx, now, batch, actor, messages).await
    }

    /// [`Self::submit_batch`] in `tx`, which it commits.
    async fn submit_in(
        &self,
        mut tx: D::Tx,
        now: DateTime<Utc>,
        batch: &[Submission],
        actor: &Actor,
        messages: Option<&[ReceivedMessage]>,
    ) -> Result<Consumed<Result<SubmitOutcome>>> {
        if let Some((consumed, woken, claimable)) = self
            .submit_and_send(&mut tx, now, batch, actor, messages)
            .await?
        {
            D::commit(tx).await.map_err(crate::error::db)?;
            self.wake_queues(&woken);
            if claimable {
                self.wakeups.wake_claimers();
            }
            return Ok(consumed);
        }
        let orders: Vec<&NewOrder> = batch.iter().map(|s| &s.order).collect();
        let outcomes = Self::record_orders(&mut tx, now, actor, &orders).await?;
        let accepted = |o: &Result<SubmitOutcome>| matches!(o, Ok(SubmitOutcome::Accepted));
        let sends: Vec<Envelope> = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| accepted(o))
            .flat_map(|(s, _)| s.sends.iter().cloned())
            .collect();
        // A rejected order's message is dead-lettered by the caller.
        let consuming = self.to_consume(messages, &outcomes, Result::is_ok);
        let ended = if !outcomes.iter().any(accepted) {
            self.commit_consuming(tx, now, &sends, &consuming.held)
                .await?
        } else {
            self.commit_claimable_consuming(tx, now, &sends, &consuming.held)
                .await?
        };
        let consumed = consuming.consumed(ended);
        Ok(Consumed { outcomes, consumed })
    }
}
