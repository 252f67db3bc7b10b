//! The scheduler role: claims due orders, drives each through its declared workflow
//! by sending step requests to agents, applies their replies under the fence they
//! carry, compensates completed steps when an order cannot finish, and completes it.
//!
//! Nothing here lives only in memory: an order's progress is its state row and step
//! records, and every step request and reply is a durable message, so a scheduler can
//! die at any point and another (or the supervisor) carries on. Replies go to one
//! shared queue and any scheduler instance may apply one: the write is fenced by the
//! (order, owner, epoch) the request carried, so a reply for a deposed owner is refused
//! by the store, not merely unlikely to be applied.
//!
//! The library depends on `orderly-core` ports only (no database or queue client): the
//! claim path is in `claims`, the reply path in `replies`. The binary (`src/main.rs`)
//! wires it to a store and transport through `orderly-runtime`.

use std::sync::Arc;

use orderly_core::signing::MessageKey;
use std::time::Duration;

use orderly_core::service::{Park, ServiceView};
use orderly_core::store::{Completion, SchedulerStore, StepWrite};
use orderly_core::transport::{QueueName, Transport};
use orderly_core::workflow::{Workflow, WorkflowFilter, WorkflowRef, Workflows};
use orderly_core::{Clock, Fence, InstanceId, ProcessState};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

mod backoff;
mod claims;
mod holding;
mod moves;
mod plan;
mod replies;
mod undoing;
mod waiting;

pub use backoff::Backoff;

/// How a scheduler works.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// This instance; becomes `locked_by` of the orders it claims.
    pub instance: InstanceId,
    /// The workflows it runs: new orders start on the current version of the one they
    /// name (or the default); started orders carry on with the version they are
    /// pinned to, if it is loaded here (otherwise it leaves them to a scheduler that
    /// has it).
    pub workflows: Arc<Workflows>,
    /// Where agents reply.
    pub replies: QueueName,
    /// Most orders claimed at once.
    pub claim_batch: u32,
    /// Most replies applied at once.
    pub reply_batch: u32,
    /// An order's deadline after its claim (CompleteBy = claim time + this).
    pub processing_timeout: Duration,
    /// How long an idle loop waits before looking again (replies; claims while it
    /// holds its maximum).
    pub idle_wait: Duration,
    /// With nothing to claim, the longest it waits before looking again: submitted,
    /// released and recovered orders wake it at once (across processes too on
    /// PostgreSQL); this fallback finds orders whose retry back-off ended. While other
    /// processes' writes are heard, the store times the wait by the next order due
    /// instead (at most 5 s), and this bounds it only while an order is due that the
    /// claim did not take.
    pub claim_poll: Duration,
    /// Most orders this instance holds at once; it claims no more until some finish.
    pub max_in_flight: u32,
    /// On shutdown: how long to keep applying replies to the orders it holds (claiming
    /// nothing new) before handing the rest back.
    pub shutdown_grace: Duration,
    /// How often it looks for Pending orders of workflows it does not run, to say so.
    pub unserved_check: Duration,
    /// How often it reads the fleet's view of the remote services again (and lets a
    /// due probe through).
    pub service_watch: Duration,
}

impl SchedulerConfig {
    /// A configuration for `workflows` with the defaults: claims and replies in
    /// batches of 256, a processing timeout of the longest total budget of its
    /// workflows, 50 ms idle wait, a 250 ms fallback poll for claims.
    pub fn new(instance: InstanceId, workflows: Arc<Workflows>) -> Self {
        Self {
            instance,
            processing_timeout: workflows.total_budget(),
            workflows,
            replies: QueueName::parse(orderly_core::messages::queues::REPLIES)
                .unwrap_or_else(|_| unreachable!("literal queue name")),
            claim_batch: 256,
            reply_batch: 256,
            idle_wait: Duration::from_millis(50),
            claim_poll: Duration::from_millis(250),
            max_in_flight: 1_000,
            shutdown_grace: Duration::from_secs(10),
            unserved_check: Duration::from_secs(30),
            service_watch: Duration::from_millis(500),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Orders claimed (or resumed).
    pub claimed: usize,
    /// Step and compensation requests sent.
    pub requests: usize,
    /// Replies applied.
    pub applied: usize,
    /// Replies dropped: stale fence, stale step, deadline passed, repeated.
    pub dropped: usize,
    /// Replies dead-lettered: undecodable, for a step the workflow does not have, or
    /// whose write the store cannot use (unreadable data, invalid, unsendable).
    pub rejected: usize,
    /// Orders now Processed.
    pub completed: usize,
    /// Orders now Error.
    pub failed: usize,
    /// Orders now Cancelled.
    pub cancelled: usize,
    /// Replies given back, or orders handed back, because their workflow version is
    /// not loaded here.
    pub foreign: usize,
    /// Replies left for redelivery because the store was unavailable.
    pub retried: usize,
    /// Orders parked to wait for a service that is down (not counted as failures).
    pub parked: usize,
}

impl Pass {
    pub(crate) fn add(&mut self, o: Pass) {
        self.claimed += o.claimed;
        self.requests += o.requests;
        self.applied += o.applied;
        self.dropped += o.dropped;
        self.rejected += o.rejected;
        self.completed += o.completed;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.foreign += o.foreign;
        self.retried += o.retried;
        self.parked += o.parked;
    }

    /// Whether the pass found any work.
    pub fn is_idle(&self) -> bool {
        *self == Pass::default()
    }
}

/// A scheduler instance.
#[derive(Clone)]
pub struct Scheduler {
    store: Arc<dyn SchedulerStore>,
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
    cfg: SchedulerConfig,
    /// The versions it runs: `cfg.workflows`, plus every version stored in the store
    /// (read at start and every `unserved_check`), with their claim filter.
    catalogue: Arc<std::sync::RwLock<Catalogue>>,
    /// The fleet's view of the remote services (`None`: every service taken as up).
    services: Option<Arc<ServiceView>>,
    /// An upper bound on the orders it holds, so a claim pass seldom counts them.
    holding: Arc<holding::Holding>,
    /// Signs its step requests and checks the agents' replies (`None`: neither, in
    /// tests of the scheduler alone).
    key: Option<Arc<MessageKey>>,
}

/// The workflow versions a scheduler runs and the claim filter they give.
struct Catalogue {
    workflows: Arc<Workflows>,
    filter: Arc<WorkflowFilter>,
}

impl Catalogue {
    fn of(workflows: Workflows) -> Self {
        Self {
            filter: Arc::new(workflows.filter()),
            workflows: Arc::new(workflows),
        }
    }
}

/// What to do next with an order the scheduler holds.
pub(crate) enum Next {
    /// Send this write (a step or compensation request).
    Write(StepWrite),
    /// Every step done: complete it.
    Complete(Completion),
    /// End it in Error with this error (undoing refused, or not asked for).
    Fail(Fence, String),
    /// Undoing finished: end it in Error with this error, or start the fresh run of
    /// an operator's retry that waited for the undoing.
    Undone(Fence, String),
    /// Undoing finished: end it Cancelled (and tell the client's queue, if any).
    Cancel(Fence, Option<String>),
    /// Record the last compensation, then finish as the order is marked to (the
    /// client's queue, if any, is told of a cancellation).
    Finish(StepWrite, Option<ProcessState>, Option<String>),
    /// Its next request is for a service that is down: park it until it is back.
    Park(Park),
}

impl Scheduler {
    /// A scheduler over `store` and `transport`; `clock` decides when a deadline has
    /// passed on this side (the store decides for itself).
    pub fn new(
        store: Arc<dyn SchedulerStore>,
        transport: Arc<dyn Transport>,
        clock: Arc<dyn Clock>,
        cfg: SchedulerConfig,
    ) -> Self {
        let catalogue = Arc::new(std::sync::RwLock::new(Catalogue::of(
            (*cfg.workflows).clone(),
        )));
        Self {
            store,
            transport,
            clock,
            cfg,
            catalogue,
            services: None,
            holding: Arc::default(),
            key: None,
        }
    }

    /// The scheduler as its binary runs it, on one state store: [`Self::new`] over
    /// `store`, consulting the fleet's view of the services in it
    /// ([`Self::with_services`]), signing with the deployment's message `key`
    /// ([`Self::with_key`]). The local runner starts it the same way.
    pub fn wired(
        store: Arc<dyn orderly_core::store::StateStore>,
        transport: Arc<dyn Transport>,
        clock: Arc<dyn Clock>,
        cfg: SchedulerConfig,
        key: MessageKey,
    ) -> Self {
        let services = Arc::new(ServiceView::new(store.clone()));
        Self::new(store, transport, clock, cfg)
            .with_services(services)
            .with_key(key)
    }

    /// Signs every step request with `key` and acts only on replies signed with it
    /// (others are dead-lettered with the reason), so whoever may only send to the
    /// replies queue cannot record a step or choose an order's notices and details.
    #[must_use]
    pub fn with_key(mut self, key: MessageKey) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// Consults `view` before each request: a request for a service the fleet sees
    /// down is not sent, and its order is parked until the service is back.
    #[must_use]
    pub fn with_services(mut self, view: Arc<ServiceView>) -> Self {
        self.services = Some(view);
        self
    }

    /// The versions it runs now.
    pub fn workflows(&self) -> Arc<Workflows> {
        self.catalogue
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .workflows
            .clone()
    }

    /// The claim filter of [`Self::workflows`].
    pub(crate) fn filter(&self) -> Arc<WorkflowFilter> {
        self.catalogue
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .filter
            .clone()
    }

    /// The workflow an order pinned to `reference` runs here, if this scheduler has it.
    pub(crate) fn flow(&self, reference: Option<&WorkflowRef>) -> Option<Arc<Workflow>> {
        self.workflows().get(reference).cloned()
    }

    /// Stores the definitions of the versions it was given, then takes on the stored
    /// ones ([`Self::adopt_stored_workflows`]): what it does once, when it starts.
    pub async fn store_and_adopt_workflows(&self) -> orderly_core::Result<Vec<WorkflowRef>> {
        self.store
            .record_workflows(
                &self.cfg.workflows.definitions(),
                self.cfg.instance.as_str(),
            )
            .await?;
        self.adopt_stored_workflows().await
    }

    /// Takes on every stored version it does not have: any scheduler runs an order
    /// pinned to any stored version. Returns the versions it took on. A stored
    /// definition that does not check (invalid, or not of its version) is left out and
    /// logged; orders pinned to it wait, and the leading supervisor raises an alert.
    pub async fn adopt_stored_workflows(&self) -> orderly_core::Result<Vec<WorkflowRef>> {
        let mut parsed = Vec::new();
        for stored in self.store.stored_workflows().await? {
            match stored.workflow() {
                Ok(w) => parsed.push(w),
                Err(e) => {
                    warn!(workflow = %stored.reference, error = %e, "a stored workflow version does not check; its orders cannot run");
                }
            }
        }
        let before = self.workflows();
        let next = self.cfg.workflows.with_stored(parsed);
        let added: Vec<WorkflowRef> = next
            .references()
            .filter(|r| before.get(Some(r)).is_none())
            .cloned()
            .collect();
        if !added.is_empty() {
            let names: Vec<String> = added.iter().map(ToString::to_string).collect();
            info!(workflows = %names.join(", "), instance_id = %self.cfg.instance, "runs stored workflow versions it has no file for");
            *self
                .catalogue
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Catalogue::of(next);
        }
        Ok(added)
    }

    /// Why it leaves an order of `reference` alone.
    pub(crate) fn not_here(&self, reference: Option<&WorkflowRef>) -> String {
        let loaded: Vec<String> = self
            .workflows()
            .references()
            .map(ToString::to_string)
            .collect();
        format!(
            "workflow {} is neither stored nor loaded by scheduler {} (it runs {}); \
             `orderly migrate --workflow FILE` with that version's file stores it",
            reference.map_or_else(|| "(default)".to_owned(), ToString::to_string),
            self.cfg.instance,
            loaded.join(", ")
        )
    }

    /// This instance's id.
    pub fn instance(&self) -> &InstanceId {
        &self.cfg.instance
    }

    /// One pass of both halves: claim, then apply the replies waiting now.
    pub async fn run_once(&self) -> orderly_core::Result<Pass> {
        let mut pass = self.claim_once().await?;
        pass.add(self.replies_once(Duration::ZERO).await?);
        Ok(pass)
    }

    /// Runs until `shutdown`: stores its workflow versions and resumes its own orders,
    /// then claims, applies replies and watches the services' health in loops of
    /// their own. Store or queue outages are logged and retried with back-off. After
    /// the shutdown signal replies go on for the orders it holds, until none is left
    /// or the grace period ends; then the rest are handed back.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = info_span!("scheduler", instance_id = %self.cfg.instance);
        async move {
            let loaded: Vec<String> = self
                .cfg
                .workflows
                .references()
                .map(ToString::to_string)
                .collect();
            info!(workflows = %loaded.join(", "), default = %self.cfg.workflows.default_workflow().name, "scheduler started");
            if !self.start_up(&shutdown).await {
                return;
            }
            let drained = CancellationToken::new();
            tokio::join!(
                self.clone().claim_loop(shutdown.clone()),
                self.clone().reply_loop(drained.clone()),
                self.clone().drain(shutdown.clone(), drained),
                self.clone().watch_loop(shutdown.clone()),
            );
            self.hand_back().await;
            info!("scheduler stopped");
        }
        .instrument(span)
        .await;
    }

    /// Stores and adopts the workflow versions, then resumes the orders it holds,
    /// each retried with back-off until it works. False: shut down first.
    async fn start_up(&self, shutdown: &CancellationToken) -> bool {
        let mut backoff = Backoff::new();
        while let Err(e) = self.store_and_adopt_workflows().await {
            warn!(error = %e, "could not store or read workflow versions; retrying");
            if backoff.sleep(shutdown).await {
                return false;
            }
        }
        let mut backoff = Backoff::new();
        while let Err(e) = self.resume().await {
            warn!(error = %e, "could not resume held orders; retrying");
            if backoff.sleep(shutdown).await {
                return false;
            }
        }
        true
    }

    /// Claims until `shutdown`, waiting for claimable orders between passes, and every
    /// `unserved_check` adopts the versions other schedulers stored and reports the
    /// orders no scheduler runs.
    async fn claim_loop(self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new();
        let mut seen = 0;
        let mut next_check = tokio::time::Instant::now() + self.cfg.unserved_check;
        while !shutdown.is_cancelled() {
            if tokio::time::Instant::now() >= next_check {
                next_check = tokio::time::Instant::now() + self.cfg.unserved_check;
                // Versions other schedulers stored since: run them too.
                if let Err(e) = self.adopt_stored_workflows().await {
                    debug!(error = %e, "cannot read the stored workflow versions");
                }
                if let Err(e) = self.report_unserved().await {
                    debug!(error = %e, "cannot count orders by workflow");
                }
            }
            match self.claim_pass().await {
                Ok((_, claims::ClaimEnd::Batch)) => backoff.reset(),
                Ok((_, end)) => {
                    backoff.reset();
                    // Orders made claimable since the last wait (`seen`), during the
                    // claim too, end the wait at once.
                    let wait = async {
                        if end == claims::ClaimEnd::Full {
                            tokio::time::sleep(self.cfg.idle_wait).await;
                        } else {
                            self.store
                                .wait_claimable(&mut seen, self.cfg.claim_poll)
                                .await;
                        }
                    };
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = wait => {}
                    }
                }
                Err(e) => {
                    warn!(error = %e, "claim failed; retrying with back-off");
                    backoff.sleep(&shutdown).await;
                }
            }
        }
    }

    /// Applies replies until `drained`.
    async fn reply_loop(self, drained: CancellationToken) {
        let mut backoff = Backoff::new();
        while !drained.is_cancelled() {
            let once = tokio::select! {
                () = drained.cancelled() => break,
                r = self.replies_once(self.cfg.idle_wait) => r,
            };
            match once {
                Ok(_) => backoff.reset(),
                Err(e) => {
                    warn!(error = %e, "applying replies failed; retrying with back-off");
                    backoff.sleep(&drained).await;
                }
            }
        }
    }

    /// After `shutdown`, waits until it holds no order or the grace period ends, then
    /// ends the reply loop (`drained`).
    async fn drain(self, shutdown: CancellationToken, drained: CancellationToken) {
        shutdown.cancelled().await;
        let until = tokio::time::Instant::now() + self.cfg.shutdown_grace;
        while tokio::time::Instant::now() < until {
            match self.store.count_owned(&self.cfg.instance).await {
                Ok(0) => break,
                Ok(n) => debug!(held = n, "draining before stopping"),
                Err(e) => debug!(error = %e, "cannot count held orders while draining"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drained.cancel();
    }

    /// Reads the fleet's view of the services, and lets the probes go that are due,
    /// until `shutdown`: again when the services are written, when the next probe
    /// comes due, or after the view's safety poll (`ServiceView::wait_for_news`), at
    /// most every `service_watch`; every `service_watch` where the store does not hear
    /// the writes.
    async fn watch_loop(self, shutdown: CancellationToken) {
        let Some(view) = self.services.clone() else {
            return;
        };
        let poll = self.cfg.service_watch;
        let mut seen = 0;
        loop {
            let read_at = tokio::time::Instant::now();
            let next = match self.watch_services().await {
                Ok(()) => Some(self.clock.now()),
                Err(e) => {
                    debug!(error = %e, "cannot read the services' health; trying again");
                    None
                }
            };
            let news = async {
                if let Some(now) = next {
                    view.wait_for_news(&mut seen, poll, now).await;
                }
                tokio::time::sleep_until(read_at + poll).await;
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = news => {}
            }
        }
    }

    /// Releases every order it still holds (back to Pending, no failure counted) so
    /// another scheduler takes them at once instead of after their deadline. A request
    /// of theirs still out will get a fenced-out reply; the new owner re-sends the step
    /// under the same idempotency key.
    pub(crate) async fn hand_back(&self) {
        let fences = match self.store.owned(&self.cfg.instance).await {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, "cannot list held orders at shutdown: the supervisor will recover them after their deadline");
                return;
            }
        };
        let mut released = 0;
        for fence in &fences {
            match self
                .store
                .release(fence, "scheduler shutting down: handed back")
                .await
            {
                Ok(()) => released += 1,
                Err(e) => {
                    debug!(order_id = %fence.order_id, error = %e, "not released (it moved on)")
                }
            }
        }
        if !fences.is_empty() {
            info!(
                held = fences.len(),
                released, "orders handed back at shutdown"
            );
        }
    }
}
