//! Azure Service Bus as an orderly transport.
//!
//! Designed around the known behaviour of `azservicebus` 0.25 (docs/architecture.md, "The Service Bus client"):
//! every call has a short try-timeout and few retries (a failing call otherwise takes
//! minutes); receivers prefetch at least one message (with none, a receive that times
//! out can leave the link stuck); a receiver or sender whose call fails is dropped and
//! recreated on the next call; sends are idempotent by message id (Service Bus
//! duplicate detection absorbs a resend); a process-level rustls crypto provider is
//! installed before connecting. Message locks are renewed by the caller
//! (`Transport::renew_lock`): the client does not renew them itself.
//!
//! Queues are provisioned as infrastructure (Bicep, Terraform, the portal): Service Bus
//! offers no queue creation over AMQP. [`QueueAdmin`] is how `declare_queue` reaches
//! whatever creates them; in production that is [`Provisioned`], which checks nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use azservicebus::primitives::service_bus_retry_options::ServiceBusRetryOptions;
use azservicebus::receiver::DeadLetterOptions;
use azservicebus::{
    ServiceBusClient, ServiceBusClientOptions, ServiceBusMessage, ServiceBusPeekedMessage,
    ServiceBusReceiveMode, ServiceBusReceivedMessage, ServiceBusReceiver,
    ServiceBusReceiverOptions, ServiceBusRetryMode, ServiceBusSender, ServiceBusSenderOptions,
    SubQueue,
};
use chrono::{DateTime, Utc};
use fe2o3_amqp_types::messaging::ApplicationProperties;
use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue};
use orderly_core::transport::{
    DeadLetter, LockToken, MAX_MESSAGES, OutgoingMessage, QueueName, QueueSettings,
    ReceivedMessage, SendOutcome, Transport, TransportError,
};
use orderly_core::{Clock, ValidationError};
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use tokio::sync::Mutex;

/// Messages a receiver may hold unsettled at once (fe2o3 grants new credit only as
/// deliveries are settled). At least 1: with none, a receive that times out can leave
/// the link stuck (docs/architecture.md, "The Service Bus client").
pub const PREFETCH: u32 = 32;

mod operate;
pub use operate::PEEK_COUNT_CAP;

/// Shortest time a receive waits: over a network, "no wait" would return before
/// messages already in the queue had a chance to arrive.
pub const MIN_RECEIVE_WAIT: Duration = Duration::from_millis(300);

/// After the first message of a receive, how long to wait for the rest: only what is
/// already prefetched or arriving at once is taken, so a receive returns within a few
/// milliseconds of its first message.
const DRAIN_WAIT: Duration = Duration::from_millis(10);

/// How to reach a Service Bus namespace.
#[derive(Clone)]
pub struct ServiceBusSettings {
    /// `Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...` (a secret:
    /// never printed).
    pub connection_string: String,
    /// Plain AMQP without TLS, for local emulators and test stand-ins only.
    pub unsecured: bool,
    /// Timeout of one attempt of one call.
    pub try_timeout: Duration,
    /// Retries of a failed call.
    pub max_retries: u32,
    /// The most one send carries, and so the largest message: a send is split into
    /// batches of at most this many bytes (the Standard tier's 256 KB by default;
    /// Premium takes up to 100 MB, set by `ORDERLY_SERVICEBUS_MAX_BATCH_BYTES`).
    pub max_batch_bytes: usize,
}

/// Service Bus Standard's limit of a message and of a batch.
pub const STANDARD_MAX_BATCH_BYTES: usize = 256 * 1024;

impl std::fmt::Debug for ServiceBusSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusSettings")
            .field("connection_string", &"<secret>")
            .field("unsecured", &self.unsecured)
            .field("try_timeout", &self.try_timeout)
            .field("max_retries", &self.max_retries)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .finish()
    }
}

impl ServiceBusSettings {
    /// Settings for a connection string with the defaults this adapter needs.
    pub fn new(connection_string: impl Into<String>) -> Self {
        Self {
            connection_string: connection_string.into(),
            unsecured: false,
            try_timeout: Duration::from_secs(10),
            max_retries: 2,
            max_batch_bytes: STANDARD_MAX_BATCH_BYTES,
        }
    }

    /// Settings from the environment: `ORDERLY_SERVICEBUS_CONNECTION` (required, a
    /// secret) and `ORDERLY_SERVICEBUS_UNSECURED` (`true` for plain AMQP to a local
    /// emulator; default `false`). Errors name the variable, never its value.
    pub fn from_env() -> Result<Self, ValidationError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Checks that `connection` looks like a Service Bus connection string; the error
    /// names `setting`, never the value (it holds a secret).
    pub fn check_connection(connection: &str, setting: &str) -> Result<(), ValidationError> {
        let has = |key: &str| {
            connection
                .split(';')
                .any(|part| part.trim().starts_with(key))
        };
        if !has("Endpoint=sb://") || !(has("SharedAccessKey=") || has("SharedAccessSignature=")) {
            return Err(ValidationError::new(
                setting.to_owned(),
                "must look like Endpoint=sb://<namespace>/;SharedAccessKeyName=...;SharedAccessKey=... \
                 (the value is not shown: it holds a secret)",
            ));
        }
        Ok(())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ValidationError> {
        const CONNECTION: &str = "ORDERLY_SERVICEBUS_CONNECTION";
        const UNSECURED: &str = "ORDERLY_SERVICEBUS_UNSECURED";
        let connection = var(CONNECTION)
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| {
                ValidationError::new(
                    CONNECTION,
                    "is not set: give the namespace's connection string",
                )
            })?;
        Self::check_connection(&connection, CONNECTION)?;
        let unsecured = match var(UNSECURED).as_deref().map(str::trim) {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(_) => return Err(ValidationError::new(UNSECURED, "must be true or false")),
        };
        const MAX_BATCH: &str = "ORDERLY_SERVICEBUS_MAX_BATCH_BYTES";
        let max_batch_bytes = match var(MAX_BATCH).as_deref().map(str::trim) {
            None | Some("") => STANDARD_MAX_BATCH_BYTES,
            Some(raw) => raw
                .parse::<usize>()
                .ok()
                .filter(|n| (4096..=100 * 1024 * 1024).contains(n))
                .ok_or_else(|| {
                    ValidationError::new(
                        MAX_BATCH,
                        "must be a number of bytes from 4096 to 104857600",
                    )
                })?,
        };
        Ok(Self {
            unsecured,
            max_batch_bytes,
            ..Self::new(connection)
        })
    }
}

/// Creates (or checks) queues with their settings.
#[async_trait]
pub trait QueueAdmin: Send + Sync {
    /// Makes `queue` exist with `settings`.
    async fn declare(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError>;

    /// Makes `queue` exist, leaving an existing one as it is where the admin can tell;
    /// returns whether it created it. By default the same as [`QueueAdmin::declare`].
    async fn ensure(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError> {
        self.declare(queue, settings).await.map(|()| false)
    }
}

/// Queues provisioned outside orderly (the production case): `declare_queue` validates
/// the settings and otherwise trusts the infrastructure; a missing queue shows up as
/// `QueueNotFound` on first use.
#[derive(Debug, Default, Clone, Copy)]
pub struct Provisioned;

#[async_trait]
impl QueueAdmin for Provisioned {
    async fn declare(
        &self,
        _queue: &QueueName,
        _settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        Ok(())
    }
}

/// A receiver link shared by the receives and settlements of one queue.
type Link<T> = Arc<Mutex<T>>;

/// One delivery this process holds: settled on the link it came from, and only while
/// that link's connection is the current one.
struct Held {
    generation: u64,
    receiver: Link<ServiceBusReceiver>,
    /// Locked only by a renewal or a settlement of this very message.
    message: Arc<Mutex<ServiceBusReceivedMessage>>,
}

/// One AMQP connection and the links opened on it. Replaced as a whole when it dies.
struct Connection {
    generation: u64,
    /// Creating a link needs the client exclusively; held only for the (bounded) attach.
    client: Mutex<Option<ServiceBusClient<azservicebus::core::BasicRetryPolicy>>>,
    senders: StdMutex<HashMap<String, Link<ServiceBusSender>>>,
    receivers: StdMutex<HashMap<String, Link<ServiceBusReceiver>>>,
    dead_letter_receivers: StdMutex<HashMap<String, Link<ServiceBusReceiver>>>,
    /// Set when a failure says the connection or its session is gone.
    dead: AtomicBool,
    /// Calls that failed in a row on this connection (any success resets it).
    failures: AtomicU32,
}

impl Connection {
    fn new(
        generation: u64,
        client: ServiceBusClient<azservicebus::core::BasicRetryPolicy>,
    ) -> Self {
        Self {
            generation,
            client: Mutex::new(Some(client)),
            senders: StdMutex::default(),
            receivers: StdMutex::default(),
            dead_letter_receivers: StdMutex::default(),
            dead: AtomicBool::new(false),
            failures: AtomicU32::new(0),
        }
    }

    fn links<T>(
        map: &StdMutex<HashMap<String, Link<T>>>,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Link<T>>> {
        map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a queue's links out of use: the next call opens fresh ones.
    fn drop_links(&self, queue: &QueueName) {
        Self::links(&self.senders).remove(queue.as_str());
        Self::links(&self.receivers).remove(queue.as_str());
        Self::links(&self.dead_letter_receivers).remove(queue.as_str());
    }
}

/// The current connection, and when to try again after a failed attempt.
struct ConnectionSlot {
    current: Option<Arc<Connection>>,
    generation: u64,
    retry_at: Option<tokio::time::Instant>,
    backoff: Duration,
    last_cause: String,
}

/// First pause before reconnecting after a failed attempt, and the longest.
const RECONNECT_MIN: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A receive waits for its first message in slices of this long, letting settlements
/// of the same queue in between (the link needs exclusive use for both).
const RECEIVE_SLICE: Duration = Duration::from_millis(50);
/// Failures in a row after which a connection is taken for dead even if no error said so.
const FAILURES_BEFORE_RECONNECT: u32 = 2;

/// The Service Bus transport: one AMQP connection at a time (rebuilt with back-off and
/// jitter when it or its session dies, links re-created lazily), a sender and a
/// receiver per queue. Every network call is bounded by the try-timeout; no lock is
/// held across a network call but a link's own (for that link's calls) and the
/// client's (for an attach).
pub struct ServiceBusTransport {
    settings: ServiceBusSettings,
    slot: Mutex<ConnectionSlot>,
    held: StdMutex<HashMap<(String, String), Held>>,
    admin: Arc<dyn QueueAdmin>,
    clock: Arc<dyn Clock>,
    reconnects: AtomicU64,
}

impl std::fmt::Debug for ServiceBusTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusTransport")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A Service Bus failure, worded so that an operator looks at Service Bus.
fn unavailable(queue: Option<&QueueName>, what: impl std::fmt::Display) -> TransportError {
    let text = match queue {
        Some(q) => format!("Service Bus unavailable (queue {q}): {what}"),
        None => format!("Service Bus unavailable: {what}"),
    };
    TransportError::Unavailable(text.into())
}

/// The client reports a refused link or a lost lock only in its error text.
fn classify<E>(e: E, queue: &QueueName, message_id: Option<&str>) -> TransportError
where
    E: std::error::Error + Send + Sync + 'static,
{
    tracing::debug!(queue = %queue, error = ?e, "Service Bus call failed");
    let text = format!("{e:?} {e}").to_lowercase();
    if let Some(message_id) = message_id
        && (text.contains("lock-lost")
            || text.contains("locklost")
            || text.contains("lock supplied is invalid"))
    {
        return TransportError::LockLost {
            queue: queue.clone(),
            message_id: message_id.to_owned(),
        };
    }
    if text.contains("not-found")
        || text.contains("notfound")
        || text.contains("could not be found")
    {
        return TransportError::QueueNotFound(queue.clone());
    }
    // Too large for the entity: sending it again never succeeds.
    if text.contains("messagesizeexceeded") || text.contains("message-size-exceeded") {
        return TransportError::Invalid(ValidationError::new(
            "message",
            format!(
                "refused by {queue} as too large ({e}); lower ORDERLY_SERVICEBUS_MAX_BATCH_BYTES to the entity's limit"
            ),
        ));
    }
    unavailable(Some(queue), format!("{e}"))
}

/// Whether a failure's text says the connection or its session is gone (as opposed to
/// one link or one message): then the whole connection is rebuilt at once.
fn connection_gone(e: &TransportError) -> bool {
    let TransportError::Unavailable(source) = e else {
        return false;
    };
    let text = format!("{source:?} {source}").to_lowercase();
    [
        "illegalsessionstate",
        "illegal session state",
        "expectimmediatedetach",
        "session",
        "connection",
        "broken pipe",
        "reset by peer",
        "closed",
        "io error",
        "cbs",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Runs a network call with a time limit; a call that outlasts it is an error.
async fn bounded<T, E>(
    limit: Duration,
    queue: &QueueName,
    what: &str,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, TransportError> {
    tokio::time::timeout(limit, call).await.map_err(|_| {
        unavailable(
            Some(queue),
            format!("{what} did not answer within {} ms", limit.as_millis()),
        )
    })
}

/// `text` with the shared access key of `connection_string` blanked out.
fn redact(text: &str, connection_string: &str) -> String {
    let key = connection_string
        .split(';')
        .find_map(|part| part.trim().strip_prefix("SharedAccessKey="))
        .filter(|k| !k.is_empty());
    match key {
        Some(key) => text.replace(key, "<secret>"),
        None => text.to_owned(),
    }
}

fn to_offset(t: DateTime<Utc>) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        t.timestamp_nanos_opt().unwrap_or(0),
    ))
    .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn from_offset(t: time::OffsetDateTime) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(i64::try_from(t.unix_timestamp_nanos()).unwrap_or(0))
}

fn properties(p: Option<&ApplicationProperties>) -> BTreeMap<String, String> {
    p.map(|p| {
        p.0.iter()
            .filter_map(|(k, v)| match v {
                SimpleValue::String(s) => Some((k.clone(), s.clone())),
                _ => None,
            })
            .collect()
    })
    .unwrap_or_default()
}

/// Opens a client on the namespace of `settings`, within its try-timeout.
async fn open_client(
    settings: &ServiceBusSettings,
) -> Result<ServiceBusClient<azservicebus::core::BasicRetryPolicy>, TransportError> {
    // The process's one crypto provider (ring), whichever client asks first.
    orderly_tls::install_provider();
    // A short try-timeout, and no retries inside the client: its retry loop can poll a
    // send's delivery future again after it completed (fe2o3-amqp 0.14), which panics
    // ("called after complete"); seen on a loaded machine. Sends are retried here
    // instead, each on a fresh sender; a dead connection is replaced here too.
    let options = ServiceBusClientOptions {
        retry_options: ServiceBusRetryOptions {
            mode: ServiceBusRetryMode::Exponential,
            max_retries: 0,
            delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(2),
            try_timeout: settings.try_timeout,
        },
        ..Default::default()
    };
    let connecting = async {
        if settings.unsecured {
            ServiceBusClient::unsecured()
                .new_from_connection_string(settings.connection_string.as_str(), options)
                .await
        } else {
            ServiceBusClient::new_from_connection_string(
                settings.connection_string.as_str(),
                options,
            )
            .await
        }
    };
    match tokio::time::timeout(settings.try_timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        // The error may quote the connection string: never its key.
        Ok(Err(e)) => Err(unavailable(
            None,
            format!(
                "cannot connect: {}",
                redact(&e.to_string(), &settings.connection_string)
            ),
        )),
        Err(_) => Err(unavailable(
            None,
            format!(
                "cannot connect: no answer within {} ms",
                settings.try_timeout.as_millis()
            ),
        )),
    }
}

impl ServiceBusTransport {
    /// Connects to the namespace of `settings` (an error if it cannot, so that a role
    /// with wrong settings stops at start-up). `clock` judges lock expiry of
    /// prefetched messages (the system clock, or a test's manual clock).
    pub async fn connect(
        settings: &ServiceBusSettings,
        admin: Arc<dyn QueueAdmin>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TransportError> {
        let client = open_client(settings).await?;
        metrics::gauge!("orderly_servicebus_connected").set(1.0);
        Ok(Self {
            settings: settings.clone(),
            slot: Mutex::new(ConnectionSlot {
                current: Some(Arc::new(Connection::new(1, client))),
                generation: 1,
                retry_at: None,
                backoff: RECONNECT_MIN,
                last_cause: String::new(),
            }),
            held: StdMutex::default(),
            admin,
            clock,
            reconnects: AtomicU64::new(0),
        })
    }

    /// Connections rebuilt after one was lost, so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Whether a connection is up now (none while reconnecting).
    pub async fn is_connected(&self) -> bool {
        self.slot
            .lock()
            .await
            .current
            .as_ref()
            .is_some_and(|c| !c.dead.load(Ordering::Relaxed))
    }

    /// The current connection, opening a new one if the last died (not before the
    /// back-off after a failed attempt has passed).
    async fn connection(&self) -> Result<Arc<Connection>, TransportError> {
        let mut slot = self.slot.lock().await;
        if let Some(c) = &slot.current
            && !c.dead.load(Ordering::Relaxed)
        {
            return Ok(c.clone());
        }
        let now = tokio::time::Instant::now();
        if let Some(at) = slot.retry_at
            && now < at
        {
            return Err(unavailable(
                None,
                format!(
                    "connection lost ({}); reconnecting in {} ms",
                    slot.last_cause,
                    (at - now).as_millis()
                ),
            ));
        }
        if let Some(old) = slot.current.take() {
            // Close the dead client in the background; its links go with it.
            tokio::spawn(async move {
                let client = old.client.lock().await.take();
                if let Some(client) = client {
                    let _ = tokio::time::timeout(Duration::from_secs(5), client.dispose()).await;
                }
            });
        }
        match open_client(&self.settings).await {
            Ok(client) => {
                slot.generation += 1;
                slot.retry_at = None;
                slot.backoff = RECONNECT_MIN;
                let c = Arc::new(Connection::new(slot.generation, client));
                slot.current = Some(c.clone());
                self.reconnects.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("orderly_servicebus_reconnects_total").increment(1);
                metrics::gauge!("orderly_servicebus_connected").set(1.0);
                tracing::info!(
                    generation = slot.generation,
                    "Service Bus connection re-established"
                );
                Ok(c)
            }
            Err(e) => {
                // Exponential back-off with full jitter on the upper half.
                let jitter = rand_fraction();
                let pause = slot.backoff.mul_f64(0.5 + 0.5 * jitter);
                slot.retry_at = Some(now + pause);
                slot.backoff = (slot.backoff * 2).min(RECONNECT_MAX);
                slot.last_cause = e.to_string();
                tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "Service Bus reconnect failed; retrying");
                Err(e)
            }
        }
    }

    /// Records the outcome of a call on `conn`: a success resets its failure count; a
    /// failure that says the connection or session is gone, or the second in a row,
    /// takes the connection out of use (holds on it become lost locks: those messages
    /// come back by themselves when their locks expire).
    fn judge<T>(&self, conn: &Connection, queue: &QueueName, result: &Result<T, TransportError>) {
        match result {
            Ok(_) | Err(TransportError::LockLost { .. }) | Err(TransportError::Invalid(_)) => {
                conn.failures.store(0, Ordering::Relaxed);
            }
            Err(TransportError::QueueNotFound(_)) => {
                conn.drop_links(queue);
            }
            Err(e) => {
                conn.drop_links(queue);
                let failures = conn.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if (connection_gone(e) || failures >= FAILURES_BEFORE_RECONNECT)
                    && !conn.dead.swap(true, Ordering::Relaxed)
                {
                    metrics::gauge!("orderly_servicebus_connected").set(0.0);
                    tracing::warn!(queue = %queue, cause = %e, generation = conn.generation, "Service Bus connection lost, reconnecting");
                }
            }
        }
    }

    /// Sends one batch (within the size limit) in one broker call, retried on a fresh
    /// sender on a retryable failure.
    async fn send_batch(
        &self,
        queue: &QueueName,
        messages: &[OutgoingMessage],
    ) -> Result<(), TransportError> {
        let limit = self.settings.try_timeout;
        let mut attempt = 0;
        loop {
            let conn = self.connection().await?;
            let result = match self.sender(&conn, queue).await {
                Ok(sender) => {
                    let batch = messages
                        .iter()
                        .map(to_service_bus)
                        .collect::<Result<Vec<_>, _>>()?;
                    bounded(limit, queue, "a send", async {
                        sender.lock().await.send_messages(batch).await
                    })
                    .await
                    .and_then(|r| r.map_err(|e| classify(e, queue, None)))
                }
                Err(e) => Err(e),
            };
            self.judge(&conn, queue, &result);
            match result {
                // Service Bus drops duplicates silently: it cannot say how many there were.
                Ok(()) => return Ok(()),
                Err(error) => {
                    attempt += 1;
                    if !error.is_retryable() || attempt > self.settings.max_retries {
                        return Err(error);
                    }
                    // Safe to repeat: the broker drops a repeat by message id.
                    tracing::debug!(queue = %queue, attempt, error = %error, "send failed; retrying on a fresh sender");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                }
            }
        }
    }

    async fn sender(
        &self,
        conn: &Connection,
        queue: &QueueName,
    ) -> Result<Link<ServiceBusSender>, TransportError> {
        if let Some(s) = Connection::links(&conn.senders).get(queue.as_str()) {
            return Ok(s.clone());
        }
        let limit = self.settings.try_timeout;
        let attached = bounded(limit, queue, "the attach of a sender", async {
            let mut client = conn.client.lock().await;
            match client.as_mut() {
                Some(c) => c
                    .create_sender(queue.as_str(), ServiceBusSenderOptions::default())
                    .await
                    .map_err(|e| classify(e, queue, None)),
                None => Err(unavailable(Some(queue), "the connection is closing")),
            }
        })
        .await
        .and_then(|r| r)?;
        let sender = Arc::new(Mutex::new(attached));
        Connection::links(&conn.senders).insert(queue.as_str().to_owned(), sender.clone());
        Ok(sender)
    }

    async fn receiver(
        &self,
        conn: &Connection,
        queue: &QueueName,
        sub_queue: SubQueue,
    ) -> Result<Link<ServiceBusReceiver>, TransportError> {
        let dead_letters = matches!(sub_queue, SubQueue::DeadLetter);
        let cache = if dead_letters {
            &conn.dead_letter_receivers
        } else {
            &conn.receivers
        };
        if let Some(r) = Connection::links(cache).get(queue.as_str()) {
            return Ok(r.clone());
        }
        let options = ServiceBusReceiverOptions {
            receive_mode: ServiceBusReceiveMode::PeekLock,
            // Dead letters are settled by operators, never consumed in a loop: one at
            // a time is enough (a peek uses a link of its own, without prefetch).
            prefetch_count: if dead_letters { 1 } else { PREFETCH },
            sub_queue,
            ..Default::default()
        };
        let limit = self.settings.try_timeout;
        let attached = bounded(limit, queue, "the attach of a receiver", async {
            let mut client = conn.client.lock().await;
            match client.as_mut() {
                Some(c) => c
                    .create_receiver_for_queue(queue.as_str(), options)
                    .await
                    .map_err(|e| classify(e, queue, None)),
                None => Err(unavailable(Some(queue), "the connection is closing")),
            }
        })
        .await
        .and_then(|r| r)?;
        let receiver = Arc::new(Mutex::new(attached));
        Connection::links(cache).insert(queue.as_str().to_owned(), receiver.clone());
        Ok(receiver)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Held>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The delivery of `message` this transport holds, if its lock has not run out and
    /// its connection is still the current one. (The client does not wait for the
    /// broker's answer to a settlement, so a lock that ran out is caught here, on the
    /// injected clock; a settlement that races the broker's own expiry is undetectable
    /// and ends in a redelivery.)
    async fn take_held(
        &self,
        message: &ReceivedMessage,
    ) -> Result<(Arc<Connection>, Held), TransportError> {
        let lost = || TransportError::LockLost {
            queue: message.queue.clone(),
            message_id: message.message_id.clone(),
        };
        let held = self
            .held()
            .remove(&(
                message.queue.as_str().to_owned(),
                message.lock_token.0.clone(),
            ))
            .ok_or_else(lost)?;
        if held
            .message
            .lock()
            .await
            .locked_until()
            .map(from_offset)
            .is_some_and(|until| until <= self.clock.now())
        {
            return Err(lost());
        }
        let conn = self.current().await.ok_or_else(lost)?;
        if conn.generation != held.generation {
            // Received on a connection since lost: the broker let go of it.
            return Err(lost());
        }
        Ok((conn, held))
    }

    /// The current connection if it is up (no reconnect attempt).
    async fn current(&self) -> Option<Arc<Connection>> {
        self.slot
            .lock()
            .await
            .current
            .clone()
            .filter(|c| !c.dead.load(Ordering::Relaxed))
    }

    fn convert(queue: &QueueName, m: &ServiceBusReceivedMessage) -> ReceivedMessage {
        ReceivedMessage {
            queue: queue.clone(),
            message_id: m.message_id().map(|c| c.into_owned()).unwrap_or_default(),
            correlation_id: m.correlation_id().map(|c| c.into_owned()),
            properties: properties(m.application_properties()),
            body: m.body().map(<[u8]>::to_vec).unwrap_or_default(),
            delivery_count: m.delivery_count().unwrap_or(1),
            enqueued_at: from_offset(m.enqueued_time()),
            locked_until: m.locked_until().map(from_offset).unwrap_or_default(),
            lock_token: LockToken(uuid::Uuid::from_bytes(*m.lock_token().as_inner()).to_string()),
            sequence_number: m.sequence_number(),
        }
    }

    fn convert_dead(queue: &QueueName, m: &ServiceBusPeekedMessage) -> DeadLetter {
        let enqueued_at = from_offset(m.enqueued_time());
        DeadLetter {
            message: ReceivedMessage {
                queue: queue.clone(),
                message_id: m.message_id().map(|c| c.into_owned()).unwrap_or_default(),
                correlation_id: None,
                properties: properties(m.application_properties()),
                body: m.body().map(<[u8]>::to_vec).unwrap_or_default(),
                delivery_count: m.delivery_count().unwrap_or(1),
                enqueued_at,
                locked_until: enqueued_at,
                lock_token: LockToken(String::new()),
                sequence_number: m.sequence_number(),
            },
            reason: m.dead_letter_reason().unwrap_or_default().to_owned(),
            description: m
                .dead_letter_error_description()
                .unwrap_or_default()
                .to_owned(),
            dead_lettered_at: enqueued_at,
        }
    }

    /// Settles a held delivery with `call` on its link, bounded.
    async fn settle<F, E>(
        &self,
        message: &ReceivedMessage,
        what: &str,
        call: F,
    ) -> Result<(), TransportError>
    where
        E: std::error::Error + Send + Sync + 'static,
        F: for<'a> FnOnce(
            &'a mut ServiceBusReceiver,
            &'a ServiceBusReceivedMessage,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(), E>> + Send + 'a>,
        >,
    {
        let (conn, held) = self.take_held(message).await?;
        let limit = self.settings.try_timeout;
        let result = bounded(limit, &message.queue, what, async {
            let m = held.message.lock().await;
            let mut link = held.receiver.lock().await;
            call(&mut link, &m).await
        })
        .await
        .and_then(|r| r.map_err(|e| classify(e, &message.queue, Some(&message.message_id))));
        self.judge(&conn, &message.queue, &result);
        result
    }
}

/// A fraction in [0, 1) for jitter, without a random-number dependency.
fn rand_fraction() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    f64::from(nanos % 1_000_000) / 1_000_000.0
}

/// What a message weighs on the wire, near enough to pack batches: its body, id,
/// correlation id and properties, and a fixed allowance for the AMQP framing of its
/// sections (header, properties, annotations) and its place in the batch.
pub fn wire_size(m: &OutgoingMessage) -> usize {
    const FRAMING: usize = 256;
    m.body.len()
        + m.message_id.len()
        + m.correlation_id.as_ref().map_or(0, String::len)
        + m.properties
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum::<usize>()
        + FRAMING
}

/// Splits `messages` into consecutive batches of at most `max` bytes each
/// ([`wire_size`]); a message that alone is over `max` is refused, naming `queue` and
/// the sizes, before anything is sent.
pub fn batches<'m>(
    queue: &QueueName,
    messages: &'m [OutgoingMessage],
    max: usize,
) -> Result<Vec<&'m [OutgoingMessage]>, TransportError> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, m) in messages.iter().enumerate() {
        let w = wire_size(m);
        if w > max {
            return Err(ValidationError::new(
                "message",
                format!(
                    "{} is {w} bytes, over the {max} bytes a message to {queue} may have \
                     (ORDERLY_SERVICEBUS_MAX_BATCH_BYTES; Service Bus Standard allows 256 KB): nothing sent",
                    m.message_id
                ),
            )
            .into());
        }
        if size + w > max {
            out.push(&messages[start..i]);
            (start, size) = (i, 0);
        }
        size += w;
    }
    if start < messages.len() {
        out.push(&messages[start..]);
    }
    Ok(out)
}

fn to_service_bus(m: &OutgoingMessage) -> Result<ServiceBusMessage, TransportError> {
    let mut sb = ServiceBusMessage::new(m.body.clone());
    sb.set_message_id(m.message_id.clone()).map_err(|e| {
        TransportError::Invalid(ValidationError::new("message_id", format!("{e:?}")))
    })?;
    sb.set_correlation_id(m.correlation_id.clone());
    if !m.properties.is_empty() {
        let mut map = OrderedMap::new();
        for (k, v) in &m.properties {
            map.insert(k.clone(), SimpleValue::String(v.clone()));
        }
        *sb.application_properties_mut() = Some(ApplicationProperties(map));
    }
    if let Some(at) = m.scheduled_enqueue_time {
        sb.set_scheduled_enqueue_time(to_offset(at));
    }
    Ok(sb)
}

#[async_trait]
impl Transport for ServiceBusTransport {
    async fn declare_queue(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<(), TransportError> {
        settings.validate()?;
        self.admin.declare(queue, settings).await
    }

    async fn ensure_queue(
        &self,
        queue: &QueueName,
        settings: &QueueSettings,
    ) -> Result<bool, TransportError> {
        settings.validate()?;
        let created = self.admin.ensure(queue, settings).await?;
        // Service Bus refuses a link to an entity that does not exist (amqp:not-found):
        // a sender's attach is the check, and consumes nothing.
        let conn = self.connection().await?;
        let result = self.sender(&conn, queue).await.map(|_| ());
        self.judge(&conn, queue, &result);
        result.map(|()| created)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %queue, count = messages.len()))]
    async fn send(
        &self,
        queue: &QueueName,
        messages: &[OutgoingMessage],
    ) -> Result<SendOutcome, TransportError> {
        if messages.len() > MAX_MESSAGES as usize {
            return Err(ValidationError::new(
                "messages",
                format!("at most {MAX_MESSAGES} per send"),
            )
            .into());
        }
        for m in messages {
            m.validate()?;
            to_service_bus(m)?;
        }
        if messages.is_empty() {
            return Ok(SendOutcome::default());
        }
        // One batch per broker call, each within the entity's size; one after the
        // other, each retried on its own (a repeat of one already taken is dropped by
        // message id).
        let parts = batches(queue, messages, self.settings.max_batch_bytes)?;
        if parts.len() > 1 {
            tracing::debug!(queue = %queue, batches = parts.len(), "send split by size");
        }
        for part in parts {
            self.send_batch(queue, part).await?;
        }
        Ok(SendOutcome {
            accepted: messages.len(),
            duplicates: 0,
        })
    }

    async fn receive(
        &self,
        queue: &QueueName,
        max: u32,
        wait: Duration,
    ) -> Result<Vec<ReceivedMessage>, TransportError> {
        if max == 0 || max > MAX_MESSAGES {
            return Err(ValidationError::new("max", format!("must be 1 to {MAX_MESSAGES}")).into());
        }
        let conn = self.connection().await?;
        let receiver = match self.receiver(&conn, queue, SubQueue::None).await {
            Ok(r) => r,
            Err(e) => {
                let failed = Err::<(), _>(e);
                self.judge(&conn, queue, &failed);
                return failed.map(|()| Vec::new());
            }
        };
        let limit = self.settings.try_timeout;
        let deadline = tokio::time::Instant::now() + wait.max(MIN_RECEIVE_WAIT);
        let mut got: Vec<ServiceBusReceivedMessage> = Vec::new();
        let result: Result<(), TransportError> = async {
            // Wait for the first message, slice by slice (a settlement of this queue
            // gets the link between two slices), then take what else is already here.
            loop {
                let now = tokio::time::Instant::now();
                let (want, slice) = if got.is_empty() {
                    if now >= deadline {
                        return Ok(());
                    }
                    (1, (deadline - now).min(RECEIVE_SLICE))
                } else {
                    (max - got.len() as u32, DRAIN_WAIT)
                };
                let batch = bounded(slice + limit, queue, "a receive", async {
                    receiver
                        .lock()
                        .await
                        .receive_messages_with_max_wait_time(want, slice)
                        .await
                })
                .await
                .and_then(|r| r.map_err(|e| classify(e, queue, None)))?;
                let first = got.is_empty();
                let arrived = batch.len();
                // A prefetched message whose lock ran out while it waited in the
                // buffer has been (or will be) delivered again: drop the stale copy.
                let now = self.clock.now();
                got.extend(
                    batch
                        .into_iter()
                        .filter(|m| m.locked_until().map(from_offset).is_none_or(|t| t > now)),
                );
                if got.len() as u32 >= max || (!first && arrived == 0) {
                    return Ok(());
                }
            }
        }
        .await;
        self.judge(&conn, queue, &result);
        // What was received before a failure is still handed out: settling it on a
        // dead link fails as a lost lock, and the broker delivers it again.
        if got.is_empty() {
            result?;
        }
        let mut held = self.held();
        // Forget holds whose lock has passed: settling them is refused anyway, and a
        // consumer that lets a lock run out on purpose (an agent past its deadline
        // sends nothing) would otherwise leave them here forever.
        let now = self.clock.now();
        held.retain(|_, h| {
            // One being renewed right now stays.
            h.message.try_lock().map_or(true, |m| {
                m.locked_until()
                    .map(from_offset)
                    .is_none_or(|until| until > now)
            })
        });
        Ok(got
            .into_iter()
            .map(|m| {
                let converted = Self::convert(queue, &m);
                held.insert(
                    (queue.as_str().to_owned(), converted.lock_token.0.clone()),
                    Held {
                        generation: conn.generation,
                        receiver: receiver.clone(),
                        message: Arc::new(Mutex::new(m)),
                    },
                );
                converted
            })
            .collect())
    }

    async fn complete(&self, message: &ReceivedMessage) -> Result<(), TransportError> {
        self.settle(message, "a completion", |link, m| {
            Box::pin(link.complete_message(m))
        })
        .await
    }

    async fn abandon(&self, message: &ReceivedMessage) -> Result<(), TransportError> {
        self.settle(message, "an abandon", |link, m| {
            Box::pin(link.abandon_message(m, None))
        })
        .await
    }

    async fn dead_letter(
        &self,
        message: &ReceivedMessage,
        reason: &str,
        description: &str,
    ) -> Result<(), TransportError> {
        if reason.is_empty() {
            return Err(ValidationError::new("reason", "a dead letter needs a reason").into());
        }
        let options = DeadLetterOptions {
            dead_letter_reason: Some(reason.to_owned()),
            dead_letter_error_description: Some(description.to_owned()),
            properties_to_modify: None,
        };
        self.settle(message, "a dead-lettering", move |link, m| {
            Box::pin(link.dead_letter_message(m, options))
        })
        .await
    }

    async fn renew_lock(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>, TransportError> {
        let key = (
            message.queue.as_str().to_owned(),
            message.lock_token.0.clone(),
        );
        let lost = || TransportError::LockLost {
            queue: message.queue.clone(),
            message_id: message.message_id.clone(),
        };
        // Take what the renewal needs and let go of the holds: no lock on them is kept
        // across the network call, only this message's own.
        let (generation, receiver, held_message) = {
            let held = self.held();
            let h = held.get(&key).ok_or_else(lost)?;
            (h.generation, h.receiver.clone(), h.message.clone())
        };
        let conn = self.current().await.ok_or_else(lost)?;
        if conn.generation != generation {
            self.held().remove(&key);
            return Err(lost());
        }
        let limit = self.settings.try_timeout;
        let result = bounded(limit, &message.queue, "a lock renewal", async {
            let mut m = held_message.lock().await;
            let renewed = receiver.lock().await.renew_message_lock(&mut m).await;
            renewed.map(|()| m.locked_until().map(from_offset).unwrap_or_default())
        })
        .await
        .and_then(|r| r.map_err(|e| classify(e, &message.queue, Some(&message.message_id))));
        self.judge(&conn, &message.queue, &result);
        if result.is_err() {
            self.held().remove(&key);
        }
        result
    }

    async fn dead_letters(
        &self,
        queue: &QueueName,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        let peeked = self
            .peek(queue, SubQueue::DeadLetter, limit.clamp(1, MAX_MESSAGES), 0)
            .await?;
        Ok(peeked
            .iter()
            .map(|m| Self::convert_dead(queue, m))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    const GOOD: &str =
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=app;SharedAccessKey=s3cr3t=";

    #[test]
    fn settings_come_from_the_environment() {
        let s = ServiceBusSettings::from_vars(vars(&[("ORDERLY_SERVICEBUS_CONNECTION", GOOD)]))
            .unwrap();
        assert!(!s.unsecured);
        let s = ServiceBusSettings::from_vars(vars(&[
            ("ORDERLY_SERVICEBUS_CONNECTION", GOOD),
            ("ORDERLY_SERVICEBUS_UNSECURED", "true"),
        ]))
        .unwrap();
        assert!(s.unsecured);
    }

    #[test]
    fn bad_settings_name_the_variable_and_never_show_the_secret() {
        let missing = ServiceBusSettings::from_vars(vars(&[])).unwrap_err();
        assert_eq!(missing.field, "ORDERLY_SERVICEBUS_CONNECTION");
        let odd = ServiceBusSettings::from_vars(vars(&[(
            "ORDERLY_SERVICEBUS_CONNECTION",
            "s3cr3t-garbage",
        )]))
        .unwrap_err();
        assert_eq!(odd.field, "ORDERLY_SERVICEBUS_CONNECTION");
        assert!(!odd.to_string().contains("s3cr3t"));
        let flag = ServiceBusSettings::from_vars(vars(&[
            ("ORDERLY_SERVICEBUS_CONNECTION", GOOD),
            ("ORDERLY_SERVICEBUS_UNSECURED", "yes"),
        ]))
        .unwrap_err();
        assert_eq!(flag.field, "ORDERLY_SERVICEBUS_UNSECURED");
        let s = ServiceBusSettings::new(GOOD);
        assert!(
            !format!("{s:?}").contains("s3cr3t"),
            "Debug hides the connection string"
        );
        assert_eq!(
            redact("failed for SharedAccessKey=s3cr3t=", GOOD),
            "failed for SharedAccessKey=<secret>"
        );
    }
}
