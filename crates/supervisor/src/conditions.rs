//! The alerts about the system (see `orderly_core::conditions`): the leader watches the
//! oldest Pending order and the queues' dead letters; every supervisor, leading or not,
//! says it runs (so the console tells "no supervisor running" from "leader lost"), and
//! a follower that sees no leader for longer than a lease raises it. Each episode goes
//! to the `system_alerts` table and the alerts queue in one transaction, then to the
//! log and the webhook.

use std::sync::Arc;
use std::time::Duration;

use orderly_core::conditions::{
    Condition, ConditionKind, ConditionNotice, ConditionStore, SystemAlert, dead_letters_grew,
    pending_too_old, workflows_missing,
};
use orderly_core::leader::LeaderStatus;
use orderly_core::messages::json_message;
use orderly_core::transport::Envelope;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::{LEADERSHIP, Supervisor};

/// What the leader remembers between two looks at the conditions.
#[derive(Debug, Default)]
pub struct Watch {
    /// Dead letters per queue at the last look.
    dead: Option<Vec<(String, i64)>>,
}

impl Supervisor {
    /// The alerts queue's messages for an episode's `event`.
    fn notice_sends(
        &self,
        event: &'static str,
    ) -> impl Fn(&SystemAlert) -> Vec<Envelope> + Send + Sync {
        let queue = self.cfg.alerts.clone();
        move |alert: &SystemAlert| {
            let notice = ConditionNotice {
                event: event.to_owned(),
                alert: alert.clone(),
            };
            vec![Envelope {
                queue: queue.clone(),
                message: json_message(notice.message_id(), &notice, None),
            }]
        }
    }

    /// Raises `condition` (once per episode), logging and offering it to the webhook.
    pub(crate) async fn raise(
        &self,
        store: &dyn ConditionStore,
        condition: &Condition,
    ) -> orderly_core::Result<bool> {
        let sends = self.notice_sends("raised");
        let Some(alert) = store
            .raise(condition, self.cfg.instance.as_str(), &sends)
            .await?
        else {
            return Ok(false);
        };
        metrics::counter!("orderly_system_alerts_total", "kind" => alert.kind.as_str())
            .increment(1);
        error!(alert_id = alert.alert_id, kind = alert.kind.as_str(), subject = %alert.subject, detail = %alert.detail, "ALERT: {}", alert.kind.as_str());
        if let Some(webhook) = &self.webhook {
            webhook.offer_notice(crate::webhook::Notice::Condition(ConditionNotice {
                event: "raised".into(),
                alert,
            }));
        }
        Ok(true)
    }

    /// Resolves the open episode of `kind` for `subject`, if any, likewise announced.
    pub(crate) async fn resolve(
        &self,
        store: &dyn ConditionStore,
        kind: ConditionKind,
        subject: &str,
    ) -> orderly_core::Result<bool> {
        let sends = self.notice_sends("resolved");
        let Some(alert) = store.resolve(kind, subject, &sends).await? else {
            return Ok(false);
        };
        warn!(alert_id = alert.alert_id, kind = kind.as_str(), subject = %alert.subject, "ALERT RESOLVED: {}", kind.as_str());
        if let Some(webhook) = &self.webhook {
            webhook.offer_notice(crate::webhook::Notice::Condition(ConditionNotice {
                event: "resolved".into(),
                alert,
            }));
        }
        Ok(true)
    }

    /// The leader's look at the conditions: the oldest Pending order, the queues' dead
    /// letters (the first look sets the baseline); and, since it leads, no "no leader"
    /// episode stays open. The leader does this every `conditions_every`.
    pub async fn check_conditions(&self, watch: &mut Watch) -> orderly_core::Result<()> {
        let Some(store) = self.conditions.clone() else {
            return Ok(());
        };
        let store = store.as_ref();
        self.resolve(store, ConditionKind::NoLeader, LEADERSHIP)
            .await?;
        if let Some(threshold) = self.cfg.pending_alert_after {
            let (oldest, now) = store.oldest_pending().await?;
            match pending_too_old(oldest.as_ref(), now, threshold) {
                Some(c) => {
                    self.raise(store, &c).await?;
                }
                None => {
                    self.resolve(store, ConditionKind::PendingTooOld, "orders")
                        .await?;
                }
            }
        }
        let counts = store.dead_letter_counts().await?;
        // The first look after taking over sets the baseline.
        if let Some(before) = &watch.dead {
            for c in dead_letters_grew(before, &counts) {
                self.raise(store, &c).await?;
            }
            for (queue, _) in before.iter().filter(|(q, _)| {
                counts
                    .iter()
                    .find(|(c, _)| c == q)
                    .is_none_or(|(_, n)| *n == 0)
            }) {
                self.resolve(store, ConditionKind::DeadLetters, queue)
                    .await?;
            }
        }
        watch.dead = Some(counts);
        // Orders no scheduler can run: an alert per workflow version, resolved once it is
        // stored (or its orders are gone).
        let (live, stored) = store.workflow_catalogue().await?;
        let missing = workflows_missing(&live, &stored);
        for c in &missing {
            self.raise(store, c).await?;
        }
        for open in store.system_alerts(true, 500).await? {
            if open.kind == ConditionKind::WorkflowMissing
                && !missing.iter().any(|c| c.subject == open.subject)
            {
                self.resolve(store, ConditionKind::WorkflowMissing, &open.subject)
                    .await?;
            }
        }
        Ok(())
    }

    /// Says every `every` that this instance runs (and whether it leads), until
    /// `shutdown`, then that it stopped. While it does not lead and no supervisor has
    /// led for longer than `lease`, it raises "no leader".
    pub(crate) async fn presence(
        &self,
        mut status: watch::Receiver<LeaderStatus>,
        lease: Duration,
        shutdown: CancellationToken,
    ) {
        let Some(store) = self.conditions.clone() else {
            return;
        };
        let me = self.cfg.instance.as_str().to_owned();
        let mut tick = tokio::time::interval(self.cfg.presence_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leader_seen = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
                _ = status.changed() => {}
            }
            let leading = status.borrow().is_leader;
            if let Err(e) = store.heartbeat(LEADERSHIP, &me, leading).await {
                debug!(error = %e, "cannot record this supervisor's presence");
                continue;
            }
            if leading {
                leader_seen = tokio::time::Instant::now();
                continue;
            }
            match store.presence(LEADERSHIP, lease).await {
                Ok((present, _)) if present.iter().any(|p| p.leading) => {
                    leader_seen = tokio::time::Instant::now();
                }
                Ok((present, _)) if leader_seen.elapsed() > lease => {
                    let followers: Vec<&str> =
                        present.iter().map(|p| p.instance.as_str()).collect();
                    let c = Condition {
                        kind: ConditionKind::NoLeader,
                        subject: LEADERSHIP.into(),
                        detail: format!(
                            "no supervisor has led for over {} s (lease {} s): timed-out orders are not recovered; supervisors running: {}",
                            leader_seen.elapsed().as_secs(),
                            lease.as_secs(),
                            followers.join(", ")
                        ),
                    };
                    if let Err(e) = self.raise(store.as_ref(), &c).await {
                        debug!(error = %e, "cannot raise the no-leader alert");
                    }
                }
                Ok(_) => {}
                Err(e) => debug!(error = %e, "cannot read the supervisors' presence"),
            }
        }
        if let Err(e) = store.leave(LEADERSHIP, &me).await {
            debug!(error = %e, "cannot record that this supervisor stopped");
        }
    }
}

/// The store as the conditions' port.
pub(crate) type Conditions = Arc<dyn ConditionStore>;
