//! Leadership terms in the store: the term every leader's write is fenced by, and the
//! SQL lease of the elector that needs no blob store.

use async_trait::async_trait;
use orderly_core::leader::{LeaderFence, LeadershipStore, Term};
use orderly_core::{Epoch, InstanceId, Result, ValidationError};

use super::SqlStore;
use crate::driver::{Driver, q};
use crate::error::{corrupt, db};
use crate::rows::Cols;
use crate::statements as st;
use crate::time::Ts;

#[async_trait]
impl<D: Driver> LeadershipStore for SqlStore<D> {
    async fn begin_term(&self, name: &str, holder: &InstanceId) -> Result<LeaderFence> {
        let (mut tx, now) = self.begin().await?;
        let row = q(st::BEGIN_TERM)
            .bind(name)
            .bind(holder.as_str())
            .bind(Ts(now))
            .fetch_one::<D>(&mut tx)
            .await
            .map_err(db)?;
        let epoch: i64 = Cols(&row).get("epoch")?;
        D::commit(tx).await.map_err(db)?;
        Ok(LeaderFence {
            name: name.to_owned(),
            holder: holder.clone(),
            epoch: Epoch(epoch),
        })
    }

    async fn acquire_lease(
        &self,
        name: &str,
        holder: &InstanceId,
        lease: std::time::Duration,
    ) -> Result<Option<LeaderFence>> {
        let lease = chrono::Duration::from_std(lease)
            .map_err(|_| ValidationError::new("lease", "too long"))?;
        let (mut tx, now) = self.begin().await?;
        let row = q(st::ACQUIRE_LEASE)
            .bind(name)
            .bind(holder.as_str())
            .bind(Ts(now))
            .bind(Ts(now + lease))
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?;
        let epoch: Option<i64> = row.map(|r| Cols(&r).get("epoch")).transpose()?;
        D::commit(tx).await.map_err(db)?;
        Ok(epoch.map(|epoch| LeaderFence {
            name: name.to_owned(),
            holder: holder.clone(),
            epoch: Epoch(epoch),
        }))
    }

    async fn renew_lease(&self, fence: &LeaderFence, lease: std::time::Duration) -> Result<bool> {
        let lease = chrono::Duration::from_std(lease)
            .map_err(|_| ValidationError::new("lease", "too long"))?;
        self.set_lease_expiry(fence, lease).await
    }

    async fn release_lease(&self, fence: &LeaderFence) -> Result<bool> {
        self.set_lease_expiry(fence, chrono::Duration::zero()).await
    }

    async fn term(&self, name: &str) -> Result<Option<Term>> {
        let mut conn = self.driver.acquire().await?;
        let row = q(st::SELECT_TERM)
            .bind(name)
            .fetch_optional::<D>(&mut conn)
            .await
            .map_err(db)?;
        row.map(|r| {
            let c = Cols(&r);
            Ok(Term {
                fence: LeaderFence {
                    name: c.get("name")?,
                    holder: InstanceId::parse(c.get::<String>("holder")?)
                        .map_err(|e| corrupt("leadership.holder", e))?,
                    epoch: Epoch(c.get("epoch")?),
                },
                lease_expires_at: c.opt_ts("lease_expires_at")?,
                started_at: c.ts("started_at")?,
                renewed_at: c.ts("renewed_at")?,
            })
        })
        .transpose()
    }
}

impl<D: Driver> SqlStore<D> {
    /// Sets the SQL lease of a current term to expire `lease` from now.
    async fn set_lease_expiry(&self, fence: &LeaderFence, lease: chrono::Duration) -> Result<bool> {
        let (mut tx, now) = self.begin().await?;
        let n = q(st::SET_LEASE_EXPIRY)
            .bind(&fence.name)
            .bind(fence.epoch.0)
            .bind(fence.holder.as_str())
            .bind(Ts(now))
            .bind(Ts(now + lease))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        Ok(n == 1)
    }
}
