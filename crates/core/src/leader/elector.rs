//! The elector's state machine: acquire, take a term, run the leader task, renew while
//! it beats its heartbeat, and cancel it the moment leadership might be lost.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::ports::{Acquired, LeaderFence, LeadershipStore, Lease, LeaseError};
use super::timing::ElectorTiming;
use crate::error::Result;
use crate::id::InstanceId;
use crate::state::Epoch;
use crate::validation::ValidationError;

/// A leader task's sign of life. Clones share it.
#[derive(Debug, Clone)]
pub struct Heartbeat(Arc<Mutex<Instant>>);

impl Heartbeat {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }

    /// "I am alive and making progress."
    pub fn beat(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn age(&self) -> Duration {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }
}

/// What a leader task gets: its term, the token cancelled the moment it might no
/// longer lead, and the heartbeat it must beat.
#[derive(Debug, Clone)]
pub struct Leadership {
    /// The term; every write carries it.
    pub fence: LeaderFence,
    /// Cancelled when leadership might be over.
    pub cancelled: CancellationToken,
    /// Beat it at least every `heartbeat_timeout`, or the lease is given up.
    pub heartbeat: Heartbeat,
}

/// How a leader task ended by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderExit {
    /// Its token was cancelled.
    Cancelled,
    /// The store refused a write: another term began.
    Deposed,
    /// It failed and wants someone else to lead.
    Failed(String),
}

/// What an elector shows about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderStatus {
    /// This instance.
    pub instance: InstanceId,
    /// Whether this instance leads now.
    pub is_leader: bool,
    /// The term this instance leads, or last led.
    pub term: Option<Epoch>,
    /// Who leads, as far as this instance knows.
    pub holder: Option<InstanceId>,
    /// When this instance's lease was last acquired or renewed.
    pub last_renewal: Option<DateTime<Utc>>,
    /// Terms this instance has led.
    pub terms_led: u64,
}

/// Why a leader stepped down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDown {
    /// The process is shutting down.
    Shutdown,
    /// No renewal succeeded within the renew deadline.
    RenewDeadline,
    /// The lease service said the lease is no longer ours.
    LeaseLost,
    /// The leader task stopped beating its heartbeat.
    Stalled,
    /// The store refused the task's write: another term began.
    Deposed,
    /// The leader task ended by itself.
    TaskEnded,
}

impl StepDown {
    fn as_str(self) -> &'static str {
        match self {
            StepDown::Shutdown => "shutdown",
            StepDown::RenewDeadline => "renew deadline passed",
            StepDown::LeaseLost => "lease lost",
            StepDown::Stalled => "leader task stalled",
            StepDown::Deposed => "deposed",
            StepDown::TaskEnded => "leader task ended",
        }
    }
}

/// Called when a cancelled leader task does not end within `stop_grace`.
pub type OnStuck = Arc<dyn Fn(&LeaderFence) + Send + Sync>;

/// Runs a leader task on one instance whenever it holds a lease.
pub struct Elector {
    name: String,
    instance: InstanceId,
    lease: Arc<dyn Lease>,
    store: Arc<dyn LeadershipStore>,
    timing: ElectorTiming,
    status: watch::Sender<LeaderStatus>,
    on_stuck: OnStuck,
    /// The failure of the last tries to acquire, so that one that repeats is logged
    /// once, not at every retry.
    failing: std::sync::Mutex<Failing>,
}

/// Failed tries in a row, and what the last one said: a deployer sees each new failure
/// once, with its cause, then how many tries it took until it passed, instead of the
/// same line at every retry.
#[derive(Debug, Default)]
pub(crate) struct Failing {
    said: Option<String>,
    tries: u64,
}

impl Failing {
    /// A try failed saying `what`: whether to log it (the first failure, or one that
    /// says something else than the one before).
    pub(crate) fn failed(&mut self, what: &str) -> bool {
        self.tries += 1;
        if self.said.as_deref() == Some(what) {
            return false;
        }
        self.said = Some(what.to_owned());
        true
    }

    /// A try got an answer: how many failed in a row before it, if any.
    pub(crate) fn passed(&mut self) -> Option<u64> {
        self.said = None;
        let tries = std::mem::take(&mut self.tries);
        (tries > 0).then_some(tries)
    }
}

impl fmt::Debug for Elector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Elector")
            .field("name", &self.name)
            .field("instance", &self.instance)
            .field("lease", &self.lease.describe())
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// An elector for `name` on behalf of `instance`. `store` keeps the terms; `timing`
    /// must have been validated for the kind of lease.
    pub fn new(
        name: impl Into<String>,
        instance: InstanceId,
        lease: Arc<dyn Lease>,
        store: Arc<dyn LeadershipStore>,
        timing: ElectorTiming,
    ) -> Result<Self, ValidationError> {
        timing.validate()?;
        let (status, _) = watch::channel(LeaderStatus {
            instance: instance.clone(),
            is_leader: false,
            term: None,
            holder: None,
            last_renewal: None,
            terms_led: 0,
        });
        Ok(Self {
            name: name.into(),
            instance,
            lease,
            store,
            timing,
            status,
            failing: std::sync::Mutex::default(),
            on_stuck: Arc::new(|fence| {
                tracing::error!(%fence, "leader task did not stop after its cancellation; exiting so that no stale leader work survives");
                std::process::exit(70);
            }),
        })
    }

    /// Replaces what happens when a cancelled leader task does not end in time (the
    /// default exits the process).
    pub fn on_stuck(mut self, hook: OnStuck) -> Self {
        self.on_stuck = hook;
        self
    }

    /// A view of this elector's status that follows every change.
    pub fn status(&self) -> watch::Receiver<LeaderStatus> {
        self.status.subscribe()
    }

    /// Its timings (the lease's length, the retry interval, ...).
    pub fn timing(&self) -> &ElectorTiming {
        &self.timing
    }

    /// Runs `task` each time this instance leads, until `shutdown`.
    pub async fn run<F, Fut>(&self, mut task: F, shutdown: CancellationToken)
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = LeaderExit> + Send + 'static,
    {
        let span =
            tracing::info_span!("elector", leadership = %self.name, instance_id = %self.instance);
        tracing::info!(parent: &span, lease = %self.lease.describe(), "following");
        let mut wait = Duration::ZERO;
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = sleep(wait) => {}
            }
            wait = self.timing.retry_delay();
            let Some((fence, acquired_at)) = self.acquire(&span).await else {
                continue;
            };
            let reason = self
                .lead(&fence, acquired_at, &mut task, &shutdown, &span)
                .await;
            if reason == StepDown::Shutdown {
                return;
            }
            // A leader that gave the lease up itself (its task stalled or ended, its
            // renewals ran past the deadline) sits out one full round: a healthy
            // follower, trying every `retry`, takes over first rather than the same
            // instance taking the lease straight back.
            if reason != StepDown::LeaseLost {
                wait = self.timing.retry + self.timing.retry_delay();
            }
        }
    }

    /// One attempt: the lease, then the term. `None` while following.
    async fn acquire(&self, span: &tracing::Span) -> Option<(LeaderFence, Instant)> {
        let sent = Instant::now();
        let answer = timeout(self.timing.call_timeout, self.lease.try_acquire()).await;
        let failure = match &answer {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "no answer within {} ms",
                self.timing.call_timeout.as_millis()
            )),
        };
        let first = {
            let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
            match &failure {
                Some(what) => failing.failed(what),
                None => {
                    if let Some(tries) = failing.passed() {
                        tracing::info!(parent: span, failed_tries = tries, "the lease answers again");
                    }
                    false
                }
            }
        };
        let fence = match answer {
            Ok(Ok(Acquired::Yes(Some(fence)))) => fence,
            Ok(Ok(Acquired::Yes(None))) => {
                match timeout(
                    self.timing.call_timeout,
                    self.store.begin_term(&self.name, &self.instance),
                )
                .await
                {
                    Ok(Ok(fence)) => fence,
                    failed => {
                        let error = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "timed out".to_string(),
                        };
                        tracing::warn!(parent: span, %error, "lease acquired but no term could be begun in the state store; giving the lease up");
                        let _ = timeout(self.timing.call_timeout, self.lease.release()).await;
                        return None;
                    }
                }
            }
            Ok(Ok(Acquired::HeldByOther)) => {
                self.note_holder().await;
                return None;
            }
            // Each failure is logged when it begins or changes (with its cause chain),
            // at debug while it repeats, and its end at info with the tries it took.
            Ok(Err(e @ LeaseError::Misconfigured(_))) => {
                if first {
                    tracing::error!(parent: span, error = %e, "acquiring the lease is refused: check the lease settings and credentials; retrying, logged again when this changes");
                } else {
                    tracing::debug!(parent: span, error = %e, "acquiring the lease is still refused");
                }
                return None;
            }
            Ok(Err(e)) => {
                if first {
                    tracing::warn!(parent: span, error = %e, "acquiring the lease failed; retrying, logged again when this changes");
                } else {
                    tracing::debug!(parent: span, error = %e, "acquiring the lease still fails");
                }
                return None;
            }
            Err(_) => {
                if first {
                    tracing::warn!(parent: span, timeout_ms = self.timing.call_timeout.as_millis() as u64, "acquiring the lease timed out; retrying, logged again when this changes");
                } else {
                    tracing::debug!(parent: span, "acquiring the lease still times out");
                }
                return None;
            }
        };
        Some((fence, sent))
    }

    /// Records who leads, as the store says, when it changed.
    async fn note_holder(&self) {
        if let Ok(Ok(Some(term))) =
            timeout(self.timing.call_timeout, self.store.term(&self.name)).await
        {
            self.status.send_if_modified(|s| {
                let holder = Some(term.fence.holder.clone());
                let changed = s.holder != holder;
                s.holder = holder;
                changed
            });
        }
    }

    async fn lead<F, Fut>(
        &self,
        fence: &LeaderFence,
        acquired_at: Instant,
        task: &mut F,
        shutdown: &CancellationToken,
        span: &tracing::Span,
    ) -> StepDown
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = LeaderExit> + Send + 'static,
    {
        let now = Utc::now();
        self.status.send_modify(|s| {
            s.is_leader = true;
            s.term = Some(fence.epoch);
            s.holder = Some(self.instance.clone());
            s.last_renewal = Some(now);
            s.terms_led += 1;
        });
        tracing::info!(parent: span, epoch = %fence.epoch, "LEADER: leadership acquired");
        metrics::gauge!("orderly_leader", "leadership" => self.name.clone()).set(1.0);
        metrics::gauge!("orderly_leader_epoch", "leadership" => self.name.clone())
            .set(fence.epoch.0 as f64);
        metrics::counter!("orderly_leadership_changes_total", "leadership" => self.name.clone())
            .increment(1);
        let cancelled = CancellationToken::new();
        let heartbeat = Heartbeat::new();
        let mut running = tokio::spawn(task(Leadership {
            fence: fence.clone(),
            cancelled: cancelled.clone(),
            heartbeat: heartbeat.clone(),
        }));
        let mut last_ok = acquired_at;
        let mut next_renewal = acquired_at + self.timing.renew_interval;
        let mut task_done = false;
        let reason = loop {
            let deadline = last_ok + self.timing.renew_deadline;
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break StepDown::Shutdown,
                () = sleep_until(deadline) => break StepDown::RenewDeadline,
                exit = &mut running => {
                    task_done = true;
                    break match exit {
                        Ok(LeaderExit::Deposed) => StepDown::Deposed,
                        Ok(LeaderExit::Failed(error)) => {
                            tracing::warn!(parent: span, %error, "leader task failed");
                            StepDown::TaskEnded
                        }
                        Ok(LeaderExit::Cancelled) => StepDown::TaskEnded,
                        Err(e) => {
                            tracing::error!(parent: span, error = %e, "leader task panicked");
                            StepDown::TaskEnded
                        }
                    };
                }
                () = sleep_until(next_renewal) => {
                    if heartbeat.age() > self.timing.heartbeat_timeout {
                        break StepDown::Stalled;
                    }
                    let sent = Instant::now();
                    // A renewal can never outlive the deadline.
                    let budget = self.timing.call_timeout.min(deadline.saturating_duration_since(sent));
                    match timeout(budget, self.lease.renew()).await {
                        Ok(Ok(())) => {
                            last_ok = sent;
                            next_renewal = sent + self.timing.renew_interval;
                            let now = Utc::now();
                            self.status.send_modify(|s| s.last_renewal = Some(now));
                            tracing::debug!(parent: span, epoch = %fence.epoch, "lease renewed");
                        }
                        Ok(Err(LeaseError::Lost(why))) => {
                            tracing::warn!(parent: span, epoch = %fence.epoch, %why, "lease lost");
                            break StepDown::LeaseLost;
                        }
                        failed => {
                            let error = match failed {
                                Ok(Err(e)) => e.to_string(),
                                _ => format!("timed out after {} ms", budget.as_millis()),
                            };
                            let left = deadline.saturating_duration_since(Instant::now());
                            tracing::warn!(parent: span, epoch = %fence.epoch, %error, deadline_in_ms = left.as_millis() as u64, "lease renewal failed; retrying");
                            metrics::counter!("orderly_lease_renewal_failures_total", "leadership" => self.name.clone()).increment(1);
                            next_renewal = Instant::now() + self.timing.renew_retry;
                        }
                    }
                }
            }
        };
        cancelled.cancel();
        self.status.send_modify(|s| {
            s.is_leader = false;
            if s.holder.as_ref() == Some(&self.instance) {
                s.holder = None;
            }
        });
        tracing::warn!(parent: span, epoch = %fence.epoch, reason = reason.as_str(), "LEADER: leadership ended");
        metrics::gauge!("orderly_leader", "leadership" => self.name.clone()).set(0.0);
        if !task_done && timeout(self.timing.stop_grace, &mut running).await.is_err() {
            (self.on_stuck)(fence);
            running.abort();
        }
        if reason != StepDown::LeaseLost {
            // The task has ended: hand over at once rather than at the lease's expiry.
            // After a missed deadline the lease may already be someone else's, and the
            // release is refused, harmlessly.
            match timeout(self.timing.call_timeout, self.lease.release()).await {
                Ok(Ok(())) => tracing::info!(parent: span, epoch = %fence.epoch, "lease released"),
                Ok(Err(e)) => tracing::debug!(parent: span, error = %e, "lease not released"),
                Err(_) => tracing::debug!(parent: span, "releasing the lease timed out"),
            }
        }
        reason
    }
}
