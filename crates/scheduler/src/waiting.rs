//! Orders waiting for a remote service that is down: the scheduler sends no request
//! to a service the fleet sees Down and parks the order instead (Pending, held until
//! the service is back, not counted as a failure); it parks an order whose agent
//! deferred its request for the same reason; and it lets each due probe through and
//! resumes orders left waiting for a service that is up (see `orderly_core::service`).

use orderly_core::Fence;
use orderly_core::service::{Park, Parked, ServiceHealth};
use orderly_core::transport::QueueName;
use tracing::{debug, info, warn};

use crate::{Pass, Scheduler};

impl Scheduler {
    /// The service `queue` stands for, if a request to it may not be sent now.
    /// `waiting_on`: the service the order was parked for (it may be its probe).
    pub(crate) fn blocked(
        &self,
        queue: &QueueName,
        waiting_on: Option<&str>,
    ) -> Option<ServiceHealth> {
        let view = self.services.as_ref()?;
        let health = view.get(queue.as_str())?;
        let probe = waiting_on == Some(queue.as_str());
        health.blocks(probe, self.clock.now()).then_some(health)
    }

    /// The park of an order held under `fence` at `step` (`None`: while undoing) that
    /// waits for `health`'s service.
    pub(crate) fn park_for(fence: &Fence, step: Option<i32>, health: &ServiceHealth) -> Park {
        Park {
            fence: fence.clone(),
            expect_step: step,
            service: health.service.clone(),
            reason: health.waiting_reason(),
        }
    }

    /// Parks orders in one transaction, counting what happened in `pass`.
    pub(crate) async fn park(&self, parks: &[Park], pass: &mut Pass) -> orderly_core::Result<()> {
        if parks.is_empty() {
            return Ok(());
        }
        let verdicts = self.store.park_many(parks).await?;
        for (park, verdict) in parks.iter().zip(verdicts) {
            match verdict {
                Ok(Parked::Held) => {
                    pass.parked += 1;
                    metrics::counter!("orderly_orders_parked_total", "service" => park.service.clone())
                        .increment(1);
                    debug!(order_id = %park.fence.order_id, service = %park.service, reason = %park.reason, "order waits for its service");
                }
                Ok(Parked::Released) => {
                    pass.parked += 1;
                    debug!(order_id = %park.fence.order_id, service = %park.service, "order handed back: its service is up again");
                }
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => {
                    debug!(order_id = %park.fence.order_id, error = %e, "park refused: the order moved on");
                    pass.dropped += 1;
                }
            }
        }
        Ok(())
    }

    /// Reads the fleet's view of the services again; lets through each probe that is
    /// due (one scheduler of the fleet wins each), and resumes orders still waiting
    /// for a service that is up. Does nothing without a view.
    pub async fn watch_services(&self) -> orderly_core::Result<()> {
        let Some(view) = &self.services else {
            return Ok(());
        };
        view.refresh().await?;
        let now = self.clock.now();
        let me = self.cfg.instance.as_str();
        for health in view.snapshot().values() {
            if health.probe_due(now) {
                match view.store().release_probe(&health.service, me).await? {
                    Some(Some(order_id)) => {
                        info!(service = %health.service, %order_id, down_since = ?health.down_since, "probe: one waiting order let through to see whether the service is back");
                    }
                    Some(None) => {
                        info!(service = %health.service, "probe: the next order that needs the service goes through");
                    }
                    None => {}
                }
            } else if health.state == orderly_core::service::ServiceState::Up && health.waiting > 0
            {
                let resumed = view.store().resume_waiting(&health.service, me).await?;
                if resumed > 0 {
                    warn!(service = %health.service, resumed, "orders left waiting for a service that is up resume");
                }
            }
        }
        // The rows just written (Probing) are read back at the next call.
        Ok(())
    }
}
