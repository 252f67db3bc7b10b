//! The supervisor's port: timed-out orders recovered (as `RecoveryPolicy::decide`
//! decides, applied set-based by the dialect) and alerts published, both fenced by the
//! leader's term.

use async_trait::async_trait;
use orderly_core::leader::LeaderFence;
use orderly_core::store::{
    Alert, ExpiredOrder, MAX_BATCH, Recovered, RecoveryPolicy, SupervisorStore,
};
use orderly_core::transport::Envelope;
use orderly_core::{Epoch, InstanceId, Result};

use super::SqlStore;
use crate::driver::{Driver, Rescue, q};
use crate::error::{corrupt, db};
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

impl<D: Driver> SqlStore<D> {
    /// One sweep: lock the expired orders, decide each, apply the decisions.
    async fn recover_batch(
        &self,
        leader: &LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<Recovered>> {
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
            let epoch: i64 = c.get("lock_epoch")?;
            decided.push((epoch, policy.decide(&expired, now), expired.order_id));
        }
        if decided.is_empty() {
            D::commit(tx).await.map_err(db)?;
            return Ok(Vec::new());
        }
        let rescues: Vec<Rescue> = decided
            .iter()
            .map(|(epoch, d, order_id)| Rescue {
                order_id: order_id.as_str().to_owned(),
                epoch: *epoch,
                failure_count: d.failure_count,
                state: d.to.as_str(),
                finish_as: d.finish_as.map(|s| s.as_str()),
                next_attempt_at: d.next_attempt_at.map(Ts),
                reason: d.reason.clone(),
                kind: d.kind.as_str(),
            })
            .collect();
        // An order that goes to Error raises its alert (the `order_state_raises_alert`
        // trigger), in this transaction.
        let applied = D::rescue(&mut tx, now, leader.holder.as_str(), &rescues).await?;
        if rescues
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

    async fn tidy(&self) -> Result<Vec<orderly_core::store::Vacuumed>> {
        self.tidy_now().await
    }

    async fn find_expired(&self, limit: u32) -> Result<Vec<ExpiredOrder>> {
        let mut conn = self.driver.acquire().await?;
        let rows = q(D::SQL.find_expired)
            .bind(self.driver.now_param())
            .bind(i64::from(limit.min(MAX_BATCH)))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                Ok(ExpiredOrder {
                    order_id: c.order_id("order_id")?,
                    locked_by: c
                        .get::<Option<String>>("locked_by")?
                        .map(InstanceId::parse)
                        .transpose()
                        .map_err(|e| corrupt("locked_by", e))?,
                    lock_epoch: Epoch(c.get("lock_epoch")?),
                    complete_by: c.ts("complete_by")?,
                    failure_count: c.get("failure_count")?,
                })
            })
            .collect()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, instance_id = %leader.holder, epoch = %leader.epoch, limit))]
    async fn recover_expired(
        &self,
        leader: &LeaderFence,
        policy: &RecoveryPolicy,
        limit: u32,
    ) -> Result<Vec<Recovered>> {
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
