//! Azure Service Bus as an orderly transport.
//!
//! Designed around the known behaviour of `azservicebus` 0.25 (DESIGN.md §9):
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
use tokio::sync::Mutex;

/// Messages a receiver may hold unsettled at once (fe2o3 grants new credit only as
/// deliveries are settled). At least 1: with none, a receive that times out can leave
/// the link stuck (DESIGN.md §9).
pub const PREFETCH: u32 = 32;

/// Shortest time a receive waits: over a network, "no wait" would return before
/// messages already in the queue had a chance to arrive.
pub const MIN_RECEIVE_WAIT: Duration = Duration::from_millis(300);

/// After the first messages of a receive, how long to wait for each further one.
const DRAIN_WAIT: Duration = Duration::from_millis(50);

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
}

impl std::fmt::Debug for ServiceBusSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusSettings")
            .field("connection_string", &"<secret>")
            .field("unsecured", &self.unsecured)
            .field("try_timeout", &self.try_timeout)
            .field("max_retries", &self.max_retries)
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
        Ok(Self {
            unsecured,
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

type Held = HashMap<(String, String), (Arc<Mutex<ServiceBusReceiver>>, ServiceBusReceivedMessage)>;

/// The Service Bus transport: one AMQP connection, a sender and a receiver per queue.
pub struct ServiceBusTransport {
    client: Mutex<ServiceBusClient<azservicebus::core::BasicRetryPolicy>>,
    senders: Mutex<HashMap<String, Arc<Mutex<ServiceBusSender>>>>,
    receivers: Mutex<HashMap<String, Arc<Mutex<ServiceBusReceiver>>>>,
    dead_letter_receivers: Mutex<HashMap<String, Arc<Mutex<ServiceBusReceiver>>>>,
    held: Mutex<Held>,
    admin: Arc<dyn QueueAdmin>,
    clock: Arc<dyn Clock>,
    /// Retries of a send, each on a fresh sender (the client itself retries nothing).
    send_retries: u32,
    /// The most one attempt of one call may take.
    try_timeout: Duration,
}

impl std::fmt::Debug for ServiceBusTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBusTransport")
            .finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> TransportError {
    TransportError::Unavailable(Box::new(e))
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
    unavailable(e)
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

impl ServiceBusTransport {
    /// Connects to the namespace of `settings`. `clock` judges lock expiry of
    /// prefetched messages (the system clock, or a test's manual clock).
    pub async fn connect(
        settings: &ServiceBusSettings,
        admin: Arc<dyn QueueAdmin>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, TransportError> {
        // Both ring and aws-lc-rs end up in the dependency graph: pick one for the process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // A short try-timeout, and no retries inside the client: its retry loop can poll
        // a send's delivery future again after it completed (fe2o3-amqp 0.14), which
        // panics ("called after complete"); seen on a loaded machine. Sends are retried
        // here instead, each on a fresh sender; callers retry the rest.
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
        let client = if settings.unsecured {
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
        .map_err(|e| {
            // The error may quote the connection string: never its key.
            let text = redact(&e.to_string(), &settings.connection_string);
            TransportError::Unavailable(format!("cannot connect to Service Bus: {text}").into())
        })?;
        Ok(Self {
            client: Mutex::new(client),
            senders: Mutex::default(),
            receivers: Mutex::default(),
            dead_letter_receivers: Mutex::default(),
            held: Mutex::default(),
            admin,
            clock,
            send_retries: settings.max_retries,
            try_timeout: settings.try_timeout,
        })
    }

    async fn sender(
        &self,
        queue: &QueueName,
    ) -> Result<Arc<Mutex<ServiceBusSender>>, TransportError> {
        if let Some(s) = self.senders.lock().await.get(queue.as_str()) {
            return Ok(s.clone());
        }
        let sender = self
            .client
            .lock()
            .await
            .create_sender(queue.as_str(), ServiceBusSenderOptions::default())
            .await
            .map_err(|e| classify(e, queue, None))?;
        let sender = Arc::new(Mutex::new(sender));
        self.senders
            .lock()
            .await
            .insert(queue.as_str().to_owned(), sender.clone());
        Ok(sender)
    }

    async fn receiver(
        &self,
        queue: &QueueName,
        sub_queue: SubQueue,
    ) -> Result<Arc<Mutex<ServiceBusReceiver>>, TransportError> {
        let cache = if matches!(sub_queue, SubQueue::DeadLetter) {
            &self.dead_letter_receivers
        } else {
            &self.receivers
        };
        if let Some(r) = cache.lock().await.get(queue.as_str()) {
            return Ok(r.clone());
        }
        let options = ServiceBusReceiverOptions {
            receive_mode: ServiceBusReceiveMode::PeekLock,
            prefetch_count: PREFETCH,
            sub_queue,
            ..Default::default()
        };
        let receiver = self
            .client
            .lock()
            .await
            .create_receiver_for_queue(queue.as_str(), options)
            .await
            .map_err(|e| classify(e, queue, None))?;
        let receiver = Arc::new(Mutex::new(receiver));
        cache
            .lock()
            .await
            .insert(queue.as_str().to_owned(), receiver.clone());
        Ok(receiver)
    }

    /// Takes a failed link out of use: the next call opens a fresh one.
    async fn drop_links(&self, queue: &QueueName) {
        self.senders.lock().await.remove(queue.as_str());
        self.receivers.lock().await.remove(queue.as_str());
    }

    /// The delivery of `message` this transport holds, if its lock has not run out.
    /// (The client does not wait for the broker's answer to a settlement, so a lock
    /// that ran out is caught here, on the injected clock; a settlement that races the
    /// broker's own expiry is undetectable and ends in a redelivery.)
    async fn take_held(
        &self,
        message: &ReceivedMessage,
    ) -> Result<(Arc<Mutex<ServiceBusReceiver>>, ServiceBusReceivedMessage), TransportError> {
        let lost = || TransportError::LockLost {
            queue: message.queue.clone(),
            message_id: message.message_id.clone(),
        };
        let (receiver, m) = self
            .held
            .lock()
            .await
            .remove(&(
                message.queue.as_str().to_owned(),
                message.lock_token.0.clone(),
            ))
            .ok_or_else(lost)?;
        if m.locked_until()
            .map(from_offset)
            .is_some_and(|until| until <= self.clock.now())
        {
            return Err(lost());
        }
        Ok((receiver, m))
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
        match tokio::time::timeout(self.try_timeout, self.sender(queue)).await {
            Ok(Ok(_)) => Ok(created),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TransportError::Unavailable(
                format!(
                    "Service Bus did not answer the attach of a sender to queue {queue} within {} ms",
                    self.try_timeout.as_millis()
                )
                .into(),
            )),
        }
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
        let converted = messages
            .iter()
            .map(|m| m.validate().and_then(|()| to_service_bus(m)))
            .collect::<Result<Vec<_>, _>>()?;
        if converted.is_empty() {
            return Ok(SendOutcome::default());
        }
        let mut batch = converted;
        let mut attempt = 0;
        loop {
            let sender = self.sender(queue).await?;
            let result = sender.lock().await.send_messages(batch).await;
            match result {
                // Service Bus drops duplicates silently: it cannot say how many there were.
                Ok(()) => {
                    return Ok(SendOutcome {
                        accepted: messages.len(),
                        duplicates: 0,
                    });
                }
                Err(e) => {
                    self.drop_links(queue).await;
                    let error = classify(e, queue, None);
                    attempt += 1;
                    if !error.is_retryable() || attempt > self.send_retries {
                        return Err(error);
                    }
                    // Safe to repeat: the broker drops a repeat by message id.
                    tracing::debug!(queue = %queue, attempt, error = %error, "send failed; retrying on a fresh sender");
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                    batch = messages
                        .iter()
                        .map(to_service_bus)
                        .collect::<Result<Vec<_>, _>>()?;
                }
            }
        }
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
        let receiver = self.receiver(queue, SubQueue::None).await?;
        let got =
            {
                let mut link = receiver.lock().await;
                let mut got = Vec::new();
                // The client returns as soon as it holds a message; keep collecting while
                // more arrive promptly, up to `max`.
                let mut wait = wait.max(MIN_RECEIVE_WAIT);
                loop {
                    let want = max - got.len() as u32;
                    match link.receive_messages_with_max_wait_time(want, wait).await {
                        Ok(batch) if batch.is_empty() => break,
                        Ok(batch) => {
                            // A prefetched message whose lock ran out while it waited in the
                            // buffer has been (or will be) delivered again: drop the stale copy.
                            let now = self.clock.now();
                            got.extend(batch.into_iter().filter(|m| {
                                m.locked_until().map(from_offset).is_none_or(|t| t > now)
                            }));
                        }
                        Err(e) => {
                            drop(link);
                            // A stalled or broken link is replaced on the next receive; what
                            // it held comes back when its locks expire.
                            self.drop_links(queue).await;
                            return Err(classify(e, queue, None));
                        }
                    }
                    if got.len() as u32 >= max {
                        break;
                    }
                    wait = DRAIN_WAIT;
                }
                got
            };
        let mut held = self.held.lock().await;
        // Forget holds whose lock has passed: settling them is refused anyway, and a
        // consumer that lets a lock run out on purpose (an agent past its deadline
        // sends nothing) would otherwise leave them here forever.
        let now = self.clock.now();
        held.retain(|_, (_, m)| {
            m.locked_until()
                .map(from_offset)
                .is_none_or(|until| until > now)
        });
        Ok(got
            .into_iter()
            .map(|m| {
                let converted = Self::convert(queue, &m);
                held.insert(
                    (queue.as_str().to_owned(), converted.lock_token.0.clone()),
                    (receiver.clone(), m),
                );
                converted
            })
            .collect())
    }

    async fn complete(&self, message: &ReceivedMessage) -> Result<(), TransportError> {
        let (receiver, m) = self.take_held(message).await?;
        let result = receiver.lock().await.complete_message(&m).await;
        result.map_err(|e| classify(e, &message.queue, Some(&message.message_id)))
    }

    async fn abandon(&self, message: &ReceivedMessage) -> Result<(), TransportError> {
        let (receiver, m) = self.take_held(message).await?;
        let result = receiver.lock().await.abandon_message(&m, None).await;
        result.map_err(|e| classify(e, &message.queue, Some(&message.message_id)))
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
        let (receiver, m) = self.take_held(message).await?;
        let options = DeadLetterOptions {
            dead_letter_reason: Some(reason.to_owned()),
            dead_letter_error_description: Some(description.to_owned()),
            properties_to_modify: None,
        };
        let result = receiver.lock().await.dead_letter_message(&m, options).await;
        result.map_err(|e| classify(e, &message.queue, Some(&message.message_id)))
    }

    async fn renew_lock(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>, TransportError> {
        let key = (
            message.queue.as_str().to_owned(),
            message.lock_token.0.clone(),
        );
        let mut held = self.held.lock().await;
        let Some((receiver, m)) = held.get_mut(&key) else {
            return Err(TransportError::LockLost {
                queue: message.queue.clone(),
                message_id: message.message_id.clone(),
            });
        };
        let result = receiver.lock().await.renew_message_lock(m).await;
        match result {
            Ok(()) => Ok(m.locked_until().map(from_offset).unwrap_or_default()),
            Err(e) => {
                held.remove(&key);
                Err(classify(e, &message.queue, Some(&message.message_id)))
            }
        }
    }

    async fn dead_letters(
        &self,
        queue: &QueueName,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, TransportError> {
        let receiver = self.receiver(queue, SubQueue::DeadLetter).await?;
        let peeked = receiver
            .lock()
            .await
            .peek_messages(limit.clamp(1, MAX_MESSAGES), Some(0))
            .await;
        match peeked {
            Ok(peeked) => Ok(peeked
                .iter()
                .map(|m| Self::convert_dead(queue, m))
                .collect()),
            Err(e) => {
                self.dead_letter_receivers
                    .lock()
                    .await
                    .remove(queue.as_str());
                Err(classify(e, queue, None))
            }
        }
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
