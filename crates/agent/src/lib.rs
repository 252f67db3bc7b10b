//! The agent role: consumes step requests, calls the remote service over HTTP with an
//! `Idempotency-Key` header, retries transient failures with exponential back-off and
//! full jitter inside the deadline, replies on success or permanent failure, and
//! stays silent once the deadline has passed. Each agent queue stands for one remote
//! service (inventory, payment, shipping, ...) and is isolated from the others: its own
//! concurrency limit, and its own circuit breaker, which, while open, stops the agent
//! taking that queue's requests (one in hand is given back at once), so a service that
//! is down holds neither permits nor message locks that the others need.
//!
//! The library depends on `orderly-core` ports and an HTTP client (no database); the
//! binary (`src/main.rs`) wires it through `orderly-runtime`.

mod breaker;
mod calls;
mod catalogue;
mod fleet;
mod remote;
mod settle;

use std::collections::HashMap;
use std::sync::Arc;

use orderly_core::signing::MessageKey;
use std::time::Duration;

use orderly_core::messages::{StepOutcome, StepRequest, json_message};
use orderly_core::transport::{QueueName, ReceivedMessage, Transport, receive_json, while_holding};
use orderly_core::{Clock, InstanceId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

pub use breaker::{Breaker, BreakerConfig};
pub use catalogue::Catalogue;
pub use fleet::FleetConfig;
pub use remote::{CallError, Endpoints, HttpRemote, ProbeAnswer, RemoteCall, RemoteService};
use settle::{Settle, settle_batches};

/// How an agent works.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This instance.
    pub instance: InstanceId,
    /// The agent queues it consumes.
    pub queues: Vec<QueueName>,
    /// Requests worked on at once, per queue (each queue, one remote service, has its
    /// own limit, so a slow service cannot take the others' room).
    pub concurrency: usize,
    /// Most requests received at once per queue.
    pub receive_batch: u32,
    /// How long an idle receive waits.
    pub idle_wait: Duration,
    /// A reply is sent only if it can be decided this long before the deadline, so it
    /// is on the queue before the deadline passes: the send and its commit must fit in
    /// it (100 ms; 20 ms was seen too short for a commit on a loaded PostgreSQL).
    pub reply_margin: Duration,
    /// Renew a request's lock this often while working on it.
    pub lock_renewal: Duration,
    /// Circuit breaker settings, one breaker per queue (remote service).
    pub breaker: BreakerConfig,
}

impl AgentConfig {
    /// Defaults: 256 requests at once per queue, batches of 256, 200 ms idle wait, 100 ms reply
    /// margin, lock renewal every 10 s.
    pub fn new(instance: InstanceId, queues: Vec<QueueName>) -> Self {
        Self {
            instance,
            queues,
            concurrency: 256,
            receive_batch: 256,
            idle_wait: Duration::from_millis(200),
            reply_margin: Duration::from_millis(100),
            lock_renewal: Duration::from_secs(10),
            breaker: BreakerConfig::default(),
        }
    }
}

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// A reply was sent (success or permanent failure).
    Replied(StepOutcome),
    /// The deadline passed (or the tries ran out) first: nothing was sent.
    Silent(String),
    /// The request is not one a scheduler sends (see `StepRequest::check`): it was
    /// dead-lettered with why, and the remote service was not called.
    Refused(String),
    /// The service is down (this agent's circuit is open, or the fleet sees it down):
    /// not called. With the fleet's view, a `Deferred` reply parks the order until the
    /// service is back; without it, the request is given back to its queue untried
    /// (taken again once a probe finds the service up, or by the supervisor's retry).
    Deferred(String),
}

/// An agent instance.
#[derive(Clone)]
pub struct Agent {
    transport: Arc<dyn Transport>,
    remote: Arc<dyn RemoteService>,
    clock: Arc<dyn Clock>,
    cfg: Arc<AgentConfig>,
    breakers: Arc<std::sync::Mutex<HashMap<String, Arc<Breaker>>>>,
    /// One limit per queue.
    permits: Arc<HashMap<QueueName, Arc<Semaphore>>>,
    settler: mpsc::UnboundedSender<Settle>,
    /// Its part in the fleet's view of the services (`None`: its breakers are its own).
    fleet: Option<Arc<fleet::Fleet>>,
    /// The stored workflow versions requests are checked against (`None`: not
    /// checked, in tests of the agent alone).
    catalogue: Option<Arc<Catalogue>>,
    /// Checks that requests are signed with the deployment's key, and signs the
    /// replies (`None`: neither, in tests of the agent alone).
    key: Option<Arc<MessageKey>>,
}

impl Agent {
    /// An agent calling `remote`; `clock` decides when a deadline has passed. Must be
    /// called within a Tokio runtime (it starts the task that settles requests).
    pub fn new(
        transport: Arc<dyn Transport>,
        remote: Arc<dyn RemoteService>,
        clock: Arc<dyn Clock>,
        cfg: AgentConfig,
    ) -> Self {
        let (settler, settles) = mpsc::unbounded_channel();
        let cfg = Arc::new(cfg);
        tokio::spawn(settle_batches(
            transport.clone(),
            clock.clone(),
            cfg.reply_margin,
            settles,
        ));
        let permits = cfg
            .queues
            .iter()
            .map(|q| (q.clone(), Arc::new(Semaphore::new(cfg.concurrency.max(1)))))
            .collect();
        Self {
            permits: Arc::new(permits),
            transport,
            remote,
            clock,
            cfg,
            breakers: Arc::default(),
            settler,
            fleet: None,
            catalogue: None,
            key: None,
        }
    }

    /// Acts only on requests signed with `key` (others are dead-lettered with the
    /// reason and no service is called) and signs its replies with it, so whoever may
    /// only send to an agent's queue cannot have a service called, and a reply's
    /// context is the one the scheduler sent.
    #[must_use]
    pub fn with_key(mut self, key: MessageKey) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// Acts only on requests that are what their stored workflow version says a
    /// scheduler sends ([`StepRequest::matches`]): others are dead-lettered with the
    /// reason, so a message cannot choose what the agent fetches or calls.
    #[must_use]
    pub fn with_catalogue(mut self, catalogue: Arc<Catalogue>) -> Self {
        self.catalogue = Some(catalogue);
        self
    }

    /// Why `req`, received on `queue`, is not what its workflow says (`Ok(None)`: it
    /// is); a store error is returned as such.
    async fn untrusted(
        &self,
        req: &StepRequest,
        queue: &QueueName,
    ) -> orderly_core::Result<Option<String>> {
        let Some(catalogue) = &self.catalogue else {
            return Ok(None);
        };
        Ok(match catalogue.get(req.context.workflow.as_ref()).await? {
            catalogue::Found::Known(flow) => req.matches(&flow, queue.as_str()).err(),
            catalogue::Found::Unknown => Some(format!(
                "workflow {} is not stored: no scheduler runs it",
                req.context
                    .workflow
                    .as_ref()
                    .map_or_else(|| "(none)".to_owned(), ToString::to_string)
            )),
        })
    }

    /// Shares what it sees of its services with the fleet through `view`'s store: an
    /// opened breaker reports the service down (schedulers then park the orders that
    /// need it), requests for a service the fleet sees down are answered at once with
    /// a `Deferred` reply, and an answer from a service seen down reports it up.
    #[must_use]
    pub fn with_services(
        mut self,
        view: Arc<orderly_core::service::ServiceView>,
        cfg: FleetConfig,
    ) -> Self {
        self.fleet = Some(Arc::new(fleet::Fleet::new(
            view,
            cfg,
            self.cfg.instance.clone(),
        )));
        self
    }

    /// The agent as its binary runs it, on one state store: [`Self::new`], checking
    /// requests against the workflow versions the schedulers stored in `store`
    /// ([`Self::with_catalogue`]) and their signatures with the deployment's message
    /// `key` ([`Self::with_key`]) and, given `fleet` (back-pressure on), sharing what
    /// it learns of the services' outages through it ([`Self::with_services`]). The
    /// local runner starts it the same way.
    pub fn wired(
        store: Arc<dyn orderly_core::store::StateStore>,
        transport: Arc<dyn Transport>,
        remote: Arc<dyn RemoteService>,
        clock: Arc<dyn Clock>,
        cfg: AgentConfig,
        fleet: Option<FleetConfig>,
        key: MessageKey,
    ) -> Self {
        let versions: Arc<dyn orderly_core::store::SchedulerStore> = store.clone();
        let agent = Self::new(transport, remote, clock, cfg)
            .with_catalogue(Arc::new(Catalogue::new(versions)))
            .with_key(key);
        match fleet {
            Some(fleet) => agent.with_services(
                Arc::new(orderly_core::service::ServiceView::new(store)),
                fleet,
            ),
            None => agent,
        }
    }

    /// The fleet's view, if `queue`'s service takes part in it.
    fn fleet_for(&self, queue: &QueueName) -> Option<&Arc<fleet::Fleet>> {
        self.fleet.as_ref().filter(|f| f.covers(queue))
    }

    fn breaker(&self, service: &str) -> Arc<Breaker> {
        let mut map = self
            .breakers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.entry(service.to_owned())
            .or_insert_with(|| Arc::new(Breaker::new(self.cfg.breaker.clone())))
            .clone()
    }

    /// Receives one batch from `queue` and handles every request in it to the end,
    /// returning what became of each.
    pub async fn run_once(
        &self,
        queue: &QueueName,
        wait: Duration,
    ) -> orderly_core::Result<Vec<Handled>> {
        let batch = self.receive(queue, self.cfg.receive_batch, wait).await?;
        let mut handled = Vec::with_capacity(batch.len());
        let tasks: Vec<_> = batch
            .into_iter()
            .map(|(req, msg)| {
                let me = self.clone();
                tokio::spawn(async move { me.handle(req, msg).await })
            })
            .collect();
        for t in tasks {
            if let Ok(h) = t.await {
                handled.push(h);
            }
        }
        Ok(handled)
    }

    async fn receive(
        &self,
        queue: &QueueName,
        max: u32,
        wait: Duration,
    ) -> orderly_core::Result<Vec<(StepRequest, ReceivedMessage)>> {
        let (batch, poison) = receive_json::<StepRequest>(
            self.transport.as_ref(),
            queue,
            max,
            wait,
            orderly_core::transport::MAX_BODY_BYTES,
        )
        .await
        .map_err(|e| orderly_core::Error::Queue(Box::new(e)))?;
        for p in &poison {
            warn!(queue = %queue, message_id = %p.message_id, reason = p.reason, problem = %p.description, "step request dead-lettered");
        }
        Ok(batch)
    }

    /// Runs until `shutdown`: one receive loop per queue, at most `concurrency`
    /// requests in work at once. Requests in work at shutdown are given back.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = info_span!("agent", instance_id = %self.cfg.instance);
        async move {
            info!(queues = ?self.cfg.queues.iter().map(QueueName::as_str).collect::<Vec<_>>(), fleet = self.fleet.is_some(), "agent started");
            if let Some(fleet) = self.fleet.clone() {
                let shutdown = shutdown.clone();
                let clock = self.clock.clone();
                tokio::spawn(async move {
                    // Read again when the services are written, when a probe comes due
                    // or after the view's safety poll, at most every `refresh`; every
                    // `refresh` where the store does not hear the writes.
                    let poll = fleet.cfg.refresh;
                    let mut seen = 0;
                    loop {
                        let read_at = tokio::time::Instant::now();
                        let read = fleet.view.refresh().await;
                        if let Err(e) = &read {
                            debug!(error = %e, "cannot read the fleet's view of the services");
                        }
                        let news = async {
                            if read.is_ok() {
                                fleet.view.wait_for_news(&mut seen, poll, clock.now()).await;
                            }
                            tokio::time::sleep_until(read_at + poll).await;
                        };
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = news => {}
                        }
                    }
                });
            }
            let loops: Vec<_> = self
                .cfg
                .queues
                .clone()
                .into_iter()
                .map(|queue| {
                    let me = self.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move { me.consume(queue, shutdown).await })
                })
                .collect();
            for l in loops {
                let _ = l.await;
            }
            // Wait for the requests in work to end (they stop at shutdown too).
            for permits in self.permits.values() {
                let _ = permits
                    .acquire_many(u32::try_from(self.cfg.concurrency.max(1)).unwrap_or(u32::MAX))
                    .await;
            }
            info!("agent stopped");
        }
        .instrument(span)
        .await;
    }

    async fn consume(&self, queue: QueueName, shutdown: CancellationToken) {
        let Some(permits) = self.permits.get(&queue).cloned() else {
            return;
        };
        let breaker = self.breaker(queue.as_str());
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            if let Some(wait) = self.held_back(&queue, &breaker) {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(wait) => continue,
                }
            }
            // Take only as many requests as there is room to work on: one waiting for a
            // permit would hold its lock without renewing it.
            let first = tokio::select! {
                () = shutdown.cancelled() => break,
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let room = (permits.available_permits() + 1).min(self.cfg.receive_batch as usize);
            let received = tokio::select! {
                () = shutdown.cancelled() => break,
                r = self.receive(&queue, room as u32, self.cfg.idle_wait) => r,
            };
            let wait = match received {
                Ok(batch) => {
                    failures = 0;
                    if self
                        .start_all(&queue, batch, first, &permits, &shutdown)
                        .await
                    {
                        continue;
                    }
                    return;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = Duration::from_millis(100u64 << failures.min(7));
                    warn!(queue = %queue, error = %e, retry_in_ms = wait.as_millis() as u64, "receive failed; retrying");
                    wait
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long to take none of `queue`'s requests: while its service is known to be
    /// down they stay on the queue, unlocked, until a probe may go. Unless the fleet
    /// knows it is down: then each is answered at once and its order waits, parked.
    fn held_back(&self, queue: &QueueName, breaker: &Breaker) -> Option<Duration> {
        let fleet_knows = self
            .fleet_for(queue)
            .is_some_and(|f| f.knows_down(queue.as_str()));
        let wait = breaker.held_back_for().filter(|_| !fleet_knows)?;
        debug!(queue = %queue, wait_ms = wait.as_millis() as u64, "circuit open: not taking requests");
        Some(wait.min(self.cfg.idle_wait.max(Duration::from_millis(10))))
    }

    /// Starts the handling of each request of `batch`, each under a permit (`first`
    /// is the one already held); a request still in hand at shutdown is given back.
    /// False once the permits are closed.
    async fn start_all(
        &self,
        queue: &QueueName,
        batch: Vec<(StepRequest, ReceivedMessage)>,
        first: OwnedSemaphorePermit,
        permits: &Arc<Semaphore>,
        shutdown: &CancellationToken,
    ) -> bool {
        if !batch.is_empty() {
            debug!(queue = %queue, batch = batch.len(), "requests received");
        }
        let mut first = Some(first);
        for (req, msg) in batch {
            let permit = match first.take() {
                Some(permit) => permit,
                None => match permits.clone().acquire_owned().await {
                    Ok(permit) => permit,
                    Err(_) => return false,
                },
            };
            let me = self.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = me.handle(req, msg.clone()) => {}
                    () = shutdown.cancelled() => {
                        let _ = me.transport.abandon(&msg).await;
                    }
                }
                drop(permit);
            });
        }
        true
    }

    /// Handles one request to the end: calls, replies or stays silent, and settles
    /// the message.
    pub async fn handle(&self, req: StepRequest, msg: ReceivedMessage) -> Handled {
        let span = info_span!(
            "step",
            order_id = %req.fence.order_id,
            instance_id = %self.cfg.instance,
            step = %req.step,
            action = %req.action,
            epoch = %req.fence.epoch,
        );
        // One trace per order: this step continues the scheduler's span that sent it.
        orderly_core::tracecontext::continue_from(&span, &msg.properties);
        async move {
            if let Some(handled) = self.refuse(&req, &msg).await {
                return handled;
            }
            let started = std::time::Instant::now();
            // A request delivered before may have been called by an agent that died.
            let work = self.work(&req, &msg.queue, msg.delivery_count > 1);
            let (handled, attempts) =
                match while_holding(self.transport.as_ref(), &msg, self.cfg.lock_renewal, work)
                    .await
                {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        // The lock is gone: another agent may have the request now.
                        warn!(error = %e, "lost the request's lock while working on it");
                        return Handled::Silent(format!("lock lost: {e}"));
                    }
                };
            let answer = self.answer(&handled, &msg.queue);
            if let (Handled::Deferred(why), None) = (&handled, &answer) {
                // Given back at once: no permit or lock held while the service is down.
                debug!(reason = %why, "request given back");
                if let Err(e) = self.transport.abandon(&msg).await {
                    debug!(error = %e, "could not give the request back; its lock will expire");
                }
                metrics::counter!("orderly_requests_deferred_total", "queue" => msg.queue.as_str().to_owned()).increment(1);
                return handled;
            }
            metrics::histogram!("orderly_step_duration_seconds", "action" => req.action.clone(), "outcome" => outcome_label(&handled))
                .record(started.elapsed().as_secs_f64());
            metrics::counter!("orderly_remote_calls_total", "action" => req.action.clone()).increment(u64::from(attempts));
            match answer {
                Some(outcome) => self.reply(&req, msg, outcome, attempts, handled).await,
                None => {
                    let _ = self.settle(msg, req.complete_by, None).await;
                    handled
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Refuses a request that is not one a scheduler sends, or that names what this
    /// agent's configuration and the stored workflows do not: dead-lettered with why,
    /// and the service not called. While the stored workflows cannot be read, the
    /// request is left to come back once its lock ends. `None`: go on.
    async fn refuse(&self, req: &StepRequest, msg: &ReceivedMessage) -> Option<Handled> {
        if let Some(bad) = self.key.as_ref().and_then(|key| key.check(msg).err()) {
            let why = format!("step request refused: {bad}");
            warn!(message_id = %msg.message_id, reason = %why, "step request dead-lettered; no service called");
            orderly_core::transport::reject(self.transport.as_ref(), msg, "BadSignature", &why)
                .await;
            return Some(Handled::Refused(why));
        }
        let refused = match req.check() {
            Err(e) => e.to_string(),
            Ok(()) => match self.untrusted(req, &msg.queue).await {
                Ok(None) => return None,
                Ok(Some(why)) => why,
                Err(e) => {
                    warn!(error = %e, "cannot read the stored workflows to check the request; left for later");
                    return Some(Handled::Silent(format!("workflows unreadable: {e}")));
                }
            },
        };
        let why = format!("invalid step request: {refused}");
        warn!(message_id = %msg.message_id, reason = %why, "step request dead-lettered");
        orderly_core::transport::reject(self.transport.as_ref(), msg, "InvalidRequest", &why).await;
        Some(Handled::Refused(why))
    }

    /// The reply `handled` calls for: the service's answer, or, where the fleet sees
    /// the service down, that the request was deferred (its order then waits for the
    /// service). `None`: no reply.
    fn answer(&self, handled: &Handled, queue: &QueueName) -> Option<StepOutcome> {
        match handled {
            Handled::Replied(outcome) => Some(outcome.clone()),
            Handled::Deferred(why)
                if self
                    .fleet_for(queue)
                    .is_some_and(|f| f.knows_down(queue.as_str())) =>
            {
                metrics::counter!("orderly_requests_deferred_total", "queue" => queue.as_str().to_owned()).increment(1);
                debug!(reason = %why, "request deferred: its order waits for the service");
                Some(StepOutcome::Deferred {
                    service: queue.as_str().to_owned(),
                    reason: why.clone(),
                })
            }
            _ => None,
        }
    }

    /// Sends the reply of `outcome` and completes the request, unless its deadline
    /// comes first.
    async fn reply(
        &self,
        req: &StepRequest,
        msg: ReceivedMessage,
        outcome: StepOutcome,
        attempts: u32,
        handled: Handled,
    ) -> Handled {
        let reply = req.reply(
            outcome,
            self.cfg.instance.clone(),
            self.clock.now(),
            attempts,
        );
        let mut message = json_message(
            reply.message_id(),
            &reply,
            Some(req.fence.order_id.as_str()),
        );
        if let Some(key) = &self.key {
            key.sign(&mut message);
        }
        match self
            .settle(msg, req.complete_by, Some((req.reply_to.clone(), message)))
            .await
        {
            Ok(true) => handled,
            Ok(false) => Handled::Silent("deadline passed before replying".into()),
            Err(e) => {
                // Not settled: the request comes back and the call is repeated under
                // the same idempotency key.
                warn!(error = %e, "reply not sent; the request will be redelivered");
                Handled::Silent(format!("reply not sent: {e}"))
            }
        }
    }
}

/// How a request ended, for the step duration's label.
fn outcome_label(handled: &Handled) -> &'static str {
    match handled {
        Handled::Replied(StepOutcome::Succeeded { .. }) => "succeeded",
        Handled::Replied(StepOutcome::Failed { .. }) => "failed",
        Handled::Replied(StepOutcome::Deferred { .. }) | Handled::Deferred(_) => "deferred",
        Handled::Silent(_) => "silent",
        Handled::Refused(_) => "refused",
    }
}
