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
mod catalogue;
mod fleet;
mod remote;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::messages::{StepOutcome, StepReply, StepRequest, json_message};
use orderly_core::transport::{
    OutgoingMessage, QueueName, ReceivedMessage, Transport, receive_json, while_holding,
};
use orderly_core::workflow::{NotFound, StatusProbe};
use orderly_core::{Clock, InstanceId};
use rand::Rng;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

pub use breaker::{Breaker, BreakerConfig};
pub use catalogue::Catalogue;
pub use fleet::FleetConfig;
pub use remote::{CallError, Endpoints, HttpRemote, ProbeAnswer, RemoteCall, RemoteService};

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
}

/// A request to settle: send its reply (if any), then complete it.
struct Settle {
    reply: Option<(QueueName, OutgoingMessage)>,
    complete_by: DateTime<Utc>,
    request: ReceivedMessage,
    /// Whether the reply went out (false: its deadline came first), or why not settled.
    done: oneshot::Sender<Result<bool, String>>,
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
        }
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

    /// The fleet's view, if `queue`'s service takes part in it.
    fn fleet_for(&self, queue: &QueueName) -> Option<&Arc<fleet::Fleet>> {
        self.fleet.as_ref().filter(|f| f.covers(queue))
    }

    /// Hands a request to the settling task and waits for it to be settled; says
    /// whether the reply (if any) went out.
    async fn settle(
        &self,
        request: ReceivedMessage,
        complete_by: DateTime<Utc>,
        reply: Option<(QueueName, OutgoingMessage)>,
    ) -> Result<bool, String> {
        let (done, settled) = oneshot::channel();
        let item = Settle {
            reply,
            complete_by,
            request,
            done,
        };
        if self.settler.send(item).is_err() {
            return Err("the settling task has stopped".into());
        }
        settled
            .await
            .unwrap_or_else(|_| Err("the settling task has stopped".into()))
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
                tokio::spawn(async move {
                    let mut every = tokio::time::interval(fleet.cfg.refresh);
                    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            _ = every.tick() => {}
                        }
                        if let Err(e) = fleet.view.refresh().await {
                            debug!(error = %e, "cannot read the fleet's view of the services");
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
            // While the service is known to be down, take none of its requests: they
            // stay on the queue, unlocked, until a probe may go. Unless the fleet knows
            // it is down: then each is answered at once and its order waits, parked.
            let fleet_knows = self
                .fleet_for(&queue)
                .is_some_and(|f| f.knows_down(queue.as_str()));
            if let Some(wait) = breaker.held_back_for().filter(|_| !fleet_knows) {
                debug!(queue = %queue, wait_ms = wait.as_millis() as u64, "circuit open: not taking requests");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(wait.min(self.cfg.idle_wait.max(Duration::from_millis(10)))) => continue,
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
            let mut first = Some(first);
            match received {
                Ok(batch) => {
                    failures = 0;
                    if !batch.is_empty() {
                        debug!(queue = %queue, batch = batch.len(), "requests received");
                    }
                    for (req, msg) in batch {
                        let permit = match first.take() {
                            Some(permit) => permit,
                            None => match permits.clone().acquire_owned().await {
                                Ok(permit) => permit,
                                Err(_) => return,
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
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = Duration::from_millis(100u64 << failures.min(7));
                    warn!(queue = %queue, error = %e, retry_in_ms = wait.as_millis() as u64, "receive failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
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
            let refused = match req.check() {
                Err(e) => Some(e.to_string()),
                Ok(()) => match self.untrusted(&req, &msg.queue).await {
                    Ok(why) => why,
                    Err(e) => {
                        // The store is out: the request comes back once its lock ends.
                        warn!(error = %e, "cannot read the stored workflows to check the request; left for later");
                        return Handled::Silent(format!("workflows unreadable: {e}"));
                    }
                },
            };
            if let Some(e) = refused {
                let why = format!("invalid step request: {e}");
                warn!(message_id = %msg.message_id, reason = %why, "step request dead-lettered");
                orderly_core::transport::reject(self.transport.as_ref(), &msg, "InvalidRequest", &why)
                    .await;
                return Handled::Refused(why);
            }
            let started = std::time::Instant::now();
            // A request delivered before may have been called by an agent that died.
            let work = self.work(&req, &msg.queue, msg.delivery_count > 1);
            let outcome =
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
            let (handled, attempts) = outcome;
            let fleet = self
                .fleet_for(&msg.queue)
                .filter(|f| f.knows_down(msg.queue.as_str()));
            let answer = match &handled {
                Handled::Replied(outcome) => Some(outcome.clone()),
                Handled::Deferred(why) if fleet.is_some() => {
                    metrics::counter!("orderly_requests_deferred_total", "queue" => msg.queue.as_str().to_owned()).increment(1);
                    debug!(reason = %why, "request deferred: its order waits for the service");
                    Some(StepOutcome::Deferred {
                        service: msg.queue.as_str().to_owned(),
                        reason: why.clone(),
                    })
                }
                _ => None,
            };
            if let (Handled::Deferred(why), None) = (&handled, &answer) {
                // Given back at once: no permit or lock held while the service is down.
                debug!(reason = %why, "request given back");
                if let Err(e) = self.transport.abandon(&msg).await {
                    debug!(error = %e, "could not give the request back; its lock will expire");
                }
                metrics::counter!("orderly_requests_deferred_total", "queue" => msg.queue.as_str().to_owned()).increment(1);
                return handled;
            }
            let result = match &handled {
                Handled::Replied(StepOutcome::Succeeded { .. }) => "succeeded",
                Handled::Replied(StepOutcome::Failed { .. }) => "failed",
                Handled::Replied(StepOutcome::Deferred { .. }) | Handled::Deferred(_) => {
                    "deferred"
                }
                Handled::Silent(_) => "silent",
                Handled::Refused(_) => "refused",
            };
            metrics::histogram!("orderly_step_duration_seconds", "action" => req.action.clone(), "outcome" => result)
                .record(started.elapsed().as_secs_f64());
            metrics::counter!("orderly_remote_calls_total", "action" => req.action.clone()).increment(u64::from(attempts));
            if let Some(outcome) = &answer {
                let now = self.clock.now();
                let reply = StepReply {
                    fence: req.fence.clone(),
                    step_index: req.step_index,
                    step: req.step.clone(),
                    action: req.action.clone(),
                    kind: req.kind,
                    outcome: outcome.clone(),
                    agent: self.cfg.instance.clone(),
                    replied_at: now,
                    complete_by: req.complete_by,
                    attempts,
                    context: req.context.clone(),
                };
                let message = json_message(
                    reply.message_id(),
                    &reply,
                    Some(req.fence.order_id.as_str()),
                );
                return match self
                    .settle(msg, req.complete_by, Some((req.reply_to.clone(), message)))
                    .await
                {
                    Ok(true) => handled,
                    Ok(false) => Handled::Silent("deadline passed before replying".into()),
                    Err(e) => {
                        // Not settled: the request comes back and the call is repeated
                        // under the same idempotency key.
                        warn!(error = %e, "reply not sent; the request will be redelivered");
                        Handled::Silent(format!("reply not sent: {e}"))
                    }
                };
            }
            let _ = self.settle(msg, req.complete_by, None).await;
            handled
        }
        .instrument(span)
        .await
    }

    /// Asks the step's status probe whether its action already took effect; what the
    /// history says of it is in the verdict.
    async fn ask(&self, req: &StepRequest, probe: &StatusProbe, left: Duration) -> Verdict {
        let url = probe.url_for(
            &req.idempotency_key,
            req.fence.order_id.as_str(),
            &req.action,
        );
        let answer = self
            .remote
            .probe(&url, &req.idempotency_key, left.min(PROBE_TIMEOUT))
            .await;
        let verdict = match answer {
            ProbeAnswer::Applied(answer) => Verdict::Applied(answer),
            ProbeAnswer::NotFound if probe.not_found == NotFound::NotApplied => {
                Verdict::Call("status probe: not applied; called".into())
            }
            ProbeAnswer::NotFound => Verdict::Call(
                "status probe: unknown (404, which this service does not take as \"not applied\"); called under the same key".into(),
            ),
            ProbeAnswer::Unknown(why) => Verdict::Call(format!(
                "status probe: unknown ({why}); called under the same key"
            )),
        };
        let label = match &verdict {
            Verdict::Applied(_) => "applied",
            Verdict::Call(note) if note.contains("not applied") => "not_applied",
            Verdict::Call(_) => "unknown",
        };
        info!(
            verdict = label,
            "status probe asked before sending the step again"
        );
        metrics::counter!("orderly_status_probes_total", "action" => req.action.clone(), "verdict" => label)
            .increment(1);
        verdict
    }

    /// Calls the remote service until it answers, fails permanently, the tries run
    /// out, or the deadline passes. Returns the result and the number of calls.
    /// `redelivered`: the request came before and may have been called. An uncertain
    /// step (redelivered, sent again by the scheduler, or after a call that ended
    /// without a clear answer) with a status probe is asked about before each call.
    async fn work(
        &self,
        req: &StepRequest,
        queue: &QueueName,
        redelivered: bool,
    ) -> (Handled, u32) {
        let started = self.clock.now();
        // Checked (`StepRequest::check`) to be at most 24 h; bounded here all the same.
        let budget = chrono::Duration::milliseconds(
            i64::try_from(
                req.timeout_ms
                    .min(orderly_core::workflow::MAX_STEP_TIMEOUT_MS),
            )
            .unwrap_or(i64::MAX),
        );
        let margin = chrono::Duration::from_std(self.cfg.reply_margin).unwrap_or_default();
        let stop_at = (req.complete_by - margin).min(
            started
                .checked_add_signed(budget)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        );
        // The queue is the remote service (inventory, payment, ...): one breaker each.
        let service = queue.as_str();
        let breaker = self.breaker(service);
        let fleet = self.fleet_for(queue);
        // An answer from the service: if the fleet sees it down, it is back.
        let answered = || {
            breaker.record_success();
            if let Some(fleet) = fleet.filter(|f| f.knows_down(service)).cloned() {
                let service = service.to_owned();
                tokio::spawn(async move { fleet.report_up(&service).await });
            }
        };
        let call = RemoteCall::from_request(req);
        let mut attempts = 0u32;
        let mut last_error = String::from("no attempt made");
        let mut uncertain = req.uncertain || redelivered;
        // What the probe said before the call that answered, for the history.
        let mut probed: Option<String> = None;
        let noted = |text: String, probed: &Option<String>| match probed {
            Some(note) => format!("{note}: {text}"),
            None => text,
        };
        while attempts < req.retry.max_attempts {
            let now = self.clock.now();
            let Ok(left) = (stop_at - now).to_std() else {
                break;
            };
            if left.is_zero() {
                break;
            }
            // While the fleet sees the service down, the fleet decides: no call until a
            // probe is due, and then this request may be the probe, whatever this agent's
            // own breaker says. Otherwise the breaker decides.
            if let Some(why) = fleet.and_then(|f| f.down_now(service, self.clock.now())) {
                return (Handled::Deferred(why), attempts);
            }
            let fleet_probe = fleet.is_some_and(|f| f.knows_down(service));
            if !fleet_probe && let Err(wait) = breaker.allow() {
                // Give it back rather than wait holding a permit and the message's lock.
                return (
                    Handled::Deferred(format!(
                        "circuit open for {service} (probe in {} ms) after {attempts} calls",
                        wait.as_millis()
                    )),
                    attempts,
                );
            }
            if let Some(probe) = req.probe.as_ref().filter(|_| uncertain) {
                match self.ask(req, probe, left).await {
                    Verdict::Applied(answer) => {
                        // The service answered: it is up (this may have been the one
                        // try a half-open breaker lets through).
                        answered();
                        return (
                            Handled::Replied(StepOutcome::Succeeded {
                                detail: format!(
                                    "status probe: applied before, not called again: {answer}"
                                ),
                            }),
                            attempts,
                        );
                    }
                    Verdict::Call(note) => probed = Some(note),
                }
                let Ok(rest) = (stop_at - self.clock.now()).to_std() else {
                    break;
                };
                if rest.is_zero() {
                    break;
                }
            }
            let left = (stop_at - self.clock.now()).to_std().unwrap_or(left);
            attempts += 1;
            let result = tokio::time::timeout(left, self.remote.call(&call, left)).await;
            match result {
                Ok(Ok(detail)) => {
                    answered();
                    return (
                        Handled::Replied(StepOutcome::Succeeded {
                            detail: noted(detail, &probed),
                        }),
                        attempts,
                    );
                }
                Ok(Err(CallError::Permanent(error))) => {
                    // The service answered: it is up, the request is bad.
                    answered();
                    return (
                        Handled::Replied(StepOutcome::Failed {
                            error: noted(error, &probed),
                        }),
                        attempts,
                    );
                }
                Ok(Err(CallError::Transient { error, retry_after })) => {
                    // An opened breaker begins an outage; a failed probe extends one.
                    if (breaker.record_failure() || fleet_probe)
                        && let Some(fleet) = fleet
                    {
                        fleet.report_down(service, &error).await;
                    }
                    // No clear answer: the call may have taken effect before failing.
                    uncertain = true;
                    debug!(attempt = attempts, error = %error, "transient failure");
                    last_error = error;
                    let cap = req.retry.backoff_cap(attempts);
                    let jitter = if cap.is_zero() {
                        Duration::ZERO
                    } else {
                        rand::rng().random_range(Duration::ZERO..=cap)
                    };
                    let wait = retry_after.map_or(jitter, |ra| ra.max(jitter));
                    let left = (stop_at - self.clock.now()).to_std().unwrap_or_default();
                    if wait >= left {
                        break;
                    }
                    tokio::time::sleep(wait).await;
                }
                Err(_elapsed) => {
                    last_error = "remote call outlived the deadline".into();
                    if (breaker.record_failure() || fleet_probe)
                        && let Some(fleet) = fleet
                    {
                        fleet.report_down(service, &last_error).await;
                    }
                    break;
                }
            }
        }
        let why = if self.clock.now() >= stop_at {
            format!("deadline reached after {attempts} calls; last error: {last_error}")
        } else {
            format!("{attempts} calls failed; last error: {last_error}")
        };
        info!(attempts, reason = %why, "giving up silently: the supervisor will retry the order");
        (Handled::Silent(why), attempts)
    }
}

/// Most requests settled together.
const SETTLE_BATCH: usize = 256;

/// The longest a status probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What to do after asking a status probe.
enum Verdict {
    /// The action took effect: reply with this answer, do not call.
    Applied(String),
    /// Call; the note says why, for the history.
    Call(String),
}

/// Settles requests in batches: the replies of a batch go out in one send per reply
/// queue, then the requests are completed in one call. What waits while a batch is
/// being written forms the next batch, so the batch grows with the load and a lone
/// request is settled at once. A reply whose deadline has come meanwhile is not sent.
async fn settle_batches(
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
    margin: Duration,
    mut settles: mpsc::UnboundedReceiver<Settle>,
) {
    let margin = chrono::Duration::from_std(margin).unwrap_or_default();
    while let Some(first) = settles.recv().await {
        let mut batch = vec![first];
        while batch.len() < SETTLE_BATCH {
            match settles.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        debug!(batch = batch.len(), "settling requests");
        let now = clock.now();
        let mut sends = Vec::new();
        let mut requests = Vec::with_capacity(batch.len());
        let mut waiting = Vec::with_capacity(batch.len());
        for s in batch {
            // The deadline is checked here, as close to the send as it can be.
            let sent = match s.reply {
                Some(_) if now + margin >= s.complete_by => {
                    debug!(message_id = %s.request.message_id, "deadline came before the reply could go: not sent");
                    false
                }
                Some((queue, message)) => {
                    sends.push(orderly_core::transport::Envelope { queue, message });
                    true
                }
                None => false,
            };
            requests.push(s.request);
            waiting.push((s.done, sent));
        }
        // On the SQL queue the replies and the completions commit together.
        match transport.send_and_complete(&sends, &requests).await {
            Ok(_) => {
                // A lost lock after the reply went out is harmless: the request comes
                // back and is answered again under the same idempotency key and id.
                for (done, sent) in waiting {
                    let _ = done.send(Ok(sent));
                }
            }
            Err(e) => {
                warn!(error = %e, batch = requests.len(), "could not settle requests; they will come back");
                for request in &requests {
                    let _ = transport.abandon(request).await;
                }
                for (done, _) in waiting {
                    let _ = done.send(Err(e.to_string()));
                }
            }
        }
    }
}
