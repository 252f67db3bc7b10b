//! The supervisor role: every interval, finds orders whose deadline (CompleteBy) has
//! passed and recovers them through the state store (FailureCount + 1, back to
//! Pending after a back-off that grows with the count, or Error at the threshold), and
//! publishes the operator alerts every Error raises: to the alerts queue, as a
//! structured log event, and as a `failed` status to the client's reply queue.
//!
//! It never does business work, and it works only while it leads: the supervisor
//! instances elect one leader ([`orderly_core::leader::Elector`]) and every write the
//! leader makes carries its term, so a deposed leader's writes are refused by the
//! store. (Even without that, the store counts each expiry once however many race.)
//!
//! The library depends on `orderly-core` ports only; the binary (`src/main.rs`) wires
//! it, and its leader election, through `orderly-runtime`.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::InstanceId;
use orderly_core::leader::{
    Elector, ElectorTiming, Heartbeat, LeaderExit, LeaderFence, Leadership,
};
use orderly_core::service::ServiceStore;
use orderly_core::store::{RecoveryOutcome, RecoveryPolicy, Retention, SupervisorStore};
use orderly_core::transport::QueueName;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

mod conditions;
mod publish;
pub mod webhook;

pub use conditions::Watch as ConditionWatch;
pub use webhook::{AlertWebhook, WebhookConfig};

/// The leadership the supervisors elect.
pub const LEADERSHIP: &str = orderly_core::leader::SUPERVISORS;

/// An elector over the SQL lease row in `store`: the embedded default.
pub fn sql_elector(
    store: Arc<dyn orderly_core::leader::LeadershipStore>,
    instance: InstanceId,
    timing: ElectorTiming,
) -> Result<Elector, orderly_core::ValidationError> {
    orderly_core::leader::sql_elector(LEADERSHIP, store, instance, timing)
}

/// How a supervisor works.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// This instance.
    pub instance: InstanceId,
    /// Retry or give up, and the back-off.
    pub policy: RecoveryPolicy,
    /// Time between sweeps.
    pub interval: Duration,
    /// Most orders recovered (or alerts published) per statement.
    pub batch: u32,
    /// Where alerts go.
    pub alerts: QueueName,
    /// What the leader removes, and how much per transaction (`None`: keep everything).
    pub retention: Option<Retention>,
    /// How often the leader prunes under `retention`.
    pub prune_every: Duration,
    /// How often the leader reclaims what updates and deletes left behind in the hot
    /// tables, where the store keeps it ([`SupervisorStore::tidy`]; `None`: never, the
    /// database's own vacuum is left to it).
    pub tidy_every: Option<Duration>,
    /// Raise an alert when the oldest Pending order (not one waiting for a service that
    /// is down) is older than this (`None`: never).
    pub pending_alert_after: Option<Duration>,
    /// How often the leader looks at the conditions it alerts on.
    pub conditions_every: Duration,
    /// How often the leader tallies the orders finished since its last tally
    /// ([`SupervisorStore::tally_finished`]), so that counting orders by state reads
    /// the tallies, not every finished order.
    pub tally_every: Duration,
    /// How often every supervisor says it runs (and whether it leads).
    pub presence_every: Duration,
}

impl SupervisorConfig {
    /// Defaults: the default recovery policy, a sweep every second, batches of 500;
    /// finished orders kept 7 days, pruned every 10 minutes.
    pub fn new(instance: InstanceId) -> Self {
        Self {
            instance,
            policy: RecoveryPolicy::default(),
            interval: Duration::from_secs(1),
            batch: 500,
            alerts: QueueName::parse(orderly_core::messages::queues::ALERTS)
                .unwrap_or_else(|_| unreachable!("literal queue name")),
            retention: Some(Retention {
                keep: Duration::from_secs(7 * 86_400),
                batch: 500,
            }),
            prune_every: Duration::from_secs(600),
            tidy_every: Some(Duration::from_secs(1)),
            pending_alert_after: Some(Duration::from_secs(300)),
            conditions_every: Duration::from_secs(5),
            tally_every: Duration::from_secs(60),
            presence_every: Duration::from_secs(2),
        }
    }
}

/// The longest the leader's look at the hot tables' left-behind rows waits, in
/// `tidy_every`s, while nothing is written.
pub const TIDY_QUIET_MAX: u32 = 8;

/// How long until the next look at the hot tables, after one that counted `now` row
/// versions left behind where the one before counted `before`: `period` while they
/// change (writes go on, and their vacuums must keep up), twice the last wait while
/// they do not (nothing updated or deleted meanwhile), up to [`TIDY_QUIET_MAX`]
/// periods. Before, an idle deployment read the database's statistics every second.
pub fn next_tidy(
    period: Duration,
    last: Duration,
    before: Option<u64>,
    now: Option<u64>,
) -> Duration {
    match (before, now) {
        (Some(before), Some(now)) if before == now => (last * 2).min(period * TIDY_QUIET_MAX),
        _ => period,
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Orders sent back to Pending.
    pub retried: usize,
    /// Orders moved to Error.
    pub gave_up: usize,
    /// Alerts published (orders in Error, services' outages starting and ending).
    pub alerts: usize,
    /// Orders parked again: they waited for a service that is still down.
    pub waiting: usize,
}

/// A supervisor instance.
#[derive(Clone)]
pub struct Supervisor {
    store: Arc<dyn SupervisorStore>,
    cfg: SupervisorConfig,
    webhook: Option<AlertWebhook>,
    /// Where remote services' outages are read, to announce each once.
    services: Option<Arc<dyn ServiceStore>>,
    /// Where the system alerts are recorded and the supervisors' presence kept.
    conditions: Option<conditions::Conditions>,
}

impl Supervisor {
    /// A supervisor over `store`. It publishes alerts through the store, in the same
    /// fenced transaction that marks them published (to the store's queue, or its
    /// outbox for an external transport).
    pub fn new(
        store: Arc<dyn SupervisorStore>,
        cfg: SupervisorConfig,
    ) -> orderly_core::Result<Self> {
        cfg.policy.validate()?;
        Ok(Self {
            store,
            cfg,
            webhook: None,
            services: None,
            conditions: None,
        })
    }

    /// The supervisor as its binary runs it, on one state store: [`Self::new`] over
    /// `store`, announcing the services' outages ([`Self::with_services`]) and the
    /// system's conditions ([`Self::with_conditions`]) from it. The local runner starts
    /// it the same way.
    pub fn wired(
        store: Arc<dyn orderly_core::store::StateStore>,
        cfg: SupervisorConfig,
    ) -> orderly_core::Result<Self> {
        Ok(Self::new(store.clone(), cfg)?
            .with_services(store.clone())
            .with_conditions(store))
    }

    /// Also raises and resolves the alerts about the system (the oldest Pending order
    /// waiting too long, dead letters growing, no supervisor leading), recorded in
    /// `store` with the presence of every supervisor.
    #[must_use]
    pub fn with_conditions(
        mut self,
        store: Arc<dyn orderly_core::conditions::ConditionStore>,
    ) -> Self {
        self.conditions = Some(store);
        self
    }

    /// Also announces each remote service's outage, when it starts and when it ends,
    /// once (the alerts queue, the log and the webhook), from `services`.
    #[must_use]
    pub fn with_services(mut self, services: Arc<dyn ServiceStore>) -> Self {
        self.services = Some(services);
        self
    }

    /// Also POSTs every alert it publishes to a webhook (never waiting for it).
    pub fn with_webhook(mut self, webhook: AlertWebhook) -> Self {
        self.webhook = Some(webhook);
        self
    }

    /// One sweep under `leader`'s term: recovers every expired order (in batches),
    /// then publishes the alerts not yet published.
    pub async fn run_once(&self, leader: &LeaderFence) -> orderly_core::Result<Sweep> {
        self.sweep(leader, &|| {}).await
    }

    async fn sweep(
        &self,
        leader: &LeaderFence,
        alive: &(dyn Fn() + Sync),
    ) -> orderly_core::Result<Sweep> {
        let mut sweep = Sweep::default();
        let due = self.store.sweep_due().await?;
        if due.expired {
            loop {
                alive();
                let recovered = self
                    .store
                    .recover_expired(leader, &self.cfg.policy, self.cfg.batch)
                    .await?;
                for r in &recovered {
                    self.report(r, &mut sweep);
                }
                if (recovered.len() as u32) < self.cfg.batch {
                    break;
                }
            }
        }
        if due.alerts {
            sweep.alerts = self.publish_alerts(leader, alive).await?;
        }
        if due.outages {
            sweep.alerts += self.publish_outages(leader).await?;
        }
        Ok(sweep)
    }

    /// The leader task: sweeps every interval under `leadership`'s term until it is
    /// cancelled, beating its heartbeat at every sweep and batch. A sweep the store
    /// refuses because another term began ends the term at once; an unavailable store
    /// is logged and retried at the next interval. Under a retention policy it also
    /// prunes every `prune_every`, beside the sweeps.
    pub async fn lead(self, leadership: Leadership) -> LeaderExit {
        let Leadership {
            fence,
            cancelled,
            heartbeat,
        } = leadership;
        let span = info_span!("supervisor", instance_id = %self.cfg.instance, epoch = %fence.epoch);
        async move {
            info!(
                interval_ms = self.cfg.interval.as_millis() as u64,
                "supervising"
            );
            // Pruning, vacuuming and the conditions run beside the sweeps, never in
            // their way: a first prune of a large backlog takes many batches, and a
            // vacuum of a large table a while, and recoveries must not wait for them.
            // They end with the term (a batch cut short is rolled back).
            tokio::select! {
                exit = self.sweep_loop(&fence, &cancelled, &heartbeat) => exit,
                never = self.prune_loop() => never,
                never = self.tidy_loop() => never,
                never = self.condition_loop() => never,
                never = self.tally_loop() => never,
            }
        }
        .instrument(span)
        .await
    }

    /// Counts, measures and logs one recovery of a sweep.
    fn report(&self, r: &RecoveryOutcome, sweep: &mut Sweep) {
        let instance = &self.cfg.instance;
        let outcome = match r {
            RecoveryOutcome::Retried {
                order_id,
                failure_count,
                next_attempt_at,
            } => {
                sweep.retried += 1;
                info!(order_id = %order_id, instance_id = %instance, failure_count, next_attempt_at = %next_attempt_at, "deadline passed: order back to Pending");
                "retried"
            }
            RecoveryOutcome::GaveUp {
                order_id,
                failure_count,
            } => {
                sweep.gave_up += 1;
                warn!(order_id = %order_id, instance_id = %instance, failure_count, "deadline passed too often: order in Error");
                "gave_up"
            }
            RecoveryOutcome::Waiting { order_id, service } => {
                sweep.waiting += 1;
                info!(order_id = %order_id, instance_id = %instance, service = %service, "deadline passed while its service is down: waits for it again, not counted");
                "waiting"
            }
            RecoveryOutcome::Undoing {
                order_id,
                failure_count,
            } => {
                sweep.gave_up += 1;
                warn!(order_id = %order_id, instance_id = %instance, failure_count, "deadline passed too often: undoing its completed steps, then Error");
                "gave_up_undoing"
            }
        };
        metrics::counter!("orderly_recoveries_total", "outcome" => outcome).increment(1);
        if let RecoveryOutcome::Retried { failure_count, .. }
        | RecoveryOutcome::GaveUp { failure_count, .. }
        | RecoveryOutcome::Undoing { failure_count, .. } = r
        {
            metrics::histogram!("orderly_recovered_failures").record(f64::from(*failure_count));
        }
    }

    /// Sweeps every `interval` until the term is cancelled or the store says another
    /// leader took over; a failed sweep is tried again at the next interval.
    async fn sweep_loop(
        &self,
        fence: &LeaderFence,
        cancelled: &CancellationToken,
        heartbeat: &Heartbeat,
    ) -> LeaderExit {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let alive = || heartbeat.beat();
        loop {
            tokio::select! {
                biased;
                () = cancelled.cancelled() => return LeaderExit::Cancelled,
                _ = tick.tick() => {}
            }
            alive();
            let sweep = tokio::select! {
                biased;
                () = cancelled.cancelled() => return LeaderExit::Cancelled,
                sweep = self.sweep(fence, &alive) => sweep,
            };
            match sweep {
                Ok(_) => {}
                Err(e @ orderly_core::Error::Deposed { .. }) => {
                    warn!(error = %e, "the store refused this term's write: another leader took over");
                    return LeaderExit::Deposed;
                }
                Err(e) => warn!(error = %e, "sweep failed; retrying at the next interval"),
            }
        }
    }

    /// Prunes by the retention policy every `prune_every`; never ends (nor starts
    /// without a policy).
    async fn prune_loop(&self) -> LeaderExit {
        let Some(retention) = &self.cfg.retention else {
            return std::future::pending().await;
        };
        let mut every = tokio::time::interval(self.cfg.prune_every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.prune(retention).await;
        }
    }

    /// Vacuums the hot tables every `tidy_every`, or less often while nothing is
    /// written ([`next_tidy`]); never ends (nor starts unless set).
    async fn tidy_loop(&self) -> LeaderExit {
        let Some(period) = self.cfg.tidy_every else {
            return std::future::pending().await;
        };
        let (mut wait, mut before) = (period, None);
        loop {
            let dead_rows = self.tidy().await;
            wait = next_tidy(period, wait, before, dead_rows);
            before = dead_rows;
            tokio::time::sleep(wait).await;
        }
    }

    /// Checks the conditions the leader alerts on every `conditions_every`; never ends.
    async fn condition_loop(&self) -> LeaderExit {
        let mut watch = conditions::Watch::default();
        let mut every = tokio::time::interval(self.cfg.conditions_every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if let Err(e) = self.check_conditions(&mut watch).await {
                warn!(error = %e, "cannot check the conditions alerted on; trying again");
            }
        }
    }

    /// Tallies the orders finished since the last tally every `tally_every` (the
    /// leader's housekeeping); never ends. A failure is logged and tried again at the
    /// next turn: until then the counts by state stay exact, only read more rows.
    async fn tally_loop(&self) -> LeaderExit {
        let mut every = tokio::time::interval(self.cfg.tally_every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match self.store.tally_finished().await {
                Ok(t) if t.transactions > 0 => {
                    debug!(upto = %t.upto, orders = t.orders, transactions = t.transactions, "tallied the finished orders");
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e, "cannot tally the finished orders; trying again at the next turn")
                }
            }
        }
    }

    /// Removes what `retention` lets go (the leader's housekeeping); a failure is
    /// logged and tried again at the next prune.
    async fn prune(&self, retention: &Retention) {
        match self.store.prune(retention, false).await {
            Ok(p) if p.is_empty() => {}
            Ok(p) => {
                for (what, n) in [
                    ("orders", p.orders),
                    ("steps", p.steps),
                    ("history", p.history),
                    ("alerts", p.alerts),
                    ("dead_letters", p.dead_letters),
                    ("outbox", p.outbox),
                    ("dedup", p.dedup),
                ] {
                    metrics::counter!("orderly_pruned_total", "what" => what).increment(n);
                }
                info!(
                    orders = p.orders,
                    steps = p.steps,
                    history = p.history,
                    alerts = p.alerts,
                    dead_letters = p.dead_letters,
                    outbox = p.outbox,
                    dedup = p.dedup,
                    keep_secs = retention.keep.as_secs(),
                    "pruned what the retention policy lets go"
                );
            }
            Err(e) => warn!(error = %e, "prune failed; trying again at the next prune"),
        }
    }

    /// Vacuums the hot tables that need it (the leader's housekeeping); a failure is
    /// logged and tried again at the next turn. Returns the row versions left behind
    /// that the store counted, if it did.
    async fn tidy(&self) -> Option<u64> {
        match self.store.tidy().await {
            Ok(tidied) => {
                for v in tidied.vacuumed {
                    metrics::counter!("orderly_vacuums_total", "table" => v.table.clone())
                        .increment(1);
                    debug!(table = %v.table, dead_rows = v.dead_rows, "vacuumed");
                }
                tidied.dead_rows
            }
            Err(e) => {
                warn!(error = %e, "vacuum failed; trying again at the next turn");
                None
            }
        }
    }

    /// Sweeps whenever `elector` makes this instance the leader, until `shutdown`.
    pub async fn run(self, elector: Arc<Elector>, shutdown: CancellationToken) {
        let instance = self.cfg.instance.clone();
        let presence = {
            let me = self.clone();
            let (status, lease) = (elector.status(), elector.timing().lease);
            let shutdown = shutdown.clone();
            tokio::spawn(async move { me.presence(status, lease, shutdown).await })
        };
        elector
            .run(move |leadership| self.clone().lead(leadership), shutdown)
            .await;
        let _ = presence.await;
        info!(instance_id = %instance, "supervisor stopped");
    }
}

#[cfg(test)]
mod tidy_tests {
    use super::*;

    #[test]
    fn the_look_at_left_behind_rows_thins_out_while_nothing_is_written() {
        let p = Duration::from_secs(1);
        // Writes go on: every period.
        assert_eq!(next_tidy(p, p, Some(10), Some(40)), p);
        // None counted (SQLite), or the first look: every period.
        assert_eq!(next_tidy(p, p, None, None), p);
        assert_eq!(next_tidy(p, p, None, Some(40)), p);
        // Unchanged: twice the last wait, up to 8 periods.
        let mut wait = p;
        let mut waits = Vec::new();
        for _ in 0..6 {
            wait = next_tidy(p, wait, Some(40), Some(40));
            waits.push(wait.as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 8, 8, 8]);
        // Written again: back to every period at once.
        assert_eq!(next_tidy(p, wait, Some(40), Some(41)), p);
    }
}
