//! Intake: a new order becomes Pending (`Submitted`), once.

use std::collections::HashSet;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::store::{IntakeStore, NewOrder, Submission, SubmitOutcome};
use orderly_core::transport::Envelope;
use orderly_core::{Actor, Error, ProcessState, Result};

use super::{Event, SqlStore};
use crate::driver::{Driver, NewOrderRow, q};
use crate::error::db;
use crate::statements as st;
use crate::time::Ts;

impl<D: Driver> SqlStore<D> {
    /// Records one new order (details, Pending state row, first history entry) in the
    /// caller's transaction; a repeat is `Duplicate`, the same id with other details
    /// `OrderIdConflict`, and neither writes anything.
    async fn insert_order(
        conn: &mut D::Conn,
        order: &NewOrder,
        actor: &Actor,
        now: DateTime<Utc>,
    ) -> Result<SubmitOutcome> {
        let inserted = q(D::SQL.insert_order)
            .bind(order.order_id.as_str())
            .bind(order.details.to_json())
            .bind(Ts(now))
            .execute::<D>(conn)
            .await
            .map_err(db)?;
        if inserted == 0 {
            let stored = Self::fetch_details(conn, &order.order_id).await?;
            return if stored == order.details {
                Ok(SubmitOutcome::Duplicate)
            } else {
                Err(Error::OrderIdConflict(order.order_id.clone()))
            };
        }
        q(st::INSERT_STATE)
            .bind(order.order_id.as_str())
            .bind(Ts(now))
            .bind(order.reply_to.as_deref())
            .bind(order.workflow.as_deref())
            .execute::<D>(conn)
            .await
            .map_err(db)?;
        let event = Event {
            order_id: &order.order_id,
            at: now,
            actor: actor.as_str(),
            kind: HistoryKind::Submitted,
            from: None,
            to: ProcessState::Pending,
            epoch: 0,
            step: None,
            reason: None,
        };
        Self::append(conn, event).await?;
        Ok(SubmitOutcome::Accepted)
    }
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
        let outcome = Self::insert_order(&mut tx, order, actor, now).await?;
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
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.driver.stats().batch("submit", batch.len());
        let (mut tx, now) = self.begin().await?;
        let checked: Vec<Result<()>> = batch
            .iter()
            .map(|s| s.order.validate().map_err(Error::from))
            .collect();
        let rows: Vec<NewOrderRow<'_>> = batch
            .iter()
            .zip(&checked)
            .filter(|(_, ok)| ok.is_ok())
            .map(|(s, _)| NewOrderRow {
                order_id: s.order.order_id.as_str(),
                details: s.order.details.to_json(),
                reply_to: s.order.reply_to.as_deref(),
                workflow: s.order.workflow.as_deref(),
            })
            .collect();
        let inserted = if rows.is_empty() {
            HashSet::new()
        } else {
            D::insert_orders(&mut tx, now, actor.as_str(), &rows).await?
        };
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut sends = Vec::new();
        // An id inserted now is Accepted once, for its first row; any other row with
        // an id already stored is a repeat or a conflict, as one by one.
        let mut taken = HashSet::with_capacity(inserted.len());
        for (s, ok) in batch.iter().zip(checked) {
            if let Err(invalid) = ok {
                outcomes.push(Err(invalid));
                continue;
            }
            let id = s.order.order_id.as_str();
            if inserted.contains(id) && taken.insert(id) {
                sends.extend(s.sends.iter().cloned());
                outcomes.push(Ok(SubmitOutcome::Accepted));
                continue;
            }
            let stored = Self::fetch_details(&mut tx, &s.order.order_id).await?;
            outcomes.push(if stored == s.order.details {
                Ok(SubmitOutcome::Duplicate)
            } else {
                Err(Error::OrderIdConflict(s.order.order_id.clone()))
            });
        }
        if inserted.is_empty() {
            self.commit_with(tx, now, &sends).await?;
        } else {
            self.commit_claimable(tx, now, &sends).await?;
        }
        Ok(outcomes)
    }
}
