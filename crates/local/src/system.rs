//! The whole system in one process: the remote-service simulator and any number of
//! submitters, schedulers, agents and supervisors over one backend. What `orderly up`
//! and `orderly demo` run, and what the end-to-end tests drive.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use orderly_agent::{Agent, AgentConfig, BreakerConfig, Endpoints, FleetConfig, HttpRemote};
use orderly_core::messages::queues;
use orderly_core::service::OutagePolicy;
use orderly_core::store::RecoveryPolicy;
use orderly_core::transport::{QueueName, QueueSettings};
use orderly_core::workflow::Workflow;
use orderly_core::{Clock, InstanceId};
use orderly_remote_sim::{Sim, SimConfig};
use orderly_scheduler::{Scheduler, SchedulerConfig};
use orderly_sql::Backend;
use orderly_submitter::{Submitter, SubmitterConfig};
use orderly_supervisor::{Supervisor, SupervisorConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What to run.
#[derive(Debug, Clone)]
pub struct SystemConfig {
    /// Submitter instances.
    pub submitters: usize,
    /// Scheduler instances.
    pub schedulers: usize,
    /// Agent instances (each consumes every agent queue of the workflow).
    pub agents: usize,
    /// Supervisor instances.
    pub supervisors: usize,
    /// The workflow (the default of orders that name none).
    pub workflow: Workflow,
    /// Other workflows the schedulers run, for orders that name them.
    pub more_workflows: Vec<Workflow>,
    /// An order's deadline after its claim.
    pub processing_timeout: Duration,
    /// Time between supervisor sweeps.
    pub sweep_interval: Duration,
    /// Retry or give up after a timeout.
    pub policy: RecoveryPolicy,
    /// The simulator's latency and faults; `None` to use `remote_url` instead.
    pub sim: Option<SimConfig>,
    /// The remote services' base URL when no simulator runs here.
    pub remote_url: Option<String>,
    /// Lock duration of the agent queues (a request whose agent died comes back after it).
    pub request_lock: Duration,
    /// Most orders one scheduler holds at once.
    pub max_in_flight: u32,
    /// The supervisors' election over the SQL lease row.
    pub elector: orderly_core::leader::ElectorTiming,
    /// Services down pause only the orders that need them (shared through the store):
    /// how such an outage is handled, `None` to leave each agent's breaker its own.
    pub outages: Option<OutagePolicy>,
    /// Transient failures in a row that open an agent's breaker for a service.
    pub breaker_threshold: u32,
}

impl SystemConfig {
    /// Two of each worker role, one submitter, the default workflow, and a simulator
    /// answering at once without faults.
    pub fn new() -> Self {
        let workflow = Workflow::default();
        Self {
            submitters: 1,
            schedulers: 2,
            agents: 2,
            supervisors: 2,
            processing_timeout: workflow.total_budget(),
            workflow,
            more_workflows: Vec::new(),
            sweep_interval: Duration::from_secs(1),
            policy: RecoveryPolicy::default(),
            sim: Some(SimConfig::default()),
            remote_url: None,
            request_lock: Duration::from_secs(30),
            max_in_flight: 1_000,
            elector: orderly_core::leader::ElectorTiming::default(),
            outages: Some(OutagePolicy::default()),
            breaker_threshold: 20,
        }
    }

    /// Short deadlines and back-offs so that faults resolve in seconds: steps of
    /// 1 s, orders of 3 s, sweeps every 250 ms, back-off from 250 ms.
    pub fn quick(mut self) -> Self {
        for s in &mut self.workflow.steps {
            s.timeout_ms = 1_000;
            s.retry.initial_backoff_ms = 10;
            s.retry.max_backoff_ms = 200;
        }
        self.processing_timeout = Duration::from_secs(3);
        self.sweep_interval = Duration::from_millis(250);
        self.policy = RecoveryPolicy {
            max_failures: 5,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(2),
            ..RecoveryPolicy::default()
        };
        self.request_lock = Duration::from_secs(5);
        // What two schedulers hold must drain well within the 3 s deadline.
        self.max_in_flight = 150;
        self
    }
}

impl Default for SystemConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// A running system.
pub struct System {
    /// The backend everything shares.
    pub backend: Backend,
    /// The simulator, when one runs here.
    pub sim: Option<Sim>,
    /// Where the simulator listens.
    pub sim_addr: Option<SocketAddr>,
    /// The instances started, by role.
    pub instances: Vec<InstanceId>,
    /// The leadership status of each supervisor here.
    pub leaders: Vec<tokio::sync::watch::Receiver<orderly_core::leader::LeaderStatus>>,
    /// The workflow its schedulers run (the one its orders are pinned to).
    pub workflows: Arc<orderly_core::workflow::Workflows>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// Declares the queues the system uses (idempotent).
pub async fn declare_queues(
    backend: &Backend,
    workflow: &Workflow,
    request_lock: Duration,
) -> anyhow::Result<()> {
    let fixed = [queues::ORDERS, queues::REPLIES, queues::ALERTS];
    for q in fixed {
        let q = QueueName::parse(q)?;
        backend
            .transport
            .declare_queue(&q, &queues::settings(&q))
            .await
            .with_context(|| format!("cannot declare queue {q}"))?;
    }
    for q in workflow.queues() {
        let settings = QueueSettings {
            lock_duration: request_lock,
            ..queues::settings(&q)
        };
        backend
            .transport
            .declare_queue(&q, &settings)
            .await
            .with_context(|| format!("cannot declare queue {q}"))?;
    }
    Ok(())
}

impl System {
    /// Declares the queues and starts every instance.
    pub async fn start(backend: Backend, cfg: SystemConfig) -> anyhow::Result<Self> {
        cfg.workflow.validate().context("invalid workflow")?;
        declare_queues(&backend, &cfg.workflow, cfg.request_lock).await?;
        for w in &cfg.more_workflows {
            declare_queues(&backend, w, cfg.request_lock).await?;
        }
        let shutdown = CancellationToken::new();
        let mut tasks = Vec::new();
        let mut instances = Vec::new();
        let mut leaders = Vec::new();
        // Deadlines on the store's clock, as the role binaries read them.
        let clock: Arc<dyn Clock> =
            orderly_runtime::clock::on_store_time(backend.store.clone(), &shutdown).await;

        let (sim, sim_addr, remote_url) = match &cfg.sim {
            Some(sim_cfg) => {
                sim_cfg
                    .validate()
                    .map_err(|e| anyhow::anyhow!("invalid simulator setting: {e}"))?;
                let sim = Sim::new(sim_cfg.clone());
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let addr = listener.local_addr()?;
                tasks.push(tokio::spawn(sim.clone().serve(listener, shutdown.clone())));
                (Some(sim), Some(addr), format!("http://{addr}/actions"))
            }
            None => (
                None,
                None,
                cfg.remote_url
                    .clone()
                    .context("no simulator and no remote URL")?,
            ),
        };
        let workflows = Arc::new(
            orderly_core::workflow::Workflows::new(
                std::iter::once(cfg.workflow.clone())
                    .chain(cfg.more_workflows.iter().cloned())
                    .collect(),
            )
            .context("invalid workflow")?,
        );
        let mut agent_queues = cfg.workflow.queues();
        for q in cfg.more_workflows.iter().flat_map(Workflow::queues) {
            if !agent_queues.contains(&q) {
                agent_queues.push(q);
            }
        }

        for _ in 0..cfg.submitters {
            let s = Submitter::new(
                backend.store.clone(),
                backend.transport.clone(),
                SubmitterConfig::new(InstanceId::generate("submitter")),
            );
            tasks.push(tokio::spawn(s.run(shutdown.clone())));
        }
        // One deployment, one key: requests and replies are signed with it.
        let key = backend
            .store
            .message_key(
                orderly_core::signing::MessageKey::generate(),
                "orderly-local",
            )
            .await
            .context("cannot read (or create) the message key in the state store")?;
        for _ in 0..cfg.schedulers {
            let id = InstanceId::generate("scheduler");
            instances.push(id.clone());
            let mut sc = SchedulerConfig::new(id, workflows.clone());
            sc.processing_timeout = cfg.processing_timeout;
            sc.max_in_flight = cfg.max_in_flight;
            let s = Scheduler::wired(
                backend.store.clone(),
                backend.transport.clone(),
                clock.clone(),
                sc,
                key.clone(),
            );
            tasks.push(tokio::spawn(s.run(shutdown.clone())));
        }
        for _ in 0..cfg.agents {
            let id = InstanceId::generate("agent");
            instances.push(id.clone());
            let remote = HttpRemote::new(
                Endpoints {
                    base_url: remote_url.clone(),
                    overrides: Default::default(),
                },
                &orderly_tls::Trust::from_env()?,
            )?;
            let mut ac = AgentConfig::new(id, agent_queues.clone());
            ac.lock_renewal = cfg.request_lock / 3;
            ac.breaker = BreakerConfig {
                failure_threshold: cfg.breaker_threshold,
                open_for: Duration::from_millis(500),
            };
            let fleet = cfg.outages.as_ref().map(|policy| FleetConfig {
                policy: policy.clone(),
                ..FleetConfig::default()
            });
            let a = Agent::wired(
                backend.store.clone(),
                backend.transport.clone(),
                Arc::new(remote),
                clock.clone(),
                ac,
                fleet,
                key.clone(),
            );
            tasks.push(tokio::spawn(a.run(shutdown.clone())));
        }
        for _ in 0..cfg.supervisors {
            let id = InstanceId::generate("supervisor");
            instances.push(id.clone());
            let mut sc = SupervisorConfig::new(id.clone());
            sc.interval = cfg.sweep_interval;
            sc.policy = cfg.policy.clone();
            let elector = orderly_supervisor::sql_elector(
                backend.store.clone(),
                id.clone(),
                cfg.elector.clone(),
            )?;
            leaders.push(elector.status());
            let s = Supervisor::wired(backend.store.clone(), sc)?;
            tasks.push(tokio::spawn(s.run(Arc::new(elector), shutdown.clone())));
        }
        Ok(Self {
            backend,
            sim,
            sim_addr,
            instances,
            leaders,
            workflows,
            shutdown,
            tasks,
        })
    }

    /// A token that stops the system when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops every instance and waits for them (at most `grace`).
    pub async fn stop(self, grace: Duration) {
        self.shutdown.cancel();
        let all = futures_join(self.tasks);
        let _ = tokio::time::timeout(grace, all).await;
    }
}

async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}
