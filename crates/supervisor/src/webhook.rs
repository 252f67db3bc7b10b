//! Alerts to a webhook: each alert the leader publishes is also POSTed as JSON to an
//! operator's URL (a chat hook, an incident tool), with retries and back-off, by a task
//! of its own behind a bounded queue, so a slow or failing webhook never holds up a
//! sweep. The webhook is an extra channel: the alerts table and the alerts queue stay
//! the record (an alert whose delivery gives up, or that is offered to a full queue, is
//! logged and remains there).

use std::sync::Arc;
use std::time::Duration;

use orderly_core::service::ServiceAlert;
use orderly_core::store::Alert;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Where and how alerts are POSTed. Its `Debug` shows the URL's scheme and host only
/// (the path or query may carry a token).
#[derive(Clone)]
pub struct WebhookConfig {
    /// The URL (it may carry a token: it is never logged).
    pub url: reqwest::Url,
    /// Each attempt is abandoned after this long.
    pub timeout: Duration,
    /// Attempts per alert before giving up.
    pub max_attempts: u32,
    /// Back-off before the second attempt; doubles, with full jitter, up to `backoff_max`.
    pub backoff_base: Duration,
    /// Longest back-off.
    pub backoff_max: Duration,
    /// Alerts waiting for delivery, at most.
    pub queue: usize,
    /// Deliveries in flight, at most.
    pub concurrency: usize,
    /// Whose certificates an https webhook may present.
    pub trust: orderly_tls::Trust,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &self.host())
            .field("timeout", &self.timeout)
            .field("max_attempts", &self.max_attempts)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("queue", &self.queue)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl WebhookConfig {
    /// Defaults for `url`: 5 s per attempt, 8 attempts, back-off from 500 ms to 60 s,
    /// 10,000 waiting, 4 in flight.
    pub fn new(url: reqwest::Url) -> Self {
        Self {
            url,
            timeout: Duration::from_secs(5),
            max_attempts: 8,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            queue: 10_000,
            concurrency: 4,
            trust: orderly_tls::Trust::platform(),
        }
    }

    fn host(&self) -> String {
        format!(
            "{}://{}",
            self.url.scheme(),
            self.url.host_str().unwrap_or("?")
        )
    }
}

/// What the webhook is told: an order that needs an operator, or a remote service's
/// outage starting or ending.
#[derive(Debug, Clone)]
pub enum Notice {
    /// An order entered Error.
    Order(Alert),
    /// A service went down, or came back.
    Service(ServiceAlert),
    /// A condition of the system began or ended (see `orderly_core::conditions`).
    Condition(orderly_core::conditions::ConditionNotice),
}

impl Notice {
    /// The idempotency key of its delivery (the alerts queue's message id).
    fn key(&self) -> String {
        match self {
            Notice::Order(a) => format!("alert:{}", a.alert_id),
            Notice::Service(s) => s.message_id(),
            Notice::Condition(c) => c.message_id(),
        }
    }

    fn body(&self) -> serde_json::Value {
        match self {
            Notice::Order(a) => serde_json::json!({ "kind": "orderly.alert", "alert": a }),
            Notice::Service(s) => {
                serde_json::json!({ "kind": format!("orderly.{}", s.kind), "outage": s })
            }
            Notice::Condition(c) => serde_json::json!({
                "kind": format!("orderly.condition.{}", c.event),
                "condition": c.alert,
            }),
        }
    }
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::Order(a) => write!(f, "alert {} (order {})", a.alert_id, a.order_id),
            Notice::Service(s) => write!(f, "{} of {} (outage {})", s.kind, s.service, s.outage),
            Notice::Condition(c) => write!(
                f,
                "{} {} of {} (alert {})",
                c.alert.kind.as_str(),
                c.event,
                c.alert.subject,
                c.alert.alert_id
            ),
        }
    }
}

/// The sending side: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct AlertWebhook {
    tx: mpsc::Sender<Notice>,
}

impl AlertWebhook {
    /// Starts the delivery task; it drains what is queued and stops at `shutdown`.
    pub fn start(
        cfg: WebhookConfig,
        shutdown: CancellationToken,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), orderly_tls::Error> {
        let client = cfg
            .trust
            .http_client()?
            .connect_timeout(cfg.timeout.min(Duration::from_secs(2)))
            .timeout(cfg.timeout)
            .build()
            .map_err(|e| orderly_tls::Error::Setup(e.to_string()))?;
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let task = tokio::spawn(deliver_all(client, Arc::new(cfg), rx, shutdown));
        Ok((Self { tx }, task))
    }

    /// Queues `alert` for delivery; never waits. A full queue drops it with a warning
    /// (the alert remains in the alerts table and on the alerts queue).
    pub fn offer(&self, alert: &Alert) {
        self.offer_notice(Notice::Order(alert.clone()));
    }

    /// Queues `notice` for delivery; never waits (as [`Self::offer`]).
    pub fn offer_notice(&self, notice: Notice) {
        let what = notice.to_string();
        if let Err(e) = self.tx.try_send(notice) {
            warn!(notice = %what, error = %e, "alert not queued for the webhook; it stays in the alerts queue");
        }
    }
}

async fn deliver_all(
    client: reqwest::Client,
    cfg: Arc<WebhookConfig>,
    mut rx: mpsc::Receiver<Notice>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
    loop {
        let alert = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            alert = rx.recv() => match alert {
                Some(a) => a,
                None => break,
            },
        };
        let permit = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (client, cfg, shutdown) = (client.clone(), cfg.clone(), shutdown.clone());
        tokio::spawn(async move {
            deliver(&client, &cfg, &alert, &shutdown).await;
            drop(permit);
        });
    }
    let left = rx.len() + cfg.concurrency.max(1) - slots.available_permits();
    if left > 0 {
        warn!(
            left,
            "stopping with alerts not sent to the webhook; they stay in the alerts table and queue"
        );
    }
}

/// POSTs one alert until accepted (2xx), refused (4xx other than 408/429), out of
/// attempts, or shut down.
async fn deliver(
    client: &reqwest::Client,
    cfg: &WebhookConfig,
    alert: &Notice,
    shutdown: &CancellationToken,
) {
    let key = alert.key();
    let body = alert.body();
    for attempt in 1..=cfg.max_attempts {
        let post = client
            .post(cfg.url.clone())
            .header("Idempotency-Key", &key)
            .json(&body)
            .send();
        let outcome = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            outcome = post => outcome,
        };
        let retryable = match outcome {
            Ok(r) if r.status().is_success() => {
                info!(notice = %alert, attempt, "alert delivered to the webhook");
                return;
            }
            Ok(r) if r.status().is_redirection() => {
                // Not followed: the alert (and its Idempotency-Key) goes only where the
                // webhook's URL says.
                let to = r
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|to| r.url().join(to).ok())
                    .and_then(|u| u.host_str().map(str::to_owned))
                    .unwrap_or_else(|| "nowhere".to_owned());
                warn!(notice = %alert, webhook = %cfg.host(), status = r.status().as_u16(), redirected_to = %to, attempt, "the webhook answered with a redirect, which is not followed: set ORDERLY_ALERT_WEBHOOK_URL to where it answers");
                false
            }
            Ok(r) => {
                let s = r.status();
                let retry = s.is_server_error() || s.as_u16() == 408 || s.as_u16() == 429;
                warn!(notice = %alert, webhook = %cfg.host(), status = s.as_u16(), attempt, "the webhook refused the alert");
                retry
            }
            Err(e) => {
                warn!(notice = %alert, webhook = %cfg.host(), error = %e.without_url(), attempt, "the webhook could not be reached");
                true
            }
        };
        if !retryable {
            break;
        }
        if attempt == cfg.max_attempts {
            break;
        }
        let cap = cfg
            .backoff_base
            .saturating_mul(1 << (attempt - 1).min(20))
            .min(cfg.backoff_max);
        let wait = cap.mul_f64(rand::random::<f64>());
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
    error!(notice = %alert, webhook = %cfg.host(), "giving up on the webhook for this alert; it stays in the alerts table and queue");
}

#[cfg(test)]
mod debug_tests {
    use super::WebhookConfig;

    #[test]
    fn the_debug_form_shows_the_host_not_the_token_in_the_url() {
        let cfg = WebhookConfig::new(
            "https://hooks.example/services/T0/B0/s3cr3tPath?token=s3cr3tQuery"
                .parse()
                .unwrap(),
        );
        let shown = format!("{cfg:?}");
        assert!(shown.contains("https://hooks.example"), "{shown}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
}
