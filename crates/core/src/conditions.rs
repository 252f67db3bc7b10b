//! Alerts about the system rather than one order: the oldest Pending order waiting too
//! long, a queue's dead letters growing, no supervisor leading, a remote service down.
//! Each is an *episode*: raised once when its condition begins and resolved once when
//! it ends (not once per sweep, nor once per order), and goes to the same channels as an
//! order's alert: the `system_alerts` table, the alerts queue (in the same transaction),
//! the log and the webhook.
//!
//! Which conditions hold is decided here from what the store reports; the store only
//! records and publishes the episodes.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::transport::Envelope;

/// What a system alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConditionKind {
    /// The oldest Pending order (not one waiting for a service that is down) has waited
    /// longer than the threshold: nothing is claiming orders.
    PendingTooOld,
    /// A queue's dead letters grew: messages that could not be processed.
    DeadLetters,
    /// No supervisor has led for longer than a lease: timed-out orders are not recovered.
    NoLeader,
    /// A remote service is down (see `crate::service`).
    ServiceDown,
    /// Pending orders are pinned to a workflow version no scheduler can run: it is not
    /// stored, or its stored definition does not check (subject: `name@version`, or
    /// the workflow's name for orders not started yet).
    WorkflowMissing,
}

impl ConditionKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionKind::PendingTooOld => "pending_too_old",
            ConditionKind::DeadLetters => "dead_letters",
            ConditionKind::NoLeader => "no_leader",
            ConditionKind::ServiceDown => "service_down",
            ConditionKind::WorkflowMissing => "workflow_missing",
        }
    }
}

impl std::str::FromStr for ConditionKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            ConditionKind::PendingTooOld,
            ConditionKind::DeadLetters,
            ConditionKind::NoLeader,
            ConditionKind::ServiceDown,
            ConditionKind::WorkflowMissing,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("unknown condition {s:?}"))
    }
}

/// A condition that holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// What it is about.
    pub kind: ConditionKind,
    /// Which one: the queue, the service, the leadership, or `orders`.
    pub subject: String,
    /// What an operator reads.
    pub detail: String,
}

/// One episode of a condition, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemAlert {
    /// Its number.
    pub alert_id: i64,
    /// What it is about.
    pub kind: ConditionKind,
    /// Which one.
    pub subject: String,
    /// What was seen when it was raised.
    pub detail: String,
    /// When it began.
    pub raised_at: DateTime<Utc>,
    /// Who raised it.
    pub raised_by: String,
    /// When it ended (`None`: it holds still).
    pub resolved_at: Option<DateTime<Utc>>,
    /// The operator who acknowledged it ("seen, being handled"), if one did.
    #[serde(default)]
    pub acknowledged_by: Option<String>,
    /// When they did.
    #[serde(default)]
    pub acknowledged_at: Option<DateTime<Utc>>,
}

/// What goes on the alerts queue when an episode begins or ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionNotice {
    /// `raised` or `resolved`.
    pub event: String,
    /// The episode.
    pub alert: SystemAlert,
}

impl ConditionNotice {
    /// The message id: one per episode and event.
    pub fn message_id(&self) -> String {
        format!("cond:{}:{}", self.alert.alert_id, self.event)
    }
}

/// Recording and publishing episodes.
#[async_trait]
pub trait ConditionStore: Send + Sync {
    /// Raises `condition` unless an episode of its kind and subject is open: records it
    /// and enqueues what `sends` makes of it, in one transaction. `None`: one is open
    /// already (nothing sent).
    async fn raise(
        &self,
        condition: &Condition,
        by: &str,
        sends: &(dyn for<'a> Fn(&'a SystemAlert) -> Vec<Envelope> + Send + Sync),
    ) -> Result<Option<SystemAlert>>;

    /// Ends the open episode of `kind` for `subject`, if there is one, enqueueing what
    /// `sends` makes of it in the same transaction. `None`: none was open.
    async fn resolve(
        &self,
        kind: ConditionKind,
        subject: &str,
        sends: &(dyn for<'a> Fn(&'a SystemAlert) -> Vec<Envelope> + Send + Sync),
    ) -> Result<Option<SystemAlert>>;

    /// Episodes, newest first: the open ones only, or all.
    async fn system_alerts(&self, open_only: bool, limit: u32) -> Result<Vec<SystemAlert>>;

    /// Records that `by` acknowledged episode `alert_id` (the first acknowledgement
    /// stays: acknowledging again changes nothing); the episode stays open until its
    /// condition ends. Returns it as it is now (`None`: no such episode).
    async fn acknowledge_system_alert(
        &self,
        alert_id: i64,
        by: &crate::Actor,
    ) -> Result<Option<SystemAlert>>;

    /// The oldest Pending order that is not waiting for a service that is down (its id
    /// and when it was created), and the store's now.
    async fn oldest_pending(
        &self,
    ) -> Result<(Option<(crate::OrderId, DateTime<Utc>)>, DateTime<Utc>)>;

    /// Dead letters per queue of the SQL queues (empty on a store that holds none).
    async fn dead_letter_counts(&self) -> Result<Vec<(String, i64)>>;

    /// The live orders by workflow version, and every stored workflow version (see
    /// [`workflows_missing`]).
    async fn workflow_catalogue(
        &self,
    ) -> Result<(
        Vec<crate::workflow::WorkflowCount>,
        Vec<crate::workflow::StoredWorkflow>,
    )>;

    /// Records that `instance` of `role` runs (leading or not) at the store's now.
    async fn heartbeat(&self, role: &str, instance: &str, leading: bool) -> Result<()>;

    /// Forgets `instance` of `role` (it stopped cleanly).
    async fn leave(&self, role: &str, instance: &str) -> Result<()>;

    /// The instances of `role` seen within `within`, with whether each leads and when it
    /// was last seen (the store's clock), and the store's now.
    async fn presence(
        &self,
        role: &str,
        within: Duration,
    ) -> Result<(Vec<Presence>, DateTime<Utc>)>;
}

/// An instance of a role, as last seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    /// The instance.
    pub instance: String,
    /// Whether it said it leads.
    pub leading: bool,
    /// When it was last seen.
    pub seen_at: DateTime<Utc>,
}

/// When the oldest Pending order is a problem: older than `threshold`.
pub fn pending_too_old(
    oldest: Option<&(crate::OrderId, DateTime<Utc>)>,
    now: DateTime<Utc>,
    threshold: Duration,
) -> Option<Condition> {
    let (id, created) = oldest?;
    let waited = (now - *created).to_std().unwrap_or_default();
    (waited > threshold).then(|| Condition {
        kind: ConditionKind::PendingTooOld,
        subject: "orders".into(),
        detail: format!(
            "the oldest Pending order {id} has waited {} s (threshold {} s): are the schedulers running and able to claim?",
            waited.as_secs(),
            threshold.as_secs()
        ),
    })
}

/// Pending orders no scheduler can run, one condition per workflow version: pinned to a
/// version that is not stored, or whose stored definition does not check; or, not
/// started yet, asking for a workflow of which no version was ever stored (no
/// scheduler ever ran it). Orders of the schedulers' default (no workflow named) are
/// never in doubt.
pub fn workflows_missing(
    live: &[crate::workflow::WorkflowCount],
    stored: &[crate::workflow::StoredWorkflow],
) -> Vec<Condition> {
    let mut out: Vec<Condition> = Vec::new();
    for c in live
        .iter()
        .filter(|c| c.state == crate::ProcessState::Pending)
    {
        let Some(name) = c.workflow.as_deref() else {
            continue;
        };
        let why = match c.version.as_deref() {
            Some(version) => match stored
                .iter()
                .find(|s| s.reference.name == name && s.reference.version == version)
            {
                None => Some("is not stored".to_owned()),
                Some(s) => s
                    .workflow()
                    .err()
                    .map(|e| format!("has a stored definition that does not check ({e})")),
            },
            None if stored.iter().any(|s| s.reference.name == name) => None,
            None => Some("has no stored version: no scheduler ever ran it".to_owned()),
        };
        if let Some(why) = why {
            let subject = c.label();
            out.push(Condition {
                kind: ConditionKind::WorkflowMissing,
                detail: format!(
                    "{} Pending orders wait for workflow {subject}, which {why}: no scheduler can run them. \
                     `orderly migrate --workflow FILE` with its file stores it (any scheduler then runs them), \
                     or cancel them (`orderly cancel --all --state Pending`)",
                    c.orders
                ),
                subject,
            });
        }
    }
    out
}

/// Queues whose dead letters grew since `before` (the counts of the previous look).
pub fn dead_letters_grew(before: &[(String, i64)], now: &[(String, i64)]) -> Vec<Condition> {
    now.iter()
        .filter_map(|(queue, n)| {
            let was = before
                .iter()
                .find(|(q, _)| q == queue)
                .map_or(0, |(_, n)| *n);
            (*n > was).then(|| Condition {
                kind: ConditionKind::DeadLetters,
                subject: queue.clone(),
                detail: format!(
                    "{n} dead letters on queue {queue} (was {was}): see `orderly dead-letters {queue}`"
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_pending_order_is_a_condition_past_the_threshold() {
        let now = Utc::now();
        let id = crate::OrderId::parse("o-1").unwrap();
        let five = Duration::from_secs(300);
        assert!(pending_too_old(None, now, five).is_none());
        let young = (id.clone(), now - chrono::Duration::seconds(60));
        assert!(pending_too_old(Some(&young), now, five).is_none());
        let old = (id, now - chrono::Duration::seconds(400));
        let c = pending_too_old(Some(&old), now, five).unwrap();
        assert_eq!(c.kind, ConditionKind::PendingTooOld);
        assert!(
            c.detail.contains("o-1") && c.detail.contains("400 s"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn only_queues_whose_dead_letters_grew_are_named() {
        let before = vec![("orders".to_owned(), 2), ("replies".to_owned(), 1)];
        let now = vec![
            ("orders".to_owned(), 2),
            ("replies".to_owned(), 3),
            ("agent.payment".to_owned(), 1),
        ];
        let grew: Vec<String> = dead_letters_grew(&before, &now)
            .into_iter()
            .map(|c| c.subject)
            .collect();
        assert_eq!(grew, vec!["replies", "agent.payment"]);
    }

    #[test]
    fn kinds_read_back_as_written() {
        for k in [
            ConditionKind::PendingTooOld,
            ConditionKind::DeadLetters,
            ConditionKind::NoLeader,
            ConditionKind::ServiceDown,
        ] {
            assert_eq!(k.as_str().parse::<ConditionKind>(), Ok(k));
        }
    }

    /// Pending orders pinned to a version nobody stored, or stored but not checking,
    /// or asking for a workflow never stored, each give one alert; the default's and
    /// stored versions' orders none.
    #[test]
    fn orders_no_scheduler_can_run_are_named_per_workflow_version() {
        use crate::ProcessState;
        use crate::workflow::{StoredWorkflow, WorkflowCount};
        use crate::workflow::{Workflow, WorkflowRef};
        let w = Workflow::default();
        let stored = |r: WorkflowRef, definition: String| StoredWorkflow {
            reference: r,
            definition,
            first_seen_at: Utc::now(),
            first_seen_by: "scheduler-a".into(),
        };
        let bad = WorkflowRef {
            name: "order".into(),
            version: "0123456789ab".into(),
        };
        let catalogue = vec![
            stored(w.reference(), w.to_stored()),
            stored(bad.clone(), w.to_stored()),
        ];
        let live = |workflow: Option<&str>, version: Option<&str>, state, orders| WorkflowCount {
            workflow: workflow.map(str::to_owned),
            version: version.map(str::to_owned),
            state,
            orders,
        };
        let counts = vec![
            live(None, None, ProcessState::Pending, 5),
            live(Some("order"), Some(&w.version()), ProcessState::Pending, 3),
            live(
                Some("order"),
                Some("ffffffffffff"),
                ProcessState::Pending,
                2,
            ),
            live(
                Some("order"),
                Some("ffffffffffff"),
                ProcessState::Processing,
                9,
            ),
            live(Some("order"), Some(&bad.version), ProcessState::Pending, 1),
            live(Some("gift"), None, ProcessState::Pending, 4),
        ];
        let missing = workflows_missing(&counts, &catalogue);
        let subjects: Vec<&str> = missing.iter().map(|c| c.subject.as_str()).collect();
        assert_eq!(
            subjects,
            ["order@ffffffffffff", "order@0123456789ab", "gift"]
        );
        assert!(
            missing[0].detail.starts_with("2 Pending orders"),
            "{}",
            missing[0].detail
        );
        assert!(missing[0].detail.contains("is not stored"));
        assert!(missing[1].detail.contains("does not check"));
        assert!(missing[2].detail.contains("no scheduler ever ran it"));
        assert!(
            missing
                .iter()
                .all(|c| c.detail.contains("orderly migrate --workflow"))
        );
    }
}
