//! Leader election: "run this task while I lead; cancel it the moment I might not".
//!
//! An [`Elector`] drives one [`Lease`] (a blob lease, or a lease row in the state
//! store): followers try to acquire it every `retry` (plus jitter); the winner takes a
//! new term in the state store (a strictly larger epoch, [`LeadershipStore::begin_term`])
//! before its leader task runs, and every write that task makes carries the term's
//! [`LeaderFence`], so a deposed leader's writes are refused by the store, not merely
//! unlikely.
//!
//! While it leads, a renewer renews the lease every `renew_interval` (`renew_retry`
//! after a failure), and only while the leader task beats its [`Heartbeat`]. The task's
//! [`CancellationToken`] is cancelled when
//! - the renew deadline passes: `renew_deadline` after the *send time* of the last
//!   successful renewal, on the monotonic clock, and shorter than the lease, so the
//!   leader stops before the lease can expire anywhere;
//! - the lease is reported lost, or the task's heartbeat stops (a wedged leader);
//! - the process shuts down (the lease is then released, so a follower leads at once).
//!
//! If the task has not ended `stop_grace` after its cancellation, the elector calls its
//! `on_stuck` hook, by default exiting the process. Time is tokio's, so tests drive the
//! whole state machine with a paused clock.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::error::{Result, ValidationError};
use crate::id::InstanceId;
use crate::state::Epoch;

/// The proof of leadership a leader's writes carry: the store refuses a write whose
/// term is no longer the current one ([`crate::Error::Deposed`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaderFence {
    /// What is led, e.g. `supervisor`.
    pub name: String,
    /// The leader.
    pub holder: InstanceId,
    /// Its term.
    pub epoch: Epoch,
}

impl fmt::Display for LeaderFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} term {} held by {}",
            self.name, self.epoch, self.holder
        )
    }
}

/// The current term of a leadership, as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The term's fence (name, holder, epoch).
    pub fence: LeaderFence,
    /// The SQL lease's expiry on the database's clock; `None` for a term whose lease
    /// lives elsewhere (a blob), fenced by epoch alone.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the term began.
    pub started_at: DateTime<Utc>,
    /// When its lease was last renewed (SQL lease) or the term began.
    pub renewed_at: DateTime<Utc>,
}

/// The state store's side of leadership: terms and their epochs, and the lease row of
/// the SQL elector. Every supervisor write checks its fence against the current term.
#[async_trait]
pub trait LeadershipStore: Send + Sync {
    /// Begins a new term of `name` for `holder` whose lease lives elsewhere (a blob):
    /// the epoch becomes one more than any before. Any lease row the SQL elector held
    /// is ended by it.
    async fn begin_term(&self, name: &str, holder: &InstanceId) -> Result<LeaderFence>;

    /// The SQL elector's acquire: a new term for `holder` if there is no term, or the
    /// current one's SQL lease has expired or was released (on the database's clock).
    /// `None` while another's lease (or a term of another elector) holds.
    async fn acquire_lease(
        &self,
        name: &str,
        holder: &InstanceId,
        lease: Duration,
    ) -> Result<Option<LeaderFence>>;

    /// Extends the SQL lease of `fence`'s term to now + `lease`; `false` if the term is
    /// over or its lease expired (it is then lost, never revived).
    async fn renew_lease(&self, fence: &LeaderFence, lease: Duration) -> Result<bool>;

    /// Ends the SQL lease of `fence`'s term now, so a follower can take over at once;
    /// `false` (and nothing changes) if the term or its lease was already over.
    async fn release_lease(&self, fence: &LeaderFence) -> Result<bool>;

    /// The current term of `name`, if there ever was one.
    async fn term(&self, name: &str) -> Result<Option<Term>>;
}

/// The result of one attempt to acquire a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is ours. A lease kept in the state store begins its term itself and
    /// gives the fence; others leave that to the elector.
    Yes(Option<LeaderFence>),
    /// Someone else holds it.
    HeldByOther,
}

/// Why a lease call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// The lease is not (or no longer) ours.
    #[error("lease lost: {0}")]
    Lost(String),
    /// The lease service could not be reached or failed; the call may be retried.
    #[error("lease service unavailable: {0}")]
    Unavailable(String),
    /// The configuration or the credentials are wrong: retrying will not help.
    #[error("lease misconfigured: {0}")]
    Misconfigured(String),
}

/// One lease, held on behalf of one instance. Implementations keep their own lease id.
#[async_trait]
pub trait Lease: Send + Sync {
    /// What the lease is, for logs (no secrets).
    fn describe(&self) -> String;
    /// Tries once to take the lease.
    async fn try_acquire(&self) -> Result<Acquired, LeaseError>;
    /// Renews the lease this instance holds.
    async fn renew(&self) -> Result<(), LeaseError>;
    /// Gives the lease up.
    async fn release(&self) -> Result<(), LeaseError>;
}

/// The SQL elector's lease: a term-scoped row in the state store, timed by the
/// database's clock.
pub struct StoreLease {
    store: Arc<dyn LeadershipStore>,
    name: String,
    holder: InstanceId,
    lease: Duration,
    term: Mutex<Option<LeaderFence>>,
}

impl StoreLease {
    /// `holder`'s lease on `name`, lasting `lease` from each acquire or renewal.
    pub fn new(
        store: Arc<dyn LeadershipStore>,
        name: impl Into<String>,
        holder: InstanceId,
        lease: Duration,
    ) -> Self {
        Self {
            store,
            name: name.into(),
            holder,
            lease,
            term: Mutex::new(None),
        }
    }

    fn current(&self) -> Option<LeaderFence> {
        self.term.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, fence: Option<LeaderFence>) {
        *self.term.lock().unwrap_or_else(|p| p.into_inner()) = fence;
    }
}

fn store_err(e: crate::Error) -> LeaseError {
    if e.is_retryable() {
        LeaseError::Unavailable(e.to_string())
    } else {
        LeaseError::Misconfigured(e.to_string())
    }
}

#[async_trait]
impl Lease for StoreLease {
    fn describe(&self) -> String {
        format!("SQL lease row {:?}", self.name)
    }

    async fn try_acquire(&self) -> Result<Acquired, LeaseError> {
        match self
            .store
            .acquire_lease(&self.name, &self.holder, self.lease)
            .await
            .map_err(store_err)?
        {
            Some(fence) => {
                self.set(Some(fence.clone()));
                Ok(Acquired::Yes(Some(fence)))
            }
            None => Ok(Acquired::HeldByOther),
        }
    }

    async fn renew(&self) -> Result<(), LeaseError> {
        let Some(fence) = self.current() else {
            return Err(LeaseError::Lost("no term held".into()));
        };
        if self
            .store
            .renew_lease(&fence, self.lease)
            .await
            .map_err(store_err)?
        {
            Ok(())
        } else {
            self.set(None);
            Err(LeaseError::Lost(format!("{fence} is over")))
        }
    }

    async fn release(&self) -> Result<(), LeaseError> {
        if let Some(fence) = self.current() {
            self.store.release_lease(&fence).await.map_err(store_err)?;
            self.set(None);
        }
        Ok(())
    }
}

/// The elector's timing. Defaults: lease 30 s, renew every 5 s (2 s after a failure),
/// renew deadline 20 s, acquire retry 2 s plus up to 20 % jitter, 3 s per call, a
/// leader task that has not stopped 3 s after its cancellation ends the process, and
/// a heartbeat older than 15 s means the leader task is wedged.
#[derive(Debug, Clone, PartialEq)]
pub struct ElectorTiming {
    /// How long a lease lasts from its acquire or last renewal.
    pub lease: Duration,
    /// Time between renewals.
    pub renew_interval: Duration,
    /// Time before the next try after a failed renewal.
    pub renew_retry: Duration,
    /// Leader work stops this long after the send time of the last successful renewal.
    pub renew_deadline: Duration,
    /// Followers try to acquire this often...
    pub retry: Duration,
    /// ...plus up to this fraction of it, at random.
    pub retry_jitter: f64,
    /// Each lease call is abandoned after this long.
    pub call_timeout: Duration,
    /// A cancelled leader task that has not ended this long after is stuck.
    pub stop_grace: Duration,
    /// A leader task whose heartbeat is older than this is wedged: the lease is not
    /// renewed for it.
    pub heartbeat_timeout: Duration,
}

impl Default for ElectorTiming {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            renew_interval: Duration::from_secs(5),
            renew_retry: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(20),
            retry: Duration::from_secs(2),
            retry_jitter: 0.2,
            call_timeout: Duration::from_secs(3),
            stop_grace: Duration::from_secs(3),
            heartbeat_timeout: Duration::from_secs(15),
        }
    }
}

impl ElectorTiming {
    /// Refuses timings under which a leader could act after its lease expired, or that
    /// make no sense; the error names the setting (`lease`, `renew_deadline`, ...).
    pub fn validate(&self) -> Result<(), ValidationError> {
        let positive = [
            ("lease", self.lease),
            ("renew_interval", self.renew_interval),
            ("renew_retry", self.renew_retry),
            ("renew_deadline", self.renew_deadline),
            ("retry", self.retry),
            ("call_timeout", self.call_timeout),
            ("heartbeat_timeout", self.heartbeat_timeout),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                return Err(ValidationError::new(name, "must be more than 0"));
            }
        }
        if self.renew_deadline >= self.lease {
            return Err(ValidationError::new(
                "renew_deadline",
                format!(
                    "must be shorter than the lease ({} ms): a leader must stop before its lease can expire",
                    self.lease.as_millis()
                ),
            ));
        }
        if self.renew_deadline + self.stop_grace > self.lease {
            return Err(ValidationError::new(
                "stop_grace",
                format!(
                    "renew_deadline + stop_grace must not exceed the lease ({} ms): a stuck leader must be gone before its lease can expire",
                    self.lease.as_millis()
                ),
            ));
        }
        if self.renew_interval >= self.renew_deadline {
            return Err(ValidationError::new(
                "renew_interval",
                "must be shorter than renew_deadline, or one slow renewal ends the term",
            ));
        }
        if self.renew_retry > self.renew_interval {
            return Err(ValidationError::new(
                "renew_retry",
                "must not exceed renew_interval",
            ));
        }
        if self.call_timeout >= self.renew_deadline {
            return Err(ValidationError::new(
                "call_timeout",
                "must be shorter than renew_deadline",
            ));
        }
        if !(0.0..=1.0).contains(&self.retry_jitter) {
            return Err(ValidationError::new(
                "retry_jitter",
                "must be between 0 and 1",
            ));
        }
        Ok(())
    }

    /// The blob service's rule on top: a lease of 15 to 60 whole seconds.
    pub fn validate_for_blob(&self) -> Result<(), ValidationError> {
        self.validate()?;
        let ms = self.lease.as_millis();
        if !(15_000..=60_000).contains(&ms) || !ms.is_multiple_of(1000) {
            return Err(ValidationError::new(
                "lease",
                format!("a blob lease lasts 15 to 60 whole seconds, not {ms} ms"),
            ));
        }
        Ok(())
    }

    fn retry_delay(&self) -> Duration {
        let jitter = self.retry_jitter * rand::random::<f64>();
        self.retry.mul_f64(1.0 + jitter)
    }
}

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
        }
    }

    /// One attempt: the lease, then the term. `None` while following.
    async fn acquire(&self, span: &tracing::Span) -> Option<(LeaderFence, Instant)> {
        let sent = Instant::now();
        let fence = match timeout(self.timing.call_timeout, self.lease.try_acquire()).await {
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
            Ok(Err(e @ LeaseError::Misconfigured(_))) => {
                tracing::error!(parent: span, error = %e, "acquiring the lease is refused: check the lease settings and credentials; will retry");
                return None;
            }
            Ok(Err(e)) => {
                tracing::warn!(parent: span, error = %e, "acquiring the lease failed; will retry");
                return None;
            }
            Err(_) => {
                tracing::warn!(parent: span, timeout_ms = self.timing.call_timeout.as_millis() as u64, "acquiring the lease timed out; will retry");
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

#[cfg(test)]
mod tests;
