//! The fleet's view of the remote services, as this agent takes part in it: when its
//! breaker for a service opens it reports the service down in the store (so schedulers
//! stop sending it work and park the orders that need it); while the fleet sees a
//! service down it answers that service's requests at once with a `Deferred` reply
//! instead of calling; and when the service answers again it reports it up (so the
//! waiting orders resume). See `orderly_core::service`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::InstanceId;
use orderly_core::service::{OutagePolicy, ServiceState, ServiceView};
use orderly_core::transport::QueueName;
use tracing::{debug, info, warn};

/// How this agent shares what it sees of its services.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// What an outage it reports looks like (first probe, longest wait, resume rate).
    pub policy: OutagePolicy,
    /// Queues (services) it keeps to itself: a failure there only opens this agent's
    /// own breaker, as without the fleet (the per-service off switch).
    pub excluded: HashSet<QueueName>,
    /// How often it reads the fleet's view again.
    pub refresh: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            policy: OutagePolicy::default(),
            excluded: HashSet::new(),
            refresh: Duration::from_secs(1),
        }
    }
}

/// This agent's part in the fleet's view.
pub(crate) struct Fleet {
    pub(crate) view: Arc<ServiceView>,
    pub(crate) cfg: FleetConfig,
    instance: InstanceId,
    /// Services with a success report in flight (one at a time is enough).
    reporting_up: Mutex<HashSet<String>>,
}

impl Fleet {
    pub(crate) fn new(view: Arc<ServiceView>, cfg: FleetConfig, instance: InstanceId) -> Self {
        Self {
            view,
            cfg,
            instance,
            reporting_up: Mutex::default(),
        }
    }

    /// Whether `queue`'s service takes part (not switched off for it).
    pub(crate) fn covers(&self, queue: &QueueName) -> bool {
        !self.cfg.excluded.contains(queue)
    }

    /// Why a request for `service` must not be called now, if the fleet sees it down
    /// and no probe is due (a request that arrives once a probe is due may be it).
    pub(crate) fn down_now(&self, service: &str, now: DateTime<Utc>) -> Option<String> {
        let health = self.view.get(service)?;
        let held = match health.state {
            ServiceState::Up => false,
            ServiceState::Down => health.retry_at.is_none_or(|at| at > now),
            // Probing: the probe's own request is let through; others do not come.
            ServiceState::Probing => false,
        };
        held.then(|| format!("{} (fleet view); not called", health.describe()))
    }

    /// Whether the fleet is known to see `service` as not up (so deferring a request
    /// parks its order instead of handing it straight back).
    pub(crate) fn knows_down(&self, service: &str) -> bool {
        self.view
            .get(service)
            .is_some_and(|h| h.state != ServiceState::Up)
    }

    /// This agent's breaker for `service` opened after `error`: reports it, retrying a
    /// few times if the store does not answer (the breaker keeps this agent off the
    /// service meanwhile).
    pub(crate) async fn report_down(&self, service: &str, error: &str) {
        for attempt in 0..5u32 {
            match self
                .view
                .store()
                .report_failure(service, error, &self.instance, &self.cfg.policy)
                .await
            {
                Ok(reported) => {
                    if reported.began {
                        warn!(service, error, retry_at = ?reported.health.retry_at, "service down: reported to the fleet; orders that need it wait for it");
                        metrics::counter!("orderly_service_outages_total", "service" => service.to_owned())
                            .increment(1);
                    } else {
                        debug!(service, state = %reported.health.state, "service failure reported");
                    }
                    self.view.learn(reported.health);
                    return;
                }
                Err(e) => {
                    warn!(service, error = %e, attempt, "cannot report the service down; retrying");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }

    /// `service` answered: if the fleet sees it not up, reports it up (its waiting
    /// orders resume). One report per service at a time.
    pub(crate) async fn report_up(&self, service: &str) {
        if !self.knows_down(service) {
            return;
        }
        {
            let mut busy = self
                .reporting_up
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !busy.insert(service.to_owned()) {
                return;
            }
        }
        match self
            .view
            .store()
            .report_success(service, self.instance.as_str())
            .await
        {
            Ok(Some(back)) => {
                info!(service, resumed = back.resumed, last_at = ?back.last_at, "service answering again: reported to the fleet; its waiting orders resume");
                self.view.learn(back.health);
            }
            Ok(None) => {
                let _ = self.view.refresh().await;
            }
            Err(e) => {
                warn!(service, error = %e, "cannot report the service up; the next answer will")
            }
        }
        self.reporting_up
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(service);
    }
}
