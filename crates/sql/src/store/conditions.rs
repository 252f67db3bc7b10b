//! System alerts (episodes of a condition, `system_alerts`) and the presence of the
//! supervisors (`role_presence`): recorded here as `orderly_core::conditions` decides.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::conditions::{Condition, ConditionKind, ConditionStore, Presence, SystemAlert};
use orderly_core::store::{MAX_BATCH, bounded_text};
use orderly_core::transport::Envelope;
use orderly_core::{OrderId, Result};

use super::SqlStore;
use crate::driver::{Driver, Q, q};
use crate::error::{corrupt, db};
use crate::rows::Cols;
use crate::time::Ts;

const ALERT_COLUMNS: &str = "alert_id, kind, subject, detail, raised_at, raised_by, resolved_at, \
    acknowledged_by, acknowledged_at";

fn alert<R: crate::driver::SqlRow + ?Sized>(c: &Cols<'_, R>) -> Result<SystemAlert> {
    Ok(SystemAlert {
        alert_id: c.get("alert_id")?,
        kind: c
            .get::<String>("kind")?
            .parse()
            .map_err(|e| corrupt("kind", e))?,
        subject: c.get("subject")?,
        detail: c.get("detail")?,
        raised_at: c.ts("raised_at")?,
        raised_by: c.get("raised_by")?,
        resolved_at: c.opt_ts("resolved_at")?,
        acknowledged_by: c.get("acknowledged_by")?,
        acknowledged_at: c.opt_ts("acknowledged_at")?,
    })
}

#[async_trait]
impl<D: Driver> ConditionStore for SqlStore<D> {
    async fn raise(
        &self,
        condition: &Condition,
        by: &str,
        sends: &(dyn for<'a> Fn(&'a SystemAlert) -> Vec<Envelope> + Send + Sync),
    ) -> Result<Option<SystemAlert>> {
        let (mut tx, now) = self.begin().await?;
        let row = Q::dynamic(format!(
            "INSERT INTO system_alerts (kind, subject, detail, raised_at, raised_by) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (kind, subject) WHERE resolved_at IS NULL DO NOTHING \
             RETURNING {ALERT_COLUMNS}"
        ))
        .bind(condition.kind.as_str())
        .bind(condition.subject.as_str())
        .bind(bounded_text(&condition.detail))
        .bind(Ts(now))
        .bind(by)
        .fetch_optional::<D>(&mut tx)
        .await
        .map_err(db)?;
        let Some(row) = row else {
            D::commit(tx).await.map_err(db)?;
            return Ok(None);
        };
        let raised = alert(&Cols(&row))?;
        let messages = sends(&raised);
        self.commit_with(tx, now, &messages).await?;
        Ok(Some(raised))
    }

    async fn resolve(
        &self,
        kind: ConditionKind,
        subject: &str,
        sends: &(dyn for<'a> Fn(&'a SystemAlert) -> Vec<Envelope> + Send + Sync),
    ) -> Result<Option<SystemAlert>> {
        let (mut tx, now) = self.begin().await?;
        let row = Q::dynamic(format!(
            "UPDATE system_alerts SET resolved_at = $3 \
             WHERE kind = $1 AND subject = $2 AND resolved_at IS NULL RETURNING {ALERT_COLUMNS}"
        ))
        .bind(kind.as_str())
        .bind(subject)
        .bind(Ts(now))
        .fetch_optional::<D>(&mut tx)
        .await
        .map_err(db)?;
        let Some(row) = row else {
            D::commit(tx).await.map_err(db)?;
            return Ok(None);
        };
        let resolved = alert(&Cols(&row))?;
        let messages = sends(&resolved);
        self.commit_with(tx, now, &messages).await?;
        Ok(Some(resolved))
    }

    async fn system_alerts(&self, open_only: bool, limit: u32) -> Result<Vec<SystemAlert>> {
        let mut conn = self.driver.acquire().await?;
        let filter = if open_only {
            " WHERE resolved_at IS NULL"
        } else {
            ""
        };
        Q::dynamic(format!(
            "SELECT {ALERT_COLUMNS} FROM system_alerts{filter} ORDER BY alert_id DESC LIMIT $1"
        ))
        .bind(i64::from(limit.clamp(1, MAX_BATCH)))
        .fetch_all::<D>(&mut conn)
        .await
        .map_err(db)?
        .iter()
        .map(|r| alert(&Cols(r)))
        .collect()
    }

    async fn acknowledge_system_alert(
        &self,
        alert_id: i64,
        by: &orderly_core::Actor,
    ) -> Result<Option<SystemAlert>> {
        let (mut tx, now) = self.begin().await?;
        q(
            "UPDATE system_alerts SET acknowledged_by = $2, acknowledged_at = $3 \
           WHERE alert_id = $1 AND acknowledged_at IS NULL",
        )
        .bind(alert_id)
        .bind(by.as_str())
        .bind(Ts(now))
        .execute::<D>(&mut tx)
        .await
        .map_err(db)?;
        let row = Q::dynamic(format!(
            "SELECT {ALERT_COLUMNS} FROM system_alerts WHERE alert_id = $1"
        ))
        .bind(alert_id)
        .fetch_optional::<D>(&mut tx)
        .await
        .map_err(db)?;
        let acknowledged = row.map(|r| alert(&Cols(&r))).transpose()?;
        D::commit(tx).await.map_err(db)?;
        Ok(acknowledged)
    }

    async fn oldest_pending(&self) -> Result<(Option<(OrderId, DateTime<Utc>)>, DateTime<Utc>)> {
        let mut conn = self.driver.acquire().await?;
        let now = self.driver.now(&mut conn).await?;
        // Through the Pending orders' partial index, then sorted (as the orders list
        // reads them, `statements::list_query`).
        let row = q(
            "WITH pending AS MATERIALIZED (SELECT order_id, created_at FROM order_state \
             WHERE process_state = 'Pending' AND next_attempt_at < $1) \
             SELECT order_id, created_at FROM pending ORDER BY created_at, order_id LIMIT 1",
        )
        .bind(Ts(orderly_core::service::held()))
        .fetch_optional::<D>(&mut conn)
        .await
        .map_err(db)?;
        let oldest = row
            .map(|r| {
                let c = Cols(&r);
                Ok::<_, orderly_core::Error>((c.order_id("order_id")?, c.ts("created_at")?))
            })
            .transpose()?;
        Ok((oldest, now))
    }

    async fn workflow_catalogue(
        &self,
    ) -> Result<(
        Vec<orderly_core::store::WorkflowCount>,
        Vec<orderly_core::store::StoredWorkflow>,
    )> {
        use orderly_core::store::SchedulerStore;
        Ok((
            self.workflows_in_flight().await?,
            self.stored_workflows().await?,
        ))
    }

    async fn dead_letter_counts(&self) -> Result<Vec<(String, i64)>> {
        let mut conn = self.driver.acquire().await?;
        q("SELECT queue, count(*) AS n FROM queue_dead_letters GROUP BY queue ORDER BY queue")
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok((c.get("queue")?, c.get("n")?))
            })
            .collect()
    }

    async fn heartbeat(&self, role: &str, instance: &str, leading: bool) -> Result<()> {
        // One statement on its own, with the dialect's now (PostgreSQL's clock unless
        // one is injected; SQLite's is always bound): no transaction around it.
        let mut conn = self.driver.acquire().await?;
        q(
            "INSERT INTO role_presence (role, instance, is_leader, seen_at) \
             VALUES ($1, $2, $3, coalesce($4, CURRENT_TIMESTAMP)) \
             ON CONFLICT (role, instance) DO UPDATE SET is_leader = excluded.is_leader, \
             seen_at = excluded.seen_at",
        )
        .bind(role)
        .bind(instance)
        .bind(leading)
        .bind(self.driver.now_param())
        .execute::<D>(&mut conn)
        .await
        .map_err(db)?;
        Ok(())
    }

    async fn leave(&self, role: &str, instance: &str) -> Result<()> {
        let (mut tx, _) = self.begin().await?;
        q("DELETE FROM role_presence WHERE role = $1 AND instance = $2")
            .bind(role)
            .bind(instance)
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)
    }

    async fn presence(
        &self,
        role: &str,
        within: Duration,
    ) -> Result<(Vec<Presence>, DateTime<Utc>)> {
        let mut conn = self.driver.acquire().await?;
        let now = self.driver.now(&mut conn).await?;
        let since = now - chrono::Duration::from_std(within).unwrap_or_default();
        let rows = q("SELECT instance, is_leader, seen_at FROM role_presence \
             WHERE role = $1 AND seen_at >= $2 ORDER BY instance")
        .bind(role)
        .bind(Ts(since))
        .fetch_all::<D>(&mut conn)
        .await
        .map_err(db)?;
        let presence = rows
            .iter()
            .map(|r| {
                let c = Cols(r);
                Ok(Presence {
                    instance: c.get("instance")?,
                    leading: c.get("is_leader")?,
                    seen_at: c.ts("seen_at")?,
                })
            })
            .collect::<Result<_>>()?;
        Ok((presence, now))
    }
}
