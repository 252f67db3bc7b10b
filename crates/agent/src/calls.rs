//! One request's calls to its remote service: the step's time left, the gate the
//! fleet's view and the circuit breaker keep, the status probe asked before an
//! uncertain call, the retries of transient failures with back-off and full jitter,
//! and the silence once the deadline has passed.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orderly_core::messages::{StepOutcome, StepRequest};
use orderly_core::transport::QueueName;
use orderly_core::workflow::{NotFound, StatusProbe};
use rand::Rng;
use tracing::{debug, info};

use crate::breaker::Breaker;
use crate::fleet::Fleet;
use crate::remote::{CallError, ProbeAnswer, RemoteCall};
use crate::{Agent, Handled};

/// The longest a status probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What to do after asking a status probe.
enum Verdict {
    /// The action took effect: reply with this answer, do not call.
    Applied(String),
    /// Call; the note says why, for the history.
    Call(String),
}

/// What one try of a request leads to.
enum Try {
    /// The request is handled: replied, or given back.
    Done(Handled),
    /// A transient failure: try again after this wait.
    Again(Duration),
    /// No time (or no point) left for another try.
    Stop,
}

/// One request's calls as they go: what the service and its breaker are, when to
/// stop, and what the calls so far said.
struct Tries<'a> {
    service: &'a str,
    breaker: Arc<Breaker>,
    fleet: Option<&'a Arc<Fleet>>,
    stop_at: DateTime<Utc>,
    attempts: u32,
    last_error: String,
    /// Whether an earlier call (or delivery) may have taken effect.
    uncertain: bool,
    /// What the probe said before the call that answered, for the history.
    probed: Option<String>,
}

impl Tries<'_> {
    /// The service answered: it is up (this may have been the one try a half-open
    /// breaker lets through), and if the fleet sees it down, it is back.
    fn answered(&self) {
        self.breaker.record_success();
        if let Some(fleet) = self.fleet.filter(|f| f.knows_down(self.service)).cloned() {
            let service = self.service.to_owned();
            tokio::spawn(async move { fleet.report_up(&service).await });
        }
    }

    /// A call failed without an answer: an opened breaker begins an outage; a failed
    /// probe of the fleet's extends one.
    async fn failed(&self, fleet_probe: bool, error: &str) {
        if (self.breaker.record_failure() || fleet_probe)
            && let Some(fleet) = self.fleet
        {
            fleet.report_down(self.service, error).await;
        }
    }

    /// `text`, after what the probe said, if it was asked.
    fn noted(&self, text: String) -> String {
        match &self.probed {
            Some(note) => format!("{note}: {text}"),
            None => text,
        }
    }

    /// Whether this request may call now. While the fleet sees the service down, the
    /// fleet decides: no call until a probe is due, and then this request may be the
    /// probe, whatever this agent's own breaker says. Otherwise the breaker decides,
    /// and the request is given back rather than held waiting with a permit and its
    /// message's lock. `Ok(true)`: this call is the fleet's probe.
    fn gate(&self, now: DateTime<Utc>) -> Result<bool, Handled> {
        if let Some(why) = self.fleet.and_then(|f| f.down_now(self.service, now)) {
            return Err(Handled::Deferred(why));
        }
        let fleet_probe = self.fleet.is_some_and(|f| f.knows_down(self.service));
        if !fleet_probe && let Err(wait) = self.breaker.allow() {
            return Err(Handled::Deferred(format!(
                "circuit open for {} (probe in {} ms) after {} calls",
                self.service,
                wait.as_millis(),
                self.attempts
            )));
        }
        Ok(fleet_probe)
    }
}

/// How long to wait before the next try after a transient failure: full jitter up to
/// the retry policy's cap, and never less than the service's `Retry-After`.
fn backoff(req: &StepRequest, attempts: u32, retry_after: Option<Duration>) -> Duration {
    let cap = req.retry.backoff_cap(attempts);
    let jitter = if cap.is_zero() {
        Duration::ZERO
    } else {
        rand::rng().random_range(Duration::ZERO..=cap)
    };
    retry_after.map_or(jitter, |ra| ra.max(jitter))
}

impl Agent {
    /// When this request's calls stop: its deadline less the margin a reply needs,
    /// or its step budget from `started`, whichever comes first.
    fn stop_at(&self, req: &StepRequest, started: DateTime<Utc>) -> DateTime<Utc> {
        // Checked (`StepRequest::check`) to be at most 24 h; bounded here all the same.
        let budget = chrono::Duration::milliseconds(
            i64::try_from(
                req.timeout_ms
                    .min(orderly_core::workflow::MAX_STEP_TIMEOUT_MS),
            )
            .unwrap_or(i64::MAX),
        );
        let margin = chrono::Duration::from_std(self.cfg.reply_margin).unwrap_or_default();
        (req.complete_by - margin).min(
            started
                .checked_add_signed(budget)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        )
    }

    /// The time left until `stop_at`; `None` once it has come.
    fn left(&self, stop_at: DateTime<Utc>) -> Option<Duration> {
        (stop_at - self.clock.now())
            .to_std()
            .ok()
            .filter(|left| !left.is_zero())
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
    pub(crate) async fn work(
        &self,
        req: &StepRequest,
        queue: &QueueName,
        redelivered: bool,
    ) -> (Handled, u32) {
        let mut t = self.tries(req, queue, redelivered);
        let call = RemoteCall::from_request(req);
        while t.attempts < req.retry.max_attempts {
            match self.try_once(req, &call, &mut t).await {
                Try::Done(handled) => return (handled, t.attempts),
                Try::Again(wait) => tokio::time::sleep(wait).await,
                Try::Stop => break,
            }
        }
        self.give_up(&t)
    }

    /// The calls of `req`, none made yet. The queue is the remote service (inventory,
    /// payment, ...): one breaker each.
    fn tries<'a>(
        &'a self,
        req: &StepRequest,
        queue: &'a QueueName,
        redelivered: bool,
    ) -> Tries<'a> {
        let service = queue.as_str();
        Tries {
            service,
            breaker: self.breaker(service),
            fleet: self.fleet_for(queue),
            stop_at: self.stop_at(req, self.clock.now()),
            attempts: 0,
            last_error: String::from("no attempt made"),
            uncertain: req.uncertain || redelivered,
            probed: None,
        }
    }

    /// One try: through the gate, the status probe if the step is uncertain, then the
    /// call and what its answer leads to.
    async fn try_once(&self, req: &StepRequest, call: &RemoteCall, t: &mut Tries<'_>) -> Try {
        let Some(left) = self.left(t.stop_at) else {
            return Try::Stop;
        };
        let fleet_probe = match t.gate(self.clock.now()) {
            Ok(fleet_probe) => fleet_probe,
            Err(deferred) => return Try::Done(deferred),
        };
        if let Some(probe) = req.probe.as_ref().filter(|_| t.uncertain) {
            match self.ask(req, probe, left).await {
                Verdict::Applied(answer) => {
                    t.answered();
                    return Try::Done(Handled::Replied(StepOutcome::Succeeded {
                        detail: format!("status probe: applied before, not called again: {answer}"),
                    }));
                }
                Verdict::Call(note) => t.probed = Some(note),
            }
            if self.left(t.stop_at).is_none() {
                return Try::Stop;
            }
        }
        let left = self.left(t.stop_at).unwrap_or(left);
        t.attempts += 1;
        let answer = tokio::time::timeout(left, self.remote.call(call, left)).await;
        self.after_call(req, t, fleet_probe, answer).await
    }

    /// What a call's answer (or its timeout) leads to.
    async fn after_call(
        &self,
        req: &StepRequest,
        t: &mut Tries<'_>,
        fleet_probe: bool,
        answer: Result<Result<String, CallError>, tokio::time::error::Elapsed>,
    ) -> Try {
        match answer {
            Ok(Ok(detail)) => {
                t.answered();
                Try::Done(Handled::Replied(StepOutcome::Succeeded {
                    detail: t.noted(detail),
                }))
            }
            Ok(Err(CallError::Permanent(error))) => {
                // The service answered: it is up, the request is bad.
                t.answered();
                Try::Done(Handled::Replied(StepOutcome::Failed {
                    error: t.noted(error),
                }))
            }
            Ok(Err(CallError::Transient { error, retry_after })) => {
                t.failed(fleet_probe, &error).await;
                // No clear answer: the call may have taken effect before failing.
                t.uncertain = true;
                debug!(attempt = t.attempts, error = %error, "transient failure");
                t.last_error = error;
                let wait = backoff(req, t.attempts, retry_after);
                if wait >= self.left(t.stop_at).unwrap_or_default() {
                    Try::Stop
                } else {
                    Try::Again(wait)
                }
            }
            Err(_elapsed) => {
                t.last_error = "remote call outlived the deadline".into();
                t.failed(fleet_probe, &t.last_error).await;
                Try::Stop
            }
        }
    }

    /// No answer within the tries or the time: silence, and the supervisor retries
    /// the order after its deadline.
    fn give_up(&self, t: &Tries<'_>) -> (Handled, u32) {
        let why = if self.clock.now() >= t.stop_at {
            format!(
                "deadline reached after {} calls; last error: {}",
                t.attempts, t.last_error
            )
        } else {
            format!("{} calls failed; last error: {}", t.attempts, t.last_error)
        };
        info!(attempts = t.attempts, reason = %why, "giving up silently: the supervisor will retry the order");
        (Handled::Silent(why), t.attempts)
    }
}
