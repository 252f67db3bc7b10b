//! How an owner's hold ends or changes: a fenced write with its history entry and
//! the messages it sends, and a batch of completions.

use super::super::{Event, SqlStore};
use crate::driver::{Driver, Q, q};
use crate::error::db;
use crate::statements as st;
use crate::time::Ts;
use orderly_core::history::HistoryKind;
use orderly_core::store::{BatchOutcome, Completion, bounded_text};
use orderly_core::transport::Envelope;
use orderly_core::{Fence, ProcessState, Result};

/// A fenced write that ends or changes the owner's hold: `statement` binds `$1` order,
/// `$2` owner, `$3` epoch, `$4` its argument (or now), `$5` now; `kind` goes to the
/// history and `sends` are enqueued with it.
pub(super) struct OwnerEnd<'a> {
    pub(super) statement: &'static str,
    pub(super) arg: Option<String>,
    pub(super) target: ProcessState,
    pub(super) kind: HistoryKind,
    pub(super) reason: &'a str,
    pub(super) sends: &'a [Envelope],
}

impl<D: Driver> SqlStore<D> {
    pub(super) async fn finish_owned(&self, fence: &Fence, end: OwnerEnd<'_>) -> Result<()> {
        let (tx, now) = self.begin().await?;
        self.finish_owned_in(tx, now, fence, end).await
    }

    /// [`Self::finish_owned`] in the open transaction `tx`, begun at `now`.
    pub(super) async fn finish_owned_in(
        &self,
        mut tx: D::Tx,
        now: chrono::DateTime<chrono::Utc>,
        fence: &Fence,
        end: OwnerEnd<'_>,
    ) -> Result<()> {
        let OwnerEnd {
            statement,
            arg,
            target,
            kind,
            reason,
            sends,
        } = end;
        let fenced: Q<'_> = q(statement)
            .bind(fence.order_id.as_str())
            .bind(fence.owner.as_str())
            .bind(fence.epoch.0);
        let fenced = match arg {
            Some(text) => fenced.bind(text),
            None => fenced.bind(Ts(now)),
        };
        let n = fenced
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        if n == 0 {
            return Err(Self::explain(&mut tx, fence, now, target).await);
        }
        let event = Event {
            reason: Some(reason),
            ..Event::by_owner(fence, now, kind, target)
        };
        Self::append(&mut tx, event).await?;
        if target == ProcessState::Pending {
            self.commit_claimable(tx, now, sends).await
        } else {
            self.commit_with(tx, now, sends).await
        }
    }

    /// Completes a batch of distinct orders; refusals are explained after the commit.
    pub(super) async fn complete_batch(&self, completions: &[Completion]) -> Result<BatchOutcome> {
        let fences: Vec<&Fence> = completions.iter().map(|c| &c.fence).collect();
        let done = if completions.iter().all(|c| c.sends.is_empty()) {
            self.driver.complete(&fences).await?
        } else {
            let (mut tx, now) = self.begin().await?;
            let done = D::complete_in(&mut tx, now, &fences).await?;
            // Only completed orders' messages are sent.
            let sends: Vec<Envelope> = completions
                .iter()
                .filter(|c| done.contains(c.fence.order_id.as_str()))
                .flat_map(|c| c.sends.iter().cloned())
                .collect();
            self.commit_with(tx, now, &sends).await?;
            done
        };
        let (completed, refused): (Vec<&Fence>, Vec<&Fence>) = fences
            .iter()
            .partition(|f| done.contains(f.order_id.as_str()));
        let mut outcome = BatchOutcome {
            completed: completed.iter().map(|f| f.order_id.clone()).collect(),
            refused: Vec::with_capacity(refused.len()),
        };
        if !refused.is_empty() {
            let mut conn = self.driver.acquire().await?;
            let now = self.driver.now(&mut conn).await?;
            for fence in refused {
                let why = Self::explain(&mut conn, fence, now, ProcessState::Processed).await;
                outcome.refused.push((fence.order_id.clone(), why));
            }
        }
        Ok(outcome)
    }
}

/// The owner's end of an order in Error with `error` (cut to the stored length), a
/// failure counted like a timeout, sending `sends`.
pub(super) fn failing<'a>(error: &'a str, sends: &'a [Envelope]) -> OwnerEnd<'a> {
    let error = bounded_text(error);
    OwnerEnd {
        statement: st::FAIL,
        arg: Some(error.to_owned()),
        target: ProcessState::Error,
        kind: HistoryKind::Failed,
        reason: error,
        sends,
    }
}
