//! What a role binary runs on: the state store and the transport `--transport` names.
//!
//! - `sql` (default): the queue in the store's database; a state change and the
//!   messages it causes commit in one transaction.
//! - `servicebus`: Azure Service Bus. Each state change writes its messages to the
//!   store's transactional outbox in its own transaction, and every process runs a
//!   relay that publishes them (leasing batches, so relays share the work and a dead
//!   one only delays its batch); Service Bus duplicate detection absorbs a message
//!   published twice. Receiving, settling and dead-lettering are Service Bus's own.

use std::sync::Arc;
use std::time::Duration;

use crate::{Common, TransportKind};
use anyhow::Context;
use async_trait::async_trait;
use orderly_azure::{Provisioned, ServiceBusSettings, ServiceBusTransport};
use orderly_core::messages::queues;
use orderly_core::transport::{
    Outbox, QueueDepth, QueueInspector, QueueName, Transport, TransportError,
};
use orderly_core::{InstanceId, SystemClock, TimeSource};
use orderly_sql::Backend;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Messages one relay pass publishes at most.
const RELAY_BATCH: u32 = 100;
/// Pause after a pass that sent something (lets a burst of writes gather).
const RELAY_IDLE_MIN: Duration = Duration::from_millis(5);
/// Longest wait between relay passes when the outbox is empty: local writes wake the
/// relay at once, so this only bounds how late another process's leftovers are found.
const RELAY_IDLE_MAX: Duration = Duration::from_secs(1);
/// Back-off after a failed pass: from, and up to.
const RELAY_RETRY_MIN: Duration = Duration::from_millis(100);
const RELAY_RETRY_MAX: Duration = Duration::from_secs(5);
/// How often the relay reports the outbox backlog.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);
/// How long a stopping process keeps relaying what is left.
const RELAY_DRAIN: Duration = Duration::from_secs(5);
/// How long published outbox rows are kept (for an operator's look), then deleted.
pub const OUTBOX_RETENTION: Duration = Duration::from_secs(3600);
/// Most published rows one housekeeping pass deletes.
const PRUNE_BATCH: u32 = 1000;

/// The settings, checked, before anything is opened.
pub struct Plan {
    url: String,
    password: Option<Arc<dyn orderly_core::credentials::PasswordSource>>,
    servicebus: Option<ServiceBusSettings>,
    startup_wait: Duration,
}

/// What a role runs on.
pub struct Opened {
    /// The store, the transport and the operators' view of the queues.
    pub backend: Backend,
    relay: Option<(CancellationToken, JoinHandle<()>)>,
}

/// The queues every deployment has: `orders`, `replies` and `alerts`.
pub fn fixed_queues() -> Vec<QueueName> {
    [queues::ORDERS, queues::REPLIES, queues::ALERTS]
        .into_iter()
        .map(|q| QueueName::parse(q).unwrap_or_else(|_| unreachable!("literal queue name")))
        .collect()
}

/// One of [`fixed_queues`] by name.
pub fn queue(name: &'static str) -> QueueName {
    QueueName::parse(name).unwrap_or_else(|_| unreachable!("literal queue name"))
}

/// Makes sure `wanted` exist before a role uses them. On the SQL transport a missing
/// queue is created with [`queues::settings`]: lock 30 s, dead-lettered after 10
/// deliveries, and duplicate detection over 10 minutes for `orders` and `alerts` only;
/// an existing one keeps its settings. On Service Bus queues are infrastructure: a
/// missing one is an error that names it and says how to provision it.
pub async fn ensure_queues(
    transport: &dyn Transport,
    wanted: impl IntoIterator<Item = QueueName>,
) -> anyhow::Result<()> {
    for q in wanted {
        let settings = queues::settings(&q);
        match transport.ensure_queue(&q, &settings).await {
            Ok(true) => tracing::info!(
                queue = %q,
                lock_ms = settings.lock_duration.as_millis() as u64,
                max_delivery_count = settings.max_delivery_count,
                dedup_window_ms = settings.duplicate_detection_window.as_millis() as u64,
                "queue created"
            ),
            Ok(false) => tracing::debug!(queue = %q, "queue exists"),
            Err(TransportError::QueueNotFound(_)) => anyhow::bail!(
                "Service Bus queue {q} does not exist. Queues on Service Bus are \
                 infrastructure: create it in the namespace with duplicate detection on \
                 (e.g. az servicebus queue create --resource-group RG --namespace-name NS \
                 --name {q} --enable-duplicate-detection true --lock-duration PT30S \
                 --max-delivery-count 10), or list it in the emulator's Config.json \
                 (deploy/servicebus-emulator/Config.json declares every queue of the \
                 default workflow)"
            ),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("cannot declare queue {q}")));
            }
        }
    }
    Ok(())
}

impl Opened {
    /// [`ensure_queues`] on this role's transport.
    pub async fn ensure_queues(
        &self,
        wanted: impl IntoIterator<Item = QueueName>,
    ) -> anyhow::Result<()> {
        ensure_queues(self.backend.transport.as_ref(), wanted).await
    }

    /// The deployment's message key, which signs the step requests and replies
    /// (created in the store by the first role that asks).
    pub async fn message_key(
        &self,
        instance: &InstanceId,
    ) -> anyhow::Result<orderly_core::signing::MessageKey> {
        self.backend
            .store
            .message_key(
                orderly_core::signing::MessageKey::generate(),
                instance.as_str(),
            )
            .await
            .map_err(|e| {
                anyhow::Error::new(e)
                    .context("cannot read (or create) the message key in the state store")
            })
    }

    /// Call when the role has stopped writing: the outbox relay (Service Bus only)
    /// publishes what is left, for up to a few seconds, and ends.
    pub async fn finish(self) {
        if let Some((stop, task)) = self.relay {
            stop.cancel();
            let _ = task.await;
        }
    }
}

/// The Service Bus settings `args` give, checked; errors name the setting and never
/// show the connection string.
pub fn servicebus_settings(args: &crate::ServiceBusArgs) -> anyhow::Result<ServiceBusSettings> {
    const NAMESPACE: &str = "--servicebus-namespace / ORDERLY_SERVICEBUS_NAMESPACE";
    let mut settings = match &args.servicebus_namespace {
        Some(_)
            if args.servicebus_connection.is_some()
                || args.servicebus_connection_file.is_some() =>
        {
            anyhow::bail!(
                "give either {NAMESPACE} (Entra ID) or --servicebus-connection / \
                 ORDERLY_SERVICEBUS_CONNECTION (a key), not both"
            )
        }
        Some(namespace) => {
            ServiceBusSettings::check_namespace(namespace, NAMESPACE)?;
            let source = args.servicebus_credential.source();
            let trust = orderly_tls::Trust::from_env()?;
            let identity = orderly_azure::EntraIdentity::default();
            let credential = orderly_azure::entra_credential_for(source, &identity, &trust)
                .context("--servicebus-credential / ORDERLY_SERVICEBUS_CREDENTIAL")?;
            ServiceBusSettings::entra(namespace, credential, source.describe(&identity), NAMESPACE)?
        }
        None => {
            let connection = args.connection()?;
            ServiceBusSettings::check_connection(
                &connection,
                "--servicebus-connection / ORDERLY_SERVICEBUS_CONNECTION",
            )?;
            ServiceBusSettings::new(connection)
        }
    };
    settings.unsecured = args.servicebus_unsecured;
    settings.max_message_bytes = args.servicebus_max_message_bytes;
    settings.max_batch_bytes = args.servicebus_max_batch_bytes;
    Ok(settings)
}

/// The source of PostgreSQL's password when `credential` names one: Entra ID tokens
/// for Azure Database for PostgreSQL. Errors name the setting.
pub fn database_password(
    credential: Option<crate::election::CredentialKind>,
    url: &str,
) -> anyhow::Result<Option<Arc<dyn orderly_core::credentials::PasswordSource>>> {
    let Some(kind) = credential else {
        return Ok(None);
    };
    if url.starts_with("sqlite:") {
        anyhow::bail!(
            "--database-credential / ORDERLY_DATABASE_CREDENTIAL applies to PostgreSQL only \
             (--database-url / ORDERLY_DATABASE_URL names SQLite)"
        );
    }
    let source = kind.source();
    let trust = orderly_tls::Trust::from_env()?;
    let identity = orderly_azure::EntraIdentity::default();
    let credential = orderly_azure::entra_credential_for(source, &identity, &trust)
        .context("--database-credential / ORDERLY_DATABASE_CREDENTIAL")?;
    Ok(Some(Arc::new(orderly_azure::EntraPassword::new(
        credential,
        source.describe(&identity),
    ))))
}

/// The state store for an operator's command: `url`, with the password from
/// `ORDERLY_DATABASE_CREDENTIAL` when it is set (as the roles take it).
pub async fn connect_store(url: &str) -> anyhow::Result<Backend> {
    let password = database_password(credential_from_env()?, url)?;
    Ok(orderly_sql::connect_with(url, TimeSource::Database, password).await?)
}

/// [`connect_store`] with the store's messages going to its outbox.
pub async fn connect_outbox_store(url: &str) -> anyhow::Result<orderly_sql::OutboxBackend> {
    let password = database_password(credential_from_env()?, url)?;
    Ok(orderly_sql::connect_outbox_with(url, TimeSource::Database, password).await?)
}

/// The password source `ORDERLY_DATABASE_CREDENTIAL` names for `url`, if it is set (as
/// [`database_password`]), for commands that take no flag for it.
pub fn database_password_from_env(
    url: &str,
) -> anyhow::Result<Option<Arc<dyn orderly_core::credentials::PasswordSource>>> {
    database_password(credential_from_env()?, url)
}

/// `ORDERLY_DATABASE_CREDENTIAL`, for commands that take no flag for it.
fn credential_from_env() -> anyhow::Result<Option<crate::election::CredentialKind>> {
    use clap::ValueEnum as _;
    match std::env::var("ORDERLY_DATABASE_CREDENTIAL") {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => crate::election::CredentialKind::from_str(v.trim(), true)
            .map(Some)
            .map_err(|_| {
                anyhow::anyhow!(
                    "ORDERLY_DATABASE_CREDENTIAL must be workload-identity, managed-identity or developer"
                )
            }),
    }
}

/// The context of a failure to reach Service Bus: the settings that say where it is.
const SERVICEBUS_SETTINGS: &str = "cannot connect to Service Bus (--servicebus-namespace / ORDERLY_SERVICEBUS_NAMESPACE, or --servicebus-connection / ORDERLY_SERVICEBUS_CONNECTION)";

/// An operator's connection to Service Bus (no outbox, no relay): the transport, to
/// list dead letters, and the operations on its queues (depths by peeking, dead
/// letters requeued or discarded).
pub async fn servicebus_operator(
    args: &crate::ServiceBusArgs,
) -> anyhow::Result<(Arc<dyn Transport>, Arc<dyn QueueInspector>)> {
    let settings = servicebus_settings(args)?;
    let servicebus = Arc::new(
        ServiceBusTransport::connect(&settings, Arc::new(Provisioned), Arc::new(SystemClock))
            .await
            .context(SERVICEBUS_SETTINGS)?,
    );
    let inspector: Arc<dyn QueueInspector> = Arc::new(ServiceBusInspector {
        servicebus: servicebus.clone(),
        queues: known_queues(),
    });
    Ok((servicebus, inspector))
}

impl Plan {
    /// Checks the store and transport settings; errors name the setting.
    pub fn new(common: &Common) -> anyhow::Result<Self> {
        let servicebus = match common.transport {
            TransportKind::Sql => None,
            TransportKind::Servicebus => Some(servicebus_settings(&common.servicebus)?),
        };
        Ok(Self {
            url: common.database_url.clone(),
            password: database_password(common.database_credential, &common.database_url)?,
            servicebus,
            startup_wait: common.startup_wait_ms,
        })
    }

    /// Opens the store (running migrations) and the transport; with Service Bus, starts
    /// the outbox relay as `relay_as`, which runs until [`Opened::finish`].
    pub async fn open(self, relay_as: &InstanceId) -> anyhow::Result<Opened> {
        const STORE: &str = "cannot open the state store (--database-url / ORDERLY_DATABASE_URL)";
        let wait = self.startup_wait;
        let Some(settings) = self.servicebus else {
            let backend = patiently(
                "the state store",
                wait,
                orderly_core::Error::is_retryable,
                async || {
                    orderly_sql::connect_with(
                        &self.url,
                        TimeSource::Database,
                        self.password.clone(),
                    )
                    .await
                },
            )
            .await
            .context(STORE)?;
            return Ok(Opened {
                backend,
                relay: None,
            });
        };
        let sql = patiently(
            "the state store",
            wait,
            orderly_core::Error::is_retryable,
            async || {
                orderly_sql::connect_outbox_with(
                    &self.url,
                    TimeSource::Database,
                    self.password.clone(),
                )
                .await
            },
        )
        .await
        .context(STORE)?;
        let servicebus = Arc::new(
            patiently(
                "Service Bus",
                wait,
                TransportError::is_retryable,
                async || {
                    ServiceBusTransport::connect(
                        &settings,
                        Arc::new(Provisioned),
                        Arc::new(SystemClock),
                    )
                    .await
                },
            )
            .await
            .context(SERVICEBUS_SETTINGS)?,
        );
        let transport: Arc<dyn Transport> = servicebus.clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(
            relay(
                sql.outbox.clone(),
                transport.clone(),
                relay_as.clone(),
                stop.clone(),
            )
            .instrument(tracing::info_span!("outbox_relay", instance_id = %relay_as)),
        );
        Ok(Opened {
            backend: Backend {
                store: sql.store,
                transport: transport.clone(),
                inspector: Arc::new(ServiceBusInspector {
                    servicebus,
                    queues: known_queues(),
                }),
                outbox: sql.outbox.clone(),
                stats: sql.stats,
            },
            relay: Some((stop, task)),
        })
    }
}

/// First wait between start-up attempts; doubles up to [`STARTUP_RETRY_MAX`].
const STARTUP_RETRY_MIN: Duration = Duration::from_millis(500);
const STARTUP_RETRY_MAX: Duration = Duration::from_secs(10);

/// Runs `attempt` until it succeeds, fails in a way `retryable` says retrying cannot
/// mend (a bad setting: returned at once), or `limit` has passed since the first try,
/// waiting with back-off between tries and logging each failure (what, the error, the
/// next try); the last error is returned. A role started before its database or
/// broker is up waits for them.
pub async fn patiently<T, E>(
    what: &str,
    limit: Duration,
    retryable: impl Fn(&E) -> bool,
    mut attempt: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E>
where
    E: std::fmt::Display,
{
    let started = tokio::time::Instant::now();
    let mut wait = STARTUP_RETRY_MIN;
    let mut tries = 0u32;
    // The failure last logged: a repeat of it is logged at debug only, a change (say,
    // from a refused connection to a certificate the trust does not cover) again.
    let mut last = String::new();
    loop {
        tries += 1;
        match attempt().await {
            Ok(v) => {
                if tries > 1 {
                    tracing::info!(tries, "{what} reached");
                }
                return Ok(v);
            }
            Err(e) if retryable(&e) && started.elapsed() + wait <= limit => {
                let error = e.to_string();
                if error == last {
                    tracing::debug!(
                        error,
                        tries,
                        retry_in_ms = wait.as_millis() as u64,
                        "{what} still not reachable"
                    );
                } else {
                    tracing::warn!(
                        error,
                        tries,
                        retry_in_ms = wait.as_millis() as u64,
                        "{what} not reachable yet; retrying, logged again when the failure changes"
                    );
                    last = error;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(STARTUP_RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Publishes the outbox to `target` until `stop`, then drains what is left for up to
/// [`RELAY_DRAIN`]. Between passes it waits for a local write to the outbox (woken at
/// once) or, idle, polls with back-off up to [`RELAY_IDLE_MAX`] for others' messages;
/// failures are logged and retried with back-off (the messages stay in the outbox:
/// nothing is lost).
async fn relay(
    outbox: Arc<dyn Outbox>,
    target: Arc<dyn Transport>,
    me: InstanceId,
    stop: CancellationToken,
) {
    use tokio::time::Instant;
    let mut idle = RELAY_IDLE_MIN;
    let mut failing = RELAY_RETRY_MIN;
    let mut backlog_read = Instant::now();
    let mut drain_until: Option<Instant> = None;
    loop {
        if drain_until.is_none() && stop.is_cancelled() {
            drain_until = Some(Instant::now() + RELAY_DRAIN);
        }
        if let Some(until) = drain_until
            && Instant::now() >= until
        {
            tracing::warn!(
                "outbox: stopping with messages left; another process's relay sends them"
            );
            return;
        }
        if backlog_read.elapsed() >= BACKLOG_EVERY {
            backlog_read = Instant::now();
            if let Ok(n) = outbox.outbox_backlog().await {
                metrics::gauge!("orderly_outbox_backlog").set(n as f64);
            }
            if let Ok(dead) = outbox.outbox_dead_count().await {
                metrics::gauge!("orderly_outbox_dead_letters").set(dead as f64);
            }
            match outbox.prune_sent(OUTBOX_RETENTION, PRUNE_BATCH).await {
                Ok(n) if n > 0 => {
                    tracing::debug!(deleted = n, "outbox: published rows past retention deleted")
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "outbox: could not delete published rows"),
            }
        }
        let pass = outbox.relay_once(&me, &*target, RELAY_BATCH).await;
        let wait = match pass {
            Ok(outcome) => {
                failing = RELAY_RETRY_MIN;
                metrics::counter!("orderly_outbox_relayed_total").increment(outcome.sent as u64);
                if outcome.dead > 0 {
                    metrics::counter!("orderly_outbox_dead_lettered_total")
                        .increment(outcome.dead as u64);
                    tracing::warn!(
                        count = outcome.dead,
                        "outbox: messages set aside as undeliverable; `orderly outbox` lists them"
                    );
                }
                if outcome.failed > 0 {
                    metrics::counter!("orderly_outbox_relay_failures_total")
                        .increment(outcome.failed as u64);
                    tracing::warn!(
                        failed = outcome.failed,
                        "outbox: the transport refused messages; retried later"
                    );
                }
                if outcome.sent as u32 == RELAY_BATCH {
                    continue; // more may be waiting
                }
                if outcome.sent == 0 && drain_until.is_some() {
                    return; // drained
                }
                idle = if outcome.sent > 0 {
                    RELAY_IDLE_MIN
                } else {
                    (idle * 2).min(RELAY_IDLE_MAX)
                };
                outbox.wait_written(idle)
            }
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay pass failed; retrying");
                let pause = failing;
                failing = (failing * 2).min(RELAY_RETRY_MAX);
                Box::pin(tokio::time::sleep(pause))
            }
        };
        if drain_until.is_some() {
            wait.await;
        } else {
            tokio::select! {
                _ = wait => {}
                _ = stop.cancelled() => {}
            }
        }
    }
}

/// The queues an operator's view of Service Bus covers: orderly's own and the agent
/// queues of the default workflow (Service Bus cannot list its queues over AMQP).
fn known_queues() -> Vec<QueueName> {
    let mut names: Vec<QueueName> = [queues::ORDERS, queues::REPLIES, queues::ALERTS]
        .iter()
        .filter_map(|q| QueueName::parse(*q).ok())
        .collect();
    for q in orderly_core::workflow::Workflow::default().queues() {
        if !names.contains(&q) {
            names.push(q);
        }
    }
    names
}

/// Operators' view of Service Bus, over AMQP: depths counted by peeking (AMQP has no
/// count; the exact figures are Azure Monitor metrics), dead letters requeued or
/// discarded through the `$DeadLetterQueue` sub-queue.
struct ServiceBusInspector {
    servicebus: Arc<ServiceBusTransport>,
    queues: Vec<QueueName>,
}

#[async_trait]
impl QueueInspector for ServiceBusInspector {
    async fn depths(&self) -> Result<Vec<QueueDepth>, TransportError> {
        Err(TransportError::Unsupported(
            "Service Bus queue depths are Azure Monitor metrics (ActiveMessageCount, \
             DeadletteredMessageCount); `orderly queues` counts them by peeking"
                .into(),
        ))
    }

    async fn count_depths(&self) -> Result<Vec<QueueDepth>, TransportError> {
        self.servicebus.depths_by_peeking(&self.queues).await
    }

    async fn ping(&self) -> Result<(), TransportError> {
        let orders = QueueName::parse(queues::ORDERS).map_err(TransportError::Invalid)?;
        self.servicebus.dead_letters(&orders, 1).await.map(|_| ())
    }

    async fn requeue_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize, TransportError> {
        self.servicebus
            .settle_dead_letters(queue, message_id, true)
            .await
    }

    async fn discard_dead_letters(
        &self,
        queue: &QueueName,
        message_id: Option<&str>,
    ) -> Result<usize, TransportError> {
        self.servicebus
            .settle_dead_letters(queue, message_id, false)
            .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A role started before its database or broker waits for it, with back-off, and
    /// gives up with the last error once the start-up wait has passed.
    #[tokio::test(start_paused = true)]
    async fn start_up_waits_for_what_is_not_up_yet_and_then_gives_up_with_its_error() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let up_after = Duration::from_secs(7);
        let got: Result<&str, String> = patiently(
            "the broker",
            Duration::from_secs(60),
            |_| true,
            async || {
                tries += 1;
                if started.elapsed() >= up_after {
                    Ok("connected")
                } else {
                    Err(format!("refused (try {tries})"))
                }
            },
        )
        .await;
        assert_eq!(got.unwrap(), "connected");
        // 0.5 + 1 + 2 + 4 s of back-off: up at 7 s, reached at 7.5 s.
        assert_eq!(tries, 5);
        assert_eq!(started.elapsed(), Duration::from_millis(7_500));

        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let got: Result<(), String> = patiently(
            "the broker",
            Duration::from_secs(30),
            |_| true,
            async || {
                tries += 1;
                Err(format!("refused (try {tries})"))
            },
        )
        .await;
        // 0.5 + 1 + 2 + 4 + 8 + 10 = 25.5 s; a further 10 s would pass the 30 s limit.
        assert_eq!(got.unwrap_err(), "refused (try 7)");
        assert_eq!(started.elapsed(), Duration::from_millis(25_500));

        // A bad setting is not waited on.
        let started = tokio::time::Instant::now();
        let got: Result<(), String> = patiently(
            "the broker",
            Duration::from_secs(30),
            |e: &String| !e.starts_with("bad"),
            async || Err("bad connection string".to_owned()),
        )
        .await;
        assert_eq!(got.unwrap_err(), "bad connection string");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test]
    async fn the_queues_a_role_creates_detect_duplicates_only_where_clients_and_alerts_post() {
        let store = Arc::new(
            orderly_sql::SqliteStore::open("sqlite::memory:", TimeSource::Database)
                .await
                .unwrap(),
        );
        let step = QueueName::parse("agent.inventory").unwrap();
        let wanted: Vec<QueueName> = fixed_queues()
            .into_iter()
            .chain(std::iter::once(step.clone()))
            .collect();
        ensure_queues(store.as_ref(), wanted.clone()).await.unwrap();
        // The same message id sent twice to each.
        for q in &wanted {
            for _ in 0..2 {
                let m = orderly_core::transport::OutgoingMessage::new(
                    "same-id".to_owned(),
                    b"{}".to_vec(),
                );
                store.send(q, &[m]).await.unwrap();
            }
        }
        let depths = store.depths().await.unwrap();
        let ready = |q: &str| {
            depths
                .iter()
                .find(|d| d.queue.as_str() == q)
                .map(|d| d.ready)
                .unwrap()
        };
        assert_eq!(ready(queues::ORDERS), 1, "orders drops the repeat");
        assert_eq!(ready(queues::ALERTS), 1, "alerts drops the repeat");
        assert_eq!(ready(queues::REPLIES), 2, "replies keeps both");
        assert_eq!(ready(step.as_str()), 2, "a step queue keeps both");
    }
}
