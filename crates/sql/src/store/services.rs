//! Remote services' health shared by the fleet, and the orders parked while one is
//! down. Every decision (Down, Probing, Up, when the next probe goes, when each
//! waiting order resumes) is made by `orderly_core::service`; this module reads the
//! row under a lock, asks, and writes what it was told.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orderly_core::history::HistoryKind;
use orderly_core::service::{
    OutagePolicy, Park, Parked, Reported, Restored, ServiceHealth, ServiceState, ServiceStore,
    held, resume_schedule,
};
use orderly_core::store::bounded_text;
use orderly_core::{Error, InstanceId, OrderId, ProcessState, Result, ValidationError};

use super::{Event, SqlStore};
use crate::driver::{Driver, Q, q};
use crate::error::db;
use crate::rows::Cols;
use crate::time::Ts;

/// The columns [`Cols::service_health`] reads, with `waiting` counted (`$1`: held).
const SELECT_SERVICES: &str = "SELECT h.service, h.state, h.down_since, h.retry_at, \
    h.probes, h.outage, h.alerted, h.resolved, h.last_error, h.reported_by, \
    h.resume_per_second, h.updated_at, \
    (SELECT count(*) FROM order_state s WHERE s.process_state = 'Pending' \
        AND s.waiting_on = h.service AND s.next_attempt_at >= $1) AS waiting \
    FROM service_health h";

/// A service's row, created Up if it has none: `$1` service, `$2` now.
const ENSURE_SERVICE: &str = "INSERT INTO service_health (service, state, updated_at) \
    VALUES ($1, 'Up', $2) ON CONFLICT (service) DO NOTHING";

/// Writes a decided row: `$1` service, then its columns.
const WRITE_SERVICE: &str = "UPDATE service_health SET state = $2, down_since = $3, \
    retry_at = $4, probes = $5, outage = $6, last_error = $7, reported_by = $8, \
    resume_per_second = $9, updated_at = $10 WHERE service = $1";

/// The orders held for service `$1` (`$2`: held), oldest first.
const HELD_FOR: &str = "SELECT order_id FROM order_state \
    WHERE process_state = 'Pending' AND waiting_on = $1 AND next_attempt_at >= $2 \
    ORDER BY created_at, order_id";

/// A fenced park: `$1` order, `$2` owner, `$3` epoch, `$4` next attempt, `$5` now,
/// `$6` the service, `$7` the step it must be at (-1: any).
const PARK: &str = "UPDATE order_state SET process_state = 'Pending', locked_by = NULL, \
    complete_by = NULL, next_attempt_at = $4, waiting_on = $6, updated_at = $5 \
    WHERE order_id = $1 AND locked_by = $2 AND lock_epoch = $3 \
    AND process_state = 'Processing' AND complete_by > $5 AND ($7 < 0 OR current_step = $7)";

impl<D: Driver> SqlStore<D> {
    /// Commits a transaction that wrote a service's row so that every view of the
    /// services hears of it: other processes' at commit (PostgreSQL `NOTIFY`; SQLite's
    /// watcher hears any commit), this process's right after. `claimable`: it made
    /// orders claimable as well.
    async fn commit_services(
        &self,
        mut tx: D::Tx,
        now: DateTime<Utc>,
        claimable: bool,
    ) -> Result<()> {
        D::notify_sent(&mut tx, &self.wakeups.notice(crate::wakeups::SERVICES))
            .await
            .map_err(db)?;
        if claimable {
            self.commit_claimable(tx, now, &[]).await?;
        } else {
            D::commit(tx).await.map_err(db)?;
        }
        self.wakeups.services.anything();
        Ok(())
    }

    /// The row of `service`, locked against other writers until the transaction ends
    /// (created Up first if it has none).
    async fn lock_service(
        conn: &mut D::Conn,
        service: &str,
        now: DateTime<Utc>,
    ) -> Result<ServiceHealth> {
        q(ENSURE_SERVICE)
            .bind(service)
            .bind(Ts(now))
            .execute::<D>(conn)
            .await
            .map_err(db)?;
        let row = Q::dynamic(format!(
            "{SELECT_SERVICES} WHERE h.service = $2{}",
            D::SQL.for_update
        ))
        .bind(Ts(held()))
        .bind(service)
        .fetch_one::<D>(conn)
        .await
        .map_err(db)?;
        Cols(&row).service_health()
    }

    async fn write_service(conn: &mut D::Conn, h: &ServiceHealth) -> Result<()> {
        q(WRITE_SERVICE)
            .bind(h.service.as_str())
            .bind(h.state.as_str())
            .bind(h.down_since.map(Ts))
            .bind(h.retry_at.map(Ts))
            .bind(h.probes)
            .bind(h.outage)
            .bind(h.last_error.as_deref())
            .bind(h.reported_by.as_deref())
            .bind(h.resume_per_second)
            .bind(Ts(h.updated_at))
            .execute::<D>(conn)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Makes `ids` claimable again from `at` (they stay marked as having waited for
    /// `service`, so their step goes as uncertain), each with a `WaitEnded` entry.
    async fn end_wait(
        conn: &mut D::Conn,
        ids: &[String],
        at: DateTime<Utc>,
        now: DateTime<Utc>,
        actor: &str,
        reason: &str,
    ) -> Result<()> {
        Q::dynamic(format!(
            "INSERT INTO order_history \
             (order_id, at, actor, kind, from_state, to_state, epoch, step, reason) \
             SELECT order_id, $2, $3, $4, 'Pending', 'Pending', lock_epoch, current_step, $5 \
             FROM order_state WHERE order_id IN ({}) AND process_state = 'Pending' \
             AND next_attempt_at >= $6",
            D::SQL.texts_of_1
        ))
        .bind(ids.to_vec())
        .bind(Ts(now))
        .bind(actor)
        .bind(HistoryKind::WaitEnded.as_str())
        .bind(bounded_text(reason))
        .bind(Ts(held()))
        .execute::<D>(conn)
        .await
        .map_err(db)?;
        Q::dynamic(format!(
            "UPDATE order_state SET next_attempt_at = $2, updated_at = $3 \
             WHERE order_id IN ({}) AND process_state = 'Pending' AND next_attempt_at >= $4",
            D::SQL.texts_of_1
        ))
        .bind(ids.to_vec())
        .bind(Ts(at))
        .bind(Ts(now))
        .bind(Ts(held()))
        .execute::<D>(conn)
        .await
        .map_err(db)?;
        Ok(())
    }

    /// Every order held for `service`, made claimable again at its rate, oldest first.
    /// Returns how many, and when the last one may be claimed.
    async fn resume_all(
        conn: &mut D::Conn,
        health: &ServiceHealth,
        now: DateTime<Utc>,
        actor: &str,
    ) -> Result<(u64, Option<DateTime<Utc>>)> {
        let ids: Vec<String> = q(HELD_FOR)
            .bind(health.service.as_str())
            .bind(Ts(held()))
            .fetch_all::<D>(conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Cols(r).get::<String>("order_id"))
            .collect::<Result<_>>()?;
        let rate = u32::try_from(health.resume_per_second.max(1)).unwrap_or(1);
        let reason = format!(
            "{} is up again: claimable again (waiting orders resume at {rate}/s)",
            health.service
        );
        let mut from = 0;
        let mut last = None;
        for (n, at) in resume_schedule(now, ids.len(), rate) {
            Self::end_wait(conn, &ids[from..from + n], at, now, actor, &reason).await?;
            from += n;
            last = Some(at);
        }
        Ok((ids.len() as u64, last))
    }

    /// Parks each order of `parks` in one transaction (see `SchedulerStore::park_many`).
    pub(crate) async fn park_batch(&self, parks: &[Park]) -> Result<Vec<Result<Parked>>> {
        for p in parks {
            check_service(&p.service)?;
        }
        if parks.is_empty() {
            return Ok(Vec::new());
        }
        let (mut tx, now) = self.begin().await?;
        let mut out = Vec::with_capacity(parks.len());
        let mut released = false;
        for p in parks {
            let parked = Self::park_one(&mut tx, now, p).await?;
            released |= matches!(parked, Ok(Parked::Released));
            out.push(parked);
        }
        if released {
            self.commit_claimable(tx, now, &[]).await?;
        } else {
            D::commit(tx).await.map_err(db)?;
        }
        Ok(out)
    }

    /// Parks one order in the transaction `tx` at `now`: held while its service is
    /// down, released (claimable at once) if it is up again by now, with its history
    /// entry; an error if the owner's fence or the step no longer holds.
    async fn park_one(tx: &mut D::Conn, now: DateTime<Utc>, p: &Park) -> Result<Result<Parked>> {
        // The service's row is kept from changing until this commits, so a recovery
        // cannot slip between reading it Down and holding the order: it either ran
        // before (the order is released) or waits and resumes it.
        let down = Q::dynamic(format!(
            "SELECT state FROM service_health WHERE service = $1{}",
            D::SQL.for_share
        ))
        .bind(p.service.as_str())
        .fetch_optional::<D>(&mut *tx)
        .await
        .map_err(db)?
        .map(|r| Cols(&r).get::<String>("state"))
        .transpose()?
        .is_some_and(|s| s != ServiceState::Up.as_str());
        let (next, parked) = if down {
            (held(), Parked::Held)
        } else {
            (now, Parked::Released)
        };
        let n = q(PARK)
            .bind(p.fence.order_id.as_str())
            .bind(p.fence.owner.as_str())
            .bind(p.fence.epoch.0)
            .bind(Ts(next))
            .bind(Ts(now))
            .bind(p.service.as_str())
            .bind(p.expect_step.unwrap_or(-1))
            .execute::<D>(&mut *tx)
            .await
            .map_err(db)?;
        if n == 0 {
            return Ok(Err(
                Self::explain_step(tx, &p.fence, now, p.expect_step).await
            ));
        }
        let reason = match parked {
            Parked::Held => p.reason.clone(),
            Parked::Released => format!(
                "{}; {} is up again by now: claimable at once",
                p.reason, p.service
            ),
        };
        let step = Self::fetch_state(tx, &p.fence.order_id)
            .await?
            .map(|r| r.current_step);
        let event = Event {
            reason: Some(&reason),
            step,
            ..Event::by_owner(&p.fence, now, HistoryKind::Waiting, ProcessState::Pending)
        };
        Self::append(tx, event).await?;
        Ok(Ok(parked))
    }
}

/// Refuses a service name that cannot be an agent queue's.
fn check_service(service: &str) -> Result<()> {
    orderly_core::transport::QueueName::parse(service)
        .map(|_| ())
        .map_err(|e| Error::from(ValidationError::new("service", e.to_string())))
}

#[async_trait]
impl<D: Driver> ServiceStore for SqlStore<D> {
    async fn services(&self) -> Result<Vec<ServiceHealth>> {
        let mut conn = self.driver.acquire().await?;
        Q::dynamic(format!("{SELECT_SERVICES} ORDER BY h.service"))
            .bind(Ts(held()))
            .fetch_all::<D>(&mut conn)
            .await
            .map_err(db)?
            .iter()
            .map(|r| Cols(r).service_health())
            .collect()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, service, instance_id = %by))]
    async fn report_failure(
        &self,
        service: &str,
        error: &str,
        by: &InstanceId,
        policy: &OutagePolicy,
    ) -> Result<Reported> {
        check_service(service)?;
        policy.validate()?;
        let (mut tx, now) = self.begin().await?;
        let current = Self::lock_service(&mut tx, service, now).await?;
        let reported = current.after_failure(now, error, by.as_str(), policy);
        Self::write_service(&mut tx, &reported.health).await?;
        // A failure reported again while down changes only the last error: no view
        // needs reading again for it.
        let h = &reported.health;
        if (h.state, h.retry_at, h.outage) == (current.state, current.retry_at, current.outage) {
            D::commit(tx).await.map_err(db)?;
        } else {
            self.commit_services(tx, now, false).await?;
        }
        Ok(reported)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, service, by))]
    async fn report_success(&self, service: &str, by: &str) -> Result<Option<Restored>> {
        check_service(service)?;
        let (mut tx, now) = self.begin().await?;
        let current = Self::lock_service(&mut tx, service, now).await?;
        let Some(mut health) = current.after_success(now, by) else {
            D::commit(tx).await.map_err(db)?;
            return Ok(None);
        };
        Self::write_service(&mut tx, &health).await?;
        let (resumed, last_at) = Self::resume_all(&mut tx, &health, now, by).await?;
        self.commit_services(tx, now, resumed > 0).await?;
        health.waiting = 0;
        Ok(Some(Restored {
            health,
            resumed,
            last_at,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, service, by))]
    async fn release_probe(&self, service: &str, by: &str) -> Result<Option<Option<OrderId>>> {
        check_service(service)?;
        let (mut tx, now) = self.begin().await?;
        let current = Self::lock_service(&mut tx, service, now).await?;
        if !current.probe_due(now) {
            D::commit(tx).await.map_err(db)?;
            return Ok(None);
        }
        Self::write_service(&mut tx, &current.probing(now, by)).await?;
        let oldest = Q::dynamic(format!("{HELD_FOR} LIMIT 1"))
            .bind(service)
            .bind(Ts(held()))
            .fetch_optional::<D>(&mut tx)
            .await
            .map_err(db)?
            .map(|r| Cols(&r).get::<String>("order_id"))
            .transpose()?;
        let Some(id) = oldest else {
            self.commit_services(tx, now, false).await?;
            return Ok(Some(None));
        };
        let reason = format!(
            "let through as the probe of {} (down since {})",
            service,
            current
                .down_since
                .map(|t| t.format("%H:%M:%S UTC").to_string())
                .unwrap_or_default()
        );
        Self::end_wait(&mut tx, std::slice::from_ref(&id), now, now, by, &reason).await?;
        self.commit_services(tx, now, true).await?;
        let id = OrderId::parse(id).map_err(|e| crate::error::corrupt("order_id", e))?;
        Ok(Some(Some(id)))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = D::NAME, service, by))]
    async fn resume_waiting(&self, service: &str, by: &str) -> Result<u64> {
        check_service(service)?;
        let (mut tx, now) = self.begin().await?;
        let current = Self::lock_service(&mut tx, service, now).await?;
        if current.state != ServiceState::Up || current.waiting == 0 {
            D::commit(tx).await.map_err(db)?;
            return Ok(0);
        }
        let (resumed, _) = Self::resume_all(&mut tx, &current, now, by).await?;
        if resumed > 0 {
            self.commit_claimable(tx, now, &[]).await?;
        } else {
            D::commit(tx).await.map_err(db)?;
        }
        Ok(resumed)
    }

    async fn services_written(
        &self,
        seen: &mut u64,
        poll: std::time::Duration,
        longest: std::time::Duration,
    ) {
        let signal = &self.wakeups.services;
        let woken = signal.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if signal.sent() == *seen {
            self.driver.start_listening(&self.wakeups);
            let wait = if self.waits_timed_by_store() {
                longest
            } else {
                poll
            };
            let _ = tokio::time::timeout(wait, woken).await;
        }
        *seen = signal.sent();
    }

    async fn mark_outage_published(
        &self,
        leader: &orderly_core::leader::LeaderFence,
        service: &str,
        outage: i32,
        ended: bool,
        sends: &[orderly_core::transport::Envelope],
    ) -> Result<bool> {
        let (mut tx, now) = self.begin().await?;
        Self::check_leader(&mut tx, leader, now).await?;
        let column = if ended { "resolved" } else { "alerted" };
        let n = Q::dynamic(format!(
            "UPDATE service_health SET {column} = $2 WHERE service = $1 AND {column} < $2"
        ))
        .bind(service)
        .bind(outage)
        .execute::<D>(&mut tx)
        .await
        .map_err(db)?;
        if n == 0 {
            D::commit(tx).await.map_err(db)?;
            return Ok(false);
        }
        self.commit_with(tx, now, sends).await?;
        Ok(true)
    }
}
