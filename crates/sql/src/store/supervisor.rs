//! The supervisor's port: timed-out orders recovered (as `RecoveryPolicy::decide`
//! decides, applied set-based by the dialect) and alerts published, both fenced by the
//! leader's term.

use async_trait::async_trait;
use orderly_core::leader::LeaderFence;
use orderly_core::store::{
    Alert, Expired, MAX_BATCH, Recovery, RecoveryOutcome, RecoveryPolicy, SupervisorStore,
};
use orderly_core::transport::Envelope;
use orderly_core::{OrderId, Result};

use super::SqlStore;
use crate::driver::{Driver, RecoveryRow, q};
use crate::error::db;
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

/// The row a dialect writes for the recovery `decision` of `order_id`'s run `epoch`:
/// the decision's values, its reason cut to the stored length for the order's last
/// error and its history entry alike.
pub(crate) fn recovery_row(order_id: &OrderId, epoch: i64, decision: &Recovery) -> RecoveryRow {
    RecoveryRow {
        order_id: order_id.as_str().to_owned(),
        epoch,
        failure_count: decision.failure_count,
        state: decision.to.as_str(),
        finish_as: decision.finish_as.map(|s| s.as_str()),
        next_attempt_at: decision.next_attempt_at.map(Ts),
        reason: orderly_core::store::bounded_text(&decision.reason).to_owned(),
        kind: decision.kind.as_str(),
    }
}

impl<D: Driver> SqlStore<D> {
    /// One sweep: lock the expired orders, decide each, apply the decisions.
    async fn recover_batch(
        &self,
        leader: &LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<RecoveryOutcome>> {
        let (mut tx, now) = self.begin().await?;
        Self::check_leader(&mut tx, leader, now).await?;
        let rows = q(D::SQL.lock_expired)
            .bind(Ts(now))
            .bind(i64::from(limit))
            .fetch_all::<D>(&mut tx)
            .await
            .map_err(db)?;
        let mut decided = Vec::with_capacity(rows.len());
        for r in &rows {
            let c = Cols(r);
            let expired = c.expired()?;
            decided.push((
                expired.lock_epoch.0,
                policy.decide(&expired, now),
                expired.order_id,
            ));
        }
        if decided.is_empty() {
            D::commit(tx).await.map_err(db)?;
            return Ok(Vec::new());
        }
        let recoveries: Vec<RecoveryRow> = decided
            .iter()
            .map(|(epoch, d, order_id)| recovery_row(order_id, *epoch, d))
            .collect();
        // An order that goes to Error raises its alert (the `order_state_raises_alert`
        // trigger), in this transaction.
        let applied = D::recover(&mut tx, now, leader.holder.as_str(), &recoveries).await?;
        if recoveries
            .iter()
            .any(|r| r.state == orderly_core::ProcessState::Pending.as_str())
        {
            self.commit_claimable(tx, now, &[]).await?;
        } else {
            D::commit(tx).await.map_err(db)?;
        }
        // Only what was applied (all of them: the rows are locked) is reported.
        Ok(decided
            .into_iter()
            .filter(|(.., id)| applied.contains(id.as_str()))
            .map(|(_, d, _)| d.outcome)
            .collect())
    }
}

#[async_trait]
impl<D: Driver> SupervisorStore for SqlStore<D> {
    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, dry_run))]
    async fn prune(
        &self,
        retention: &orderly_core::store::Retention,
        dry_run: bool,
    ) -> Result<orderly_core::store::Pruned> {
        self.prune_now(retention, dry_run).await
    }

    async fn tidy(&self) -> Result<orderly_core::store::Tidied> {
        self.tidy_now().await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME))]
    async fn tally_finished(&self) -> Result<orderly_core::store::Tallied> {
        self.tally_now().await
    }

    async fn sweep_due(&self) -> Result<orderly_core::store::SweepDue> {
        let mut conn = self.driver.acquire().await?;
        let row = q(D::SQL.sweep_due)
            .bind(self.driver.now_param())
            .fetch_one::<D>(&mut conn)
            .await
            .map_err(db)?;
        let c = Cols(&row);
        Ok(orderly_core::store::SweepDue {
            expired: c.get::<bool>("expired")?,
            alerts: c.get::<bool>("alerts")?,
            outages: c.get::<bool>("outages")?,
        })
    }

    async fn find_expired(&self, limit: u32) -> Result<Vec<Expired>> {
        let mut conn = self.driver.acquire().await?;
        let rows = q(D::SQL.find_expired)
            .bind(self.driver.now_param())
            .bind(i64::from(limit.min(MAX_BATCH)))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        rows.iter().map(|r| Cols(r).expired()).collect()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, instance_id = %leader.holder, epoch = %leader.epoch, limit))]
    async fn recover_expired(
        &self,
        leader: &LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<RecoveryOutcome>> {
        policy.validate()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.recover_batch(leader, policy, limit.min(MAX_BATCH))
            .await
    }

    async fn unpublished_alerts(&self, limit: u32) -> Result<Vec<Alert>> {
        let mut conn = self.driver.acquire().await?;
        q(st::UNPUBLISHED_ALERTS)
            .bind(i64::from(limit.min(MAX_BATCH)))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Cols(r).alert())
            .collect()
    }

    async fn mark_alerts_published(
        &self,
        leader: &LeaderFence,
        alert_ids: &[i64],
        sends: &[Envelope],
    ) -> Result<Vec<i64>> {
        if alert_ids.is_empty() {
            return Ok(Vec::new());
        }
        let (mut tx, now) = self.begin().await?;
        Self::check_leader(&mut tx, leader, now).await?;
        let mut marked = Vec::with_capacity(alert_ids.len());
        for id in alert_ids {
            let n = q(st::MARK_ALERT_PUBLISHED)
                .bind(*id)
                .bind(Ts(now))
                .execute::<D>(&mut tx)
                .await
                .map_err(db)?;
            if n > 0 {
                marked.push(*id);
            }
        }
        self.commit_with(tx, now, sends).await?;
        Ok(marked)
    }
}

#[cfg(test)]
mod tests {
    //! The recovery statement's own guard. A sweep locks the rows it decides on in the
    //! transaction that applies the decisions, so no scheduler can claim an order
    //! again in between: the guard is reached only by calling the dialect directly,
    //! as here. It is what keeps a decision from applying to a later run of the order.

    use std::sync::Arc;
    use std::time::Duration;

    use orderly_core::history::HistoryKind;
    use orderly_core::store::{ClaimRequest, IntakeStore, OperatorStore, SchedulerStore};
    use orderly_core::{InstanceId, ManualClock, OrderId, ProcessState};
    use orderly_testkit::builders::{order_with_id, submitter};

    use super::*;

    /// Decided for `epoch`: the order back to Pending after a timeout.
    fn back_to_pending(order_id: &OrderId, epoch: i64) -> RecoveryRow {
        RecoveryRow {
            order_id: order_id.as_str().to_owned(),
            epoch,
            failure_count: 1,
            state: ProcessState::Pending.as_str(),
            finish_as: None,
            next_attempt_at: None,
            reason: "timed out".into(),
            kind: HistoryKind::Recovered.as_str(),
        }
    }

    async fn recover<D: Driver>(store: &SqlStore<D>, recoveries: &[RecoveryRow]) -> Vec<String> {
        let (mut tx, now) = store.begin().await.unwrap();
        let applied = D::recover(&mut tx, now, "supervisor@test", recoveries)
            .await
            .unwrap();
        D::commit(tx).await.unwrap();
        applied.into_iter().collect()
    }

    /// An order claimed, timed out, then claimed by another scheduler under the next
    /// epoch: the first run's recovery, applied late, changes nothing; the run it was
    /// decided for takes it.
    async fn a_recovery_applies_only_to_the_run_it_was_decided_for<D: Driver>(
        store: SqlStore<D>,
        clock: ManualClock,
    ) {
        let id = OrderId::parse("o-late-rescue").unwrap();
        store
            .submit(&order_with_id(id.as_str(), 1), &submitter(), &[])
            .await
            .unwrap();
        let claim = |owner: &str| ClaimRequest {
            owner: InstanceId::parse(owner).unwrap(),
            limit: 1,
            timeout: Duration::from_secs(30),
            workflows: Arc::default(),
        };
        let first = store.claim(&claim("scheduler-a")).await.unwrap();
        assert_eq!(first.len(), 1);
        clock.advance(Duration::from_secs(60));
        // The first run's decision, and the order recovered under it.
        let stale = back_to_pending(&id, first[0].fence.epoch.0);
        assert_eq!(
            recover(&store, std::slice::from_ref(&stale)).await,
            vec![id.to_string()]
        );
        let second = store.claim(&claim("scheduler-b")).await.unwrap();
        assert_eq!(second.len(), 1);
        clock.advance(Duration::from_secs(60));
        let before = store.get(&id).await.unwrap();

        // The first run's decision again, now that the order runs under the next epoch
        // and is past that run's deadline too.
        assert_eq!(recover(&store, &[stale]).await, Vec::<String>::new());
        let after = store.get(&id).await.unwrap();
        assert_eq!(after.state, before.state, "the later run's row was changed");
        assert_eq!(after.history.len(), before.history.len());

        // Decided for the run it is in, it applies.
        let current = back_to_pending(&id, second[0].fence.epoch.0);
        assert_eq!(recover(&store, &[current]).await, vec![id.to_string()]);
        let view = store.get(&id).await.unwrap();
        assert_eq!(view.state.process_state, ProcessState::Pending);
        assert_eq!(view.state.locked_by, None);
        assert_eq!(view.history_count(HistoryKind::Recovered), 2);
        assert_eq!(
            view.history.last().map(|e| e.epoch),
            Some(second[0].fence.epoch),
            "the entry names the run it recovered"
        );
    }

    #[tokio::test]
    async fn sqlite_a_recovery_applies_only_to_the_run_it_was_decided_for() {
        let (store, clock) = crate::testing::sqlite_at(crate::testing::this_second()).await;
        a_recovery_applies_only_to_the_run_it_was_decided_for(store, clock).await;
    }

    #[tokio::test]
    async fn postgres_a_recovery_applies_only_to_the_run_it_was_decided_for() {
        crate::testing::on_postgres_at(
            crate::testing::this_second(),
            a_recovery_applies_only_to_the_run_it_was_decided_for,
        )
        .await;
    }
}
