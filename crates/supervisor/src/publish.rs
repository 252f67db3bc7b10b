//! What the leader announces: alerts of orders that need an operator (on the alerts
//! queue, a Failed notice to the client, a webhook), and the start and end of remote
//! services' outages; each once, in the fenced transaction that marks it published.

use orderly_core::leader::LeaderFence;
use orderly_core::messages::{OrderStatus, StatusNotice, json_message};
use orderly_core::service::ServiceAlert;
use orderly_core::store::Alert;
use orderly_core::transport::{Envelope, QueueName, TransportError};
use tracing::{error, info_span, warn};

use crate::{Supervisor, webhook};

impl Supervisor {
    /// Announces what remote services' outages still owe (their start, their end):
    /// each once, marked in the same fenced transaction that enqueues it.
    pub async fn publish_outages(&self, leader: &LeaderFence) -> orderly_core::Result<usize> {
        let Some(services) = &self.services else {
            return Ok(0);
        };
        let mut published = 0;
        for health in services.services().await? {
            for alert in ServiceAlert::owed(&health) {
                let message = json_message(alert.message_id(), &alert, None);
                let sends = [Envelope {
                    queue: self.cfg.alerts.clone(),
                    message,
                }];
                if !services
                    .mark_outage_published(
                        leader,
                        &alert.service,
                        alert.outage,
                        alert.ended(),
                        &sends,
                    )
                    .await?
                {
                    continue;
                }
                published += 1;
                metrics::counter!("orderly_service_alerts_total", "kind" => alert.kind.clone())
                    .increment(1);
                if alert.ended() {
                    warn!(service = %alert.service, outage = alert.outage, down_since = ?alert.down_since, up_at = ?alert.up_at, "ALERT RESOLVED: remote service answering again; its waiting orders resume");
                } else {
                    error!(service = %alert.service, outage = alert.outage, down_since = ?alert.down_since, last_error = alert.last_error.as_deref().unwrap_or("-"), waiting = alert.waiting, "ALERT: remote service down; orders that need it wait (not counted as failures)");
                }
                self.record_outage(&alert).await;
                if let Some(webhook) = &self.webhook {
                    webhook.offer_notice(webhook::Notice::Service(alert));
                }
            }
        }
        Ok(published)
    }

    /// Keeps an announced outage in the table of system alerts too, one episode each:
    /// raised when it starts, resolved when it ends. A failure is logged; the outage
    /// was announced all the same.
    async fn record_outage(&self, alert: &ServiceAlert) {
        use orderly_core::conditions::{Condition, ConditionKind, SystemAlert};
        let Some(store) = &self.conditions else {
            return;
        };
        let none = |_: &SystemAlert| Vec::new();
        let recorded = if alert.ended() {
            store
                .resolve(ConditionKind::ServiceDown, &alert.service, &none)
                .await
                .map(|_| ())
        } else {
            let c = Condition {
                kind: ConditionKind::ServiceDown,
                subject: alert.service.clone(),
                detail: format!(
                    "{} down since {}: {}; {} orders wait for it",
                    alert.service,
                    alert.down_since.map(|t| t.to_rfc3339()).unwrap_or_default(),
                    alert.last_error.as_deref().unwrap_or("-"),
                    alert.waiting
                ),
            };
            store
                .raise(&c, self.cfg.instance.as_str(), &none)
                .await
                .map(|_| ())
        };
        if let Err(e) = recorded {
            warn!(error = %e, service = %alert.service, "outage announced but not recorded in system_alerts");
        }
    }

    /// Publishes unpublished alerts: the alerts queue, a `failed` status to the
    /// client, and one structured error event each. At-least-once: a crash between
    /// sending and marking sends again, and the queue drops the repeat by message id.
    pub async fn publish_alerts(
        &self,
        leader: &LeaderFence,
        alive: &(dyn Fn() + Sync),
    ) -> orderly_core::Result<usize> {
        let mut published = 0;
        loop {
            alive();
            let alerts = self.store.unpublished_alerts(self.cfg.batch).await?;
            if alerts.is_empty() {
                return Ok(published);
            }
            let ids: Vec<i64> = alerts.iter().map(|a| a.alert_id).collect();
            let marked = self
                .mark_published(leader, &ids, self.alert_messages(&alerts))
                .await?;
            // Another supervisor may have published some of them meanwhile: the queue
            // dropped the repeats by message id, and only the marker logs.
            for a in alerts.iter().filter(|a| marked.contains(&a.alert_id)) {
                log_alert(a);
                if let Some(webhook) = &self.webhook {
                    webhook.offer(a);
                }
            }
            published += marked.len();
            metrics::counter!("orderly_alerts_published_total").increment(marked.len() as u64);
            if (alerts.len() as u32) < self.cfg.batch {
                return Ok(published);
            }
        }
    }

    /// The messages that publish `alerts`: each on the alerts queue, and a Failed
    /// notice to its order's reply queue, if it has one.
    fn alert_messages(&self, alerts: &[Alert]) -> Vec<Envelope> {
        let mut by_queue: Vec<(QueueName, Vec<orderly_core::transport::OutgoingMessage>)> =
            vec![(self.cfg.alerts.clone(), Vec::new())];
        for a in alerts {
            // The alert's messages start a trace of their own, not the term's.
            let span = info_span!("alert", order_id = %a.order_id, instance_id = %self.cfg.instance, alert_id = a.alert_id);
            orderly_core::tracecontext::start_trace(&span);
            let _entered = span.enter();
            by_queue[0].1.push(json_message(
                format!("alert:{}", a.alert_id),
                a,
                Some(a.order_id.as_str()),
            ));
            let notice = StatusNotice {
                order_id: a.order_id.clone(),
                status: OrderStatus::Failed,
                step: a.step.clone(),
                detail: a.last_error.clone(),
            };
            if let Some(env) = notice.envelope(a.reply_to.as_deref(), &format!("a{}", a.alert_id)) {
                match by_queue.iter_mut().find(|(q, _)| *q == env.queue) {
                    Some((_, msgs)) => msgs.push(env.message),
                    None => by_queue.push((env.queue, vec![env.message])),
                }
            }
        }
        by_queue
            .into_iter()
            .flat_map(|(queue, msgs)| {
                msgs.into_iter().map(move |message| Envelope {
                    queue: queue.clone(),
                    message,
                })
            })
            .collect()
    }

    /// Marks the alerts `ids` published and sends `sends`, in one fenced transaction:
    /// a deposed leader publishes nothing. A client queue that cannot take messages
    /// must not hold up the alerts: its notices are left out and the rest published.
    /// Returns the alerts this call marked.
    async fn mark_published(
        &self,
        leader: &LeaderFence,
        ids: &[i64],
        mut sends: Vec<Envelope>,
    ) -> orderly_core::Result<Vec<i64>> {
        loop {
            match self.store.mark_alerts_published(leader, ids, &sends).await {
                Ok(marked) => return Ok(marked),
                Err(orderly_core::Error::Send(inner)) if matches!(&*inner, TransportError::QueueNotFound(q) if *q != self.cfg.alerts) =>
                {
                    let TransportError::QueueNotFound(missing) = *inner else {
                        unreachable!("matched above")
                    };
                    warn!(queue = %missing, "client queue does not exist: its status notifications are not delivered");
                    sends.retain(|e| e.queue != missing);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn log_alert(a: &Alert) {
    error!(
        alert_id = a.alert_id,
        order_id = %a.order_id,
        step = a.step.as_deref().unwrap_or("-"),
        step_index = a.step_index,
        failure_count = a.failure_count,
        last_error = a.last_error.as_deref().unwrap_or("-"),
        "ALERT: order needs an operator"
    );
}
