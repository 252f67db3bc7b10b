//! Remote services' health, shared by the whole fleet through the state store, so a
//! service that is down pauses only the orders that need it.
//!
//! Each agent queue stands for one remote service. When an agent sees its service fail
//! past its circuit breaker's threshold it reports the service [`ServiceState::Down`]
//! in the store ([`ServiceStore::report_failure`]). From then on, fleet-wide:
//! - schedulers send no request to that service: an order about to need it is
//!   *parked* instead ([`Park`]): Pending, unlocked, no deadline, held until the service
//!   is back, its FailureCount untouched, with a `Waiting` entry in its history;
//! - agents answer requests for it at once with a `Deferred` reply (no call), which
//!   parks the order the same way;
//! - the supervisor parks an expired order that was waiting for it instead of counting
//!   a timeout;
//! - orders whose next step is on another service keep flowing.
//!
//! A probe decides when it is back: once `retry_at` passes, one scheduler moves the
//! service to [`ServiceState::Probing`] and lets the oldest waiting order through
//! ([`ServiceStore::release_probe`]). An answer from the service (success or a
//! permanent refusal) makes it [`ServiceState::Up`] ([`ServiceStore::report_success`]),
//! and its waiting orders become claimable again gradually, at most
//! `resume_per_second` a second, oldest first; a failure makes it Down again, with the
//! wait before the next probe doubled (up to [`OutagePolicy::probe_max`]).
//!
//! Each outage raises one alert when it starts and one when it ends (the supervisor
//! publishes them), not one per order.
//!
//! The decisions are made here, once; the SQL store only applies them.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::id::{InstanceId, OrderId};
use crate::state::{Fence, ProcessState};
use crate::validation::ValidationError;

/// `next_attempt_at` of an order parked until its service is back: never claimable by
/// time alone (it is set to a real time when the service recovers).
pub fn held() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(9999, 12, 31, 0, 0, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Whether `next_attempt_at` means "held until its service is back".
pub fn is_held(next_attempt_at: DateTime<Utc>) -> bool {
    next_attempt_at >= held()
}

impl crate::state::StateRow {
    /// What an operator should read about an order waiting for a remote service:
    /// `waiting: agent.payment down since 10:32:05 UTC` while it is held, or that it
    /// resumes after the outage once the service is back (`None`: not waiting).
    pub fn waiting_note(
        &self,
        services: &std::collections::HashMap<String, ServiceHealth>,
    ) -> Option<String> {
        let service = self.waiting_on.as_deref()?;
        if self.process_state != ProcessState::Pending {
            return None;
        }
        if is_held(self.next_attempt_at) {
            Some(match services.get(service) {
                Some(h) => format!("waiting: {}", h.describe()),
                None => format!("waiting: {service} down"),
            })
        } else {
            Some(format!(
                "resuming after the {service} outage (claimable from {})",
                self.next_attempt_at.format("%H:%M:%S%.3f UTC")
            ))
        }
    }
}

/// A remote service's state, as the fleet sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceState {
    /// Answering: requests are sent.
    Up,
    /// Failing past the threshold: no request is sent until a probe is due.
    Down,
    /// A probe is out: only the orders released as probes are sent.
    Probing,
}

impl ServiceState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceState::Up => "Up",
            ServiceState::Down => "Down",
            ServiceState::Probing => "Probing",
        }
    }
}

impl std::str::FromStr for ServiceState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "Up" => Ok(ServiceState::Up),
            "Down" => Ok(ServiceState::Down),
            "Probing" => Ok(ServiceState::Probing),
            other => Err(format!("unknown service state {other:?}")),
        }
    }
}

impl std::fmt::Display for ServiceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long a probe's verdict is waited for before another order is let through (its
/// agent may have died with it).
pub const PROBE_WAIT: Duration = Duration::from_secs(15);

/// How an outage is handled: set by the agents that report it (each agent deployment
/// wraps its services, so this is configured per service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutagePolicy {
    /// Wait between the outage's start and the first probe.
    pub probe_after: Duration,
    /// Longest wait between probes (the wait doubles after each failed probe).
    pub probe_max: Duration,
    /// Waiting orders made claimable again per second once the service is back.
    pub resume_per_second: u32,
}

impl Default for OutagePolicy {
    fn default() -> Self {
        Self {
            probe_after: Duration::from_secs(5),
            probe_max: Duration::from_secs(60),
            resume_per_second: 200,
        }
    }
}

impl OutagePolicy {
    /// Refuses a policy that cannot work; the error names the setting.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.probe_after.is_zero() || self.probe_after > Duration::from_secs(3600) {
            return Err(ValidationError::new(
                "probe_after",
                "must be more than 0 and at most 1 hour",
            ));
        }
        if self.probe_max < self.probe_after || self.probe_max > Duration::from_secs(3600) {
            return Err(ValidationError::new(
                "probe_max",
                "must be at least probe_after and at most 1 hour",
            ));
        }
        if !(1..=100_000).contains(&self.resume_per_second) {
            return Err(ValidationError::new(
                "resume_per_second",
                "must be 1 to 100000",
            ));
        }
        Ok(())
    }

    /// The wait before the next probe after `failed_probes` probes failed.
    pub fn probe_wait(&self, failed_probes: i32) -> Duration {
        let doublings = failed_probes.clamp(0, 20) as u32;
        self.probe_after
            .saturating_mul(1 << doublings)
            .min(self.probe_max)
    }
}

/// One remote service's health row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceHealth {
    /// The service: its agent queue's name.
    pub service: String,
    /// Up, Down or Probing.
    pub state: ServiceState,
    /// When the current (or last) outage began.
    pub down_since: Option<DateTime<Utc>>,
    /// While Down: when a probe may go; while Probing: when another may go if this one
    /// has no verdict.
    pub retry_at: Option<DateTime<Utc>>,
    /// Probes that failed in this outage.
    pub probes: i32,
    /// Outages so far; while not Up, the current one's number.
    pub outage: i32,
    /// The last outage whose start was published as an alert.
    pub alerted: i32,
    /// The last outage whose end was published.
    pub resolved: i32,
    /// The failure that opened (or last extended) the outage.
    pub last_error: Option<String>,
    /// Who reported the last change.
    pub reported_by: Option<String>,
    /// How fast waiting orders resume once it is back.
    pub resume_per_second: i32,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
    /// Orders parked until it is back (counted when read; not stored).
    pub waiting: i64,
}

/// What a failure report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The row now.
    pub health: ServiceHealth,
    /// Whether this report began an outage (an Up service went Down).
    pub began: bool,
}

/// What a success report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The row now (Up).
    pub health: ServiceHealth,
    /// Orders made claimable again, gradually.
    pub resumed: u64,
    /// When the last of them becomes claimable.
    pub last_at: Option<DateTime<Utc>>,
}

impl ServiceHealth {
    /// A new row for `service`: Up, never down.
    pub fn up(service: &str, now: DateTime<Utc>) -> Self {
        Self {
            service: service.to_owned(),
            state: ServiceState::Up,
            down_since: None,
            retry_at: None,
            probes: 0,
            outage: 0,
            alerted: 0,
            resolved: 0,
            last_error: None,
            reported_by: None,
            resume_per_second: OutagePolicy::default().resume_per_second as i32,
            updated_at: now,
            waiting: 0,
        }
    }

    /// The row after an agent reports the service failing past its threshold: an Up
    /// service goes Down (a new outage; first probe after `probe_after`); a probe's
    /// failure makes it Down again with the wait doubled; a Down one only notes the
    /// error (its next probe stays when it was).
    pub fn after_failure(
        &self,
        now: DateTime<Utc>,
        error: &str,
        by: &str,
        policy: &OutagePolicy,
    ) -> Reported {
        let mut next = self.clone();
        next.last_error = Some(crate::validation::bounded_text(error).to_owned());
        next.reported_by = Some(by.to_owned());
        next.updated_at = now;
        next.resume_per_second = i32::try_from(policy.resume_per_second).unwrap_or(i32::MAX);
        let at = |wait: Duration| now + chrono::Duration::from_std(wait).unwrap_or_default();
        let began = match self.state {
            ServiceState::Up => {
                next.state = ServiceState::Down;
                next.down_since = Some(now);
                next.probes = 0;
                next.outage = self.outage.saturating_add(1);
                next.retry_at = Some(at(policy.probe_wait(0)));
                true
            }
            ServiceState::Probing => {
                next.state = ServiceState::Down;
                next.probes = self.probes.saturating_add(1);
                next.retry_at = Some(at(policy.probe_wait(next.probes)));
                false
            }
            ServiceState::Down => false,
        };
        Reported {
            health: next,
            began,
        }
    }

    /// The row after an answer from the service: Up (`None` if it was Up already).
    pub fn after_success(&self, now: DateTime<Utc>, by: &str) -> Option<ServiceHealth> {
        if self.state == ServiceState::Up {
            return None;
        }
        let mut next = self.clone();
        next.state = ServiceState::Up;
        next.retry_at = None;
        next.probes = 0;
        next.reported_by = Some(by.to_owned());
        next.updated_at = now;
        Some(next)
    }

    /// Whether a probe may go now (Down or Probing, and `retry_at` has come).
    pub fn probe_due(&self, now: DateTime<Utc>) -> bool {
        self.state != ServiceState::Up && self.retry_at.is_some_and(|at| at <= now)
    }

    /// The row once a probe is let through at `now`.
    pub fn probing(&self, now: DateTime<Utc>, by: &str) -> ServiceHealth {
        let mut next = self.clone();
        next.state = ServiceState::Probing;
        next.retry_at = Some(now + chrono::Duration::from_std(PROBE_WAIT).unwrap_or_default());
        next.reported_by = Some(by.to_owned());
        next.updated_at = now;
        next
    }

    /// Whether a request for this service may not be sent at `now`. `probe`: the order
    /// waited for this service, so it was let through as its probe (a view read before
    /// the probe was let through still shows Down, with the probe due).
    pub fn blocks(&self, probe: bool, now: DateTime<Utc>) -> bool {
        match self.state {
            ServiceState::Up => false,
            ServiceState::Down => !(probe && self.probe_due(now)),
            ServiceState::Probing => !probe,
        }
    }

    /// What operators read: `payment down since 10:32:05` (the time in UTC).
    pub fn describe(&self) -> String {
        let since = self
            .down_since
            .map(|t| t.format("%H:%M:%S UTC").to_string())
            .unwrap_or_else(|| "?".into());
        match self.state {
            ServiceState::Up => format!("{} up", self.service),
            ServiceState::Down => format!("{} down since {since}", self.service),
            ServiceState::Probing => {
                format!("{} down since {since} (probing)", self.service)
            }
        }
    }

    /// Why an order waits for this service, for its history and last-step note.
    pub fn waiting_reason(&self) -> String {
        match &self.last_error {
            Some(e) => format!(
                "waiting: {} ({e}); not counted as a failure",
                self.describe()
            ),
            None => format!("waiting: {}; not counted as a failure", self.describe()),
        }
    }
}

/// When each of `count` waiting orders becomes claimable again, oldest first, at most
/// `per_second` a second from `now`: as `(how many, at)` groups of a tenth of a second.
pub fn resume_schedule(
    now: DateTime<Utc>,
    count: usize,
    per_second: u32,
) -> Vec<(usize, DateTime<Utc>)> {
    let per_tick = (per_second as usize).div_ceil(10).max(1);
    let mut out = Vec::with_capacity(count.div_ceil(per_tick));
    let mut left = count;
    let mut tick = 0i64;
    while left > 0 {
        let n = left.min(per_tick);
        out.push((n, now + chrono::Duration::milliseconds(100 * tick)));
        left -= n;
        tick += 1;
    }
    out
}

/// An order to park until `service` is back: the owner gives it up without it counting
/// as a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Park {
    /// The owner's proof.
    pub fence: Fence,
    /// Refuse unless the order is at this step (`None`: any, while undoing).
    pub expect_step: Option<i32>,
    /// The service it waits for (an agent queue's name).
    pub service: String,
    /// Why, for its history.
    pub reason: String,
}

/// What parking did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// Pending, held until the service is back.
    Held,
    /// The service was up again by the time it was written: Pending and claimable at
    /// once (still not counted as a failure).
    Released,
}

/// The services' health in the store: agents report, schedulers and the supervisor
/// read and act, operators look and override.
#[async_trait]
pub trait ServiceStore: Send + Sync {
    /// Every service with a health row (one that was ever reported), with how many
    /// orders wait for it.
    async fn services(&self) -> Result<Vec<ServiceHealth>>;

    /// `by` saw `service` fail past its threshold with `error`: see
    /// [`ServiceHealth::after_failure`]. Concurrent reports of one outage begin it once.
    async fn report_failure(
        &self,
        service: &str,
        error: &str,
        by: &InstanceId,
        policy: &OutagePolicy,
    ) -> Result<Reported>;

    /// `by` got an answer from `service`: if it was not Up, it is now, and the orders
    /// waiting for it become claimable again, oldest first, at its resume rate (`None`:
    /// it was Up already, nothing changed).
    async fn report_success(&self, service: &str, by: &str) -> Result<Option<Restored>>;

    /// If a probe of `service` is due, moves it to Probing and makes its oldest waiting
    /// order claimable now (the probe). Of callers racing on one due probe, one wins;
    /// the others get `None`, as does a call when none is due. `Some(None)`: the probe
    /// is let through but no order waits (the next order to need it is the probe).
    async fn release_probe(&self, service: &str, by: &str) -> Result<Option<Option<OrderId>>>;

    /// Orders waiting for `service` although it is Up (parked in a race with its
    /// recovery) become claimable again at its resume rate. Returns how many.
    async fn resume_waiting(&self, service: &str, by: &str) -> Result<u64>;

    /// Waits until the services' rows may have been written since `*seen` (a count
    /// this updates; 0 at first), or `longest` passes. A store that hears every such
    /// write (this process's, and other processes' while it hears them) waits up to
    /// `longest`; one that does not, or whose clock is injected, `poll`. This default
    /// hears nothing.
    async fn services_written(&self, seen: &mut u64, poll: Duration, longest: Duration) {
        let _ = (seen, longest);
        tokio::time::sleep(poll).await;
    }

    /// Publishes the start (`ended = false`) or the end of outage number `outage` of
    /// `service`: marks it published and enqueues `sends` (the alert) in one
    /// transaction, refused ([`crate::Error::Deposed`]) unless `leader`'s term is the
    /// current one. `false`: it was published already (nothing sent), so each outage
    /// is announced once however many supervisors lead in turn.
    async fn mark_outage_published(
        &self,
        leader: &crate::leader::LeaderFence,
        service: &str,
        outage: i32,
        ended: bool,
        sends: &[crate::transport::Envelope],
    ) -> Result<bool>;
}

/// The announcement of an outage's start or end, published once each to the alerts
/// queue (and the webhook) by the leading supervisor: one per outage, not one per
/// order that waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAlert {
    /// `service_down` or `service_up`.
    pub kind: String,
    /// The service (its agent queue).
    pub service: String,
    /// The outage's number for this service.
    pub outage: i32,
    /// When it began.
    pub down_since: Option<DateTime<Utc>>,
    /// When it ended (for `service_up`).
    pub up_at: Option<DateTime<Utc>>,
    /// The failure that began it (or the latest one).
    pub last_error: Option<String>,
    /// Orders waiting for it when this was published.
    pub waiting: i64,
}

impl ServiceAlert {
    /// The announcements `health` still owes: its outage's start if not yet published,
    /// and its end once it is up again.
    pub fn owed(health: &ServiceHealth) -> Vec<ServiceAlert> {
        let mut out = Vec::new();
        let alert = |kind: &str, up_at| ServiceAlert {
            kind: kind.to_owned(),
            service: health.service.clone(),
            outage: health.outage,
            down_since: health.down_since,
            up_at,
            last_error: health.last_error.clone(),
            waiting: health.waiting,
        };
        if health.outage > health.alerted {
            out.push(alert("service_down", None));
        }
        if health.state == ServiceState::Up && health.outage > health.resolved {
            out.push(alert("service_up", Some(health.updated_at)));
        }
        out
    }

    /// Whether this announces the end of the outage.
    pub fn ended(&self) -> bool {
        self.kind == "service_up"
    }

    /// The message id: one per outage and kind, so a repeat is dropped by the queue.
    pub fn message_id(&self) -> String {
        format!("outage:{}:{}:{}", self.service, self.outage, self.kind)
    }
}

/// The longest a view waits before reading the services again while the store hears
/// every write to them: a safety net, for a wake-up that was lost or a write by a
/// version that sends none.
pub const SERVICES_SAFETY_POLL: Duration = Duration::from_secs(30);

/// How long a view of `services` may go unread at `now` while every write to them is
/// heard: until the next probe of a service that is down comes due, at most
/// [`SERVICES_SAFETY_POLL`]; `poll` while one is due and not yet let through.
fn quiet_for<'a>(
    services: impl IntoIterator<Item = &'a ServiceHealth>,
    poll: Duration,
    now: DateTime<Utc>,
) -> Duration {
    let next_probe = services
        .into_iter()
        .filter(|h| h.state != ServiceState::Up)
        .filter_map(|h| h.retry_at)
        .min();
    match next_probe {
        None => SERVICES_SAFETY_POLL,
        Some(at) => match (at - now).to_std() {
            Ok(until) if !until.is_zero() => until.min(SERVICES_SAFETY_POLL),
            _ => poll,
        },
    }
}

/// One process's copy of the fleet's view of its services, read from the store when
/// they were written ([`ServiceView::wait_for_news`], [`ServiceView::refresh`]) and
/// updated at once by what this process itself reports. Reading it costs no round trip: it is what schedulers consult before each
/// request they send, and agents before each call.
pub struct ServiceView {
    store: std::sync::Arc<dyn ServiceStore>,
    current: std::sync::RwLock<std::sync::Arc<std::collections::HashMap<String, ServiceHealth>>>,
}

impl std::fmt::Debug for ServiceView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceView")
            .field("services", &self.snapshot().len())
            .finish()
    }
}

impl ServiceView {
    /// A view of `store`'s services, empty (every service Up) until refreshed.
    pub fn new(store: std::sync::Arc<dyn ServiceStore>) -> Self {
        Self {
            store,
            current: std::sync::RwLock::default(),
        }
    }

    /// The store the view reads (and reports go to).
    pub fn store(&self) -> &std::sync::Arc<dyn ServiceStore> {
        &self.store
    }

    /// Reads every service's row again.
    pub async fn refresh(&self) -> Result<()> {
        let rows = self.store.services().await?;
        let map = rows.into_iter().map(|h| (h.service.clone(), h)).collect();
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = std::sync::Arc::new(map);
        Ok(())
    }

    /// Waits until the view should be read again: a write to the services since
    /// `*seen` (a count this updates; 0 at first), the next probe of a service that is
    /// down coming due at `now`'s clock, or [`SERVICES_SAFETY_POLL`]. Where the store
    /// does not hear the writes (or its clock is injected), `poll`; while a probe is
    /// due and not yet let through, `poll` too. Before, every view was read every
    /// `poll` (each agent every second, each scheduler twice a second) whether or not
    /// anything had changed.
    pub async fn wait_for_news(&self, seen: &mut u64, poll: Duration, now: DateTime<Utc>) {
        let longest = quiet_for(self.snapshot().values(), poll, now);
        self.store.services_written(seen, poll, longest).await;
    }

    /// Every service as last read.
    pub fn snapshot(&self) -> std::sync::Arc<std::collections::HashMap<String, ServiceHealth>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `service` as last read (`None`: never reported, so Up).
    pub fn get(&self, service: &str) -> Option<ServiceHealth> {
        self.snapshot().get(service).cloned()
    }

    /// Whether a request for `service` may not be sent at `now` (see
    /// [`ServiceHealth::blocks`]).
    pub fn blocks(&self, service: &str, probe: bool, now: DateTime<Utc>) -> bool {
        self.snapshot()
            .get(service)
            .is_some_and(|h| h.blocks(probe, now))
    }

    /// Takes in a row this process just wrote, without waiting for the next refresh.
    pub fn learn(&self, health: ServiceHealth) {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut map = (**current).clone();
        map.insert(health.service.clone(), health);
        *current = std::sync::Arc::new(map);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0).single().unwrap()
    }

    fn policy() -> OutagePolicy {
        OutagePolicy {
            probe_after: Duration::from_secs(5),
            probe_max: Duration::from_secs(30),
            resume_per_second: 100,
        }
    }

    #[test]
    fn a_failure_of_an_up_service_begins_an_outage_and_schedules_the_first_probe() {
        let up = ServiceHealth::up("payment", at(0));
        let r = up.after_failure(at(10), "503", "agent-1", &policy());
        assert!(r.began);
        assert_eq!(r.health.state, ServiceState::Down);
        assert_eq!(r.health.down_since, Some(at(10)));
        assert_eq!(r.health.retry_at, Some(at(15)));
        assert_eq!(r.health.outage, 1);
        assert!(r.health.blocks(false, at(10)) && r.health.blocks(true, at(14)));
        assert!(
            !r.health.blocks(true, at(15)) && r.health.blocks(false, at(15)),
            "once the probe is due, an order that waited for it may be the probe"
        );
        // Reported again while down: the same outage, the probe not pushed back.
        let again = r
            .health
            .after_failure(at(12), "timeout", "agent-2", &policy());
        assert!(!again.began);
        assert_eq!(again.health.outage, 1);
        assert_eq!(again.health.retry_at, Some(at(15)));
        assert_eq!(again.health.last_error.as_deref(), Some("timeout"));
    }

    #[test]
    fn a_view_goes_unread_until_the_next_probe_is_due_at_most_its_safety_poll() {
        let poll = Duration::from_millis(500);
        let up = ServiceHealth::up("inventory", at(0));
        assert_eq!(quiet_for([&up], poll, at(0)), SERVICES_SAFETY_POLL);
        // Down at 10, its probe due at 15: read again then.
        let down = up.after_failure(at(10), "503", "agent-1", &policy()).health;
        assert_eq!(
            quiet_for([&up, &down], poll, at(11)),
            Duration::from_secs(4)
        );
        // Due and not yet let through: the poll, until a scheduler lets it through.
        assert_eq!(quiet_for([&down], poll, at(15)), poll);
        assert_eq!(quiet_for([&down], poll, at(16)), poll);
        // Probing: read again when the probe would be given up on.
        let probing = down.probing(at(15), "scheduler-1");
        assert_eq!(quiet_for([&probing], poll, at(15)), PROBE_WAIT);
        // A probe far off: the safety poll.
        let mut later = down.clone();
        later.retry_at = Some(at(600));
        assert_eq!(quiet_for([&later], poll, at(11)), SERVICES_SAFETY_POLL);
    }

    #[test]
    fn each_failed_probe_doubles_the_wait_up_to_the_maximum() {
        let mut h = ServiceHealth::up("payment", at(0))
            .after_failure(at(0), "503", "a", &policy())
            .health;
        let mut waits = Vec::new();
        let mut now = 0;
        for _ in 0..4 {
            now = (h.retry_at.unwrap() - at(0)).num_seconds();
            assert!(h.probe_due(at(now)) && !h.probe_due(at(now - 1)));
            h = h.probing(at(now), "s");
            assert!(
                !h.blocks(true, at(now)) && h.blocks(false, at(now)),
                "only the probe goes"
            );
            h = h.after_failure(at(now), "503", "a", &policy()).health;
            waits.push((h.retry_at.unwrap() - at(now)).num_seconds());
        }
        assert_eq!(waits, vec![10, 20, 30, 30]);
        assert_eq!(h.outage, 1, "one outage however many probes fail");
        let up = h.after_success(at(now + 1), "a").unwrap();
        assert_eq!(up.state, ServiceState::Up);
        assert_eq!(up.probes, 0);
        assert!(up.after_success(at(now + 2), "a").is_none());
        assert!(!up.blocks(false, at(now + 1)));
        // The next failure is a new outage.
        assert_eq!(
            up.after_failure(at(now + 3), "x", "a", &policy())
                .health
                .outage,
            2
        );
    }

    #[test]
    fn waiting_orders_resume_oldest_first_at_the_rate() {
        let s = resume_schedule(at(0), 45, 100);
        assert_eq!(s.iter().map(|(n, _)| n).sum::<usize>(), 45);
        assert_eq!(s[0], (10, at(0)));
        assert_eq!(s[4].0, 5);
        assert_eq!(
            s[4].1,
            at(0) + chrono::Duration::milliseconds(400),
            "45 orders at 100/s take under half a second"
        );
        assert_eq!(resume_schedule(at(0), 3, 1).len(), 3);
        assert!(resume_schedule(at(0), 0, 100).is_empty());
    }

    #[test]
    fn a_policy_that_cannot_work_is_refused_naming_the_setting() {
        let bad = OutagePolicy {
            probe_after: Duration::ZERO,
            ..policy()
        };
        assert_eq!(bad.validate().unwrap_err().field, "probe_after");
        let bad = OutagePolicy {
            probe_max: Duration::from_secs(1),
            ..policy()
        };
        assert_eq!(bad.validate().unwrap_err().field, "probe_max");
        let bad = OutagePolicy {
            resume_per_second: 0,
            ..policy()
        };
        assert_eq!(bad.validate().unwrap_err().field, "resume_per_second");
        assert!(policy().validate().is_ok());
    }

    #[test]
    fn held_orders_are_recognised() {
        assert!(is_held(held()));
        assert!(!is_held(at(0)));
    }
}
