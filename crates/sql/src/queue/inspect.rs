//! The [`orderly_core::transport::QueueInspector`] port on the SQL queue.

use async_trait::async_trait;
use orderly_core::transport::QueueName;

use super::{Q_DEPTHS, Q_FORGET_DEAD, Q_REQUEUE, Result, db};
use crate::driver::{Driver, q};
use crate::rows::Cols;
use crate::store::SqlStore;
use crate::time::Ts;

#[async_trait]
impl<D: Driver> orderly_core::transport::QueueInspector for SqlStore<D> {
    /// The queue lives in the store's database: answering a statement is enough.
    async fn ping(&self) -> Result<()> {
        orderly_core::store::OperatorStore::ping(self)
            .await
            .map_err(|e| orderly_core::transport::TransportError::Unavailable(e.into()))
    }

    async fn depths(&self) -> Result<Vec<orderly_core::transport::QueueDepth>> {
        let mut conn = self.driver.acquire().await?;
        let now = self.driver.now(&mut conn).await?;
        let rows = q(Q_DEPTHS)
            .bind(Ts(now))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                let c = Cols(r);
                let name: String = c.get("queue")?;
                Ok(orderly_core::transport::QueueDepth {
                    queue: QueueName::parse(name)?,
                    ready: c.get("ready")?,
                    locked: c.get("locked")?,
                    scheduled: c.get("scheduled")?,
                    dead_lettered: c.get("dead_lettered")?,
                })
            })
            .collect()
    }

    async fn requeue_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize> {
        let (mut tx, now) = self.begin().await?;
        let n = q(Q_REQUEUE)
            .bind(queue.as_str())
            .bind(message_id)
            .bind(Ts(now))
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        q(Q_FORGET_DEAD)
            .bind(queue.as_str())
            .bind(message_id)
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        Ok(n as usize)
    }

    async fn discard_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize> {
        let (mut tx, _) = self.begin().await?;
        let n = q(Q_FORGET_DEAD)
            .bind(queue.as_str())
            .bind(message_id)
            .execute::<D>(&mut tx)
            .await
            .map_err(db)?;
        D::commit(tx).await.map_err(db)?;
        Ok(n as usize)
    }
}
