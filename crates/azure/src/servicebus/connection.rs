//! The transport's one connection at a time: connecting, reconnecting with back-off,
//! the links opened on it, and the deliveries this process holds.

use super::{
    PREFETCH, QueueAdmin, ServiceBusAuth, ServiceBusSettings, ServiceBusTransport, bounded,
    classify, connection_gone, from_offset, properties, rand_fraction, timed_out, to_service_bus,
    unavailable,
};
use azservicebus::primitives::service_bus_retry_options::ServiceBusRetryOptions;
use azservicebus::{
    ServiceBusClient, ServiceBusClientOptions, ServiceBusPeekedMessage, ServiceBusReceiveMode,
    ServiceBusReceivedMessage, ServiceBusReceiver, ServiceBusReceiverOptions, ServiceBusRetryMode,
    ServiceBusSender, ServiceBusSenderOptions, SubQueue,
};
use orderly_core::Clock;
use orderly_core::transport::{
    DeadLetter, LockToken, OutgoingMessage, QueueName, ReceivedMessage, TransportError,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

/// The Service Bus client of one connection.
pub(super) type Client = ServiceBusClient<azservicebus::core::BasicRetryPolicy>;

/// A link shared by the calls of one queue (a receiver's also by the settlements of
/// what it delivered).
pub(super) type Link<T> = Arc<Mutex<Closing<T>>>;

/// Where a connection keeps one kind of its links, by queue.
pub(super) type LinkCache<T> = fn(&Connection) -> &StdMutex<HashMap<String, Link<T>>>;

/// How long a link taken out of use may take to close.
const LINK_CLOSE: Duration = Duration::from_secs(5);

/// A link that is closed, not just dropped, when it goes out of use. Dropping an
/// fe2o3-amqp link sends its detach but stops listening, so the broker's answering
/// detach finds nobody and the client ends the whole session
/// (amqp:session:unattached-handle), taking every other link and hold with it. Closing
/// waits for that answer, in a task of its own, bounded.
pub(super) struct Closing<T: Close>(Option<T>);

/// A link that can close itself, waiting for the broker's answer.
pub(super) trait Close: Send + 'static {
    fn close(self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
}

impl Close for ServiceBusSender {
    fn close(self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move {
            let _ = self.dispose().await;
        })
    }
}

impl Close for ServiceBusReceiver {
    fn close(self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move {
            let _ = self.dispose().await;
        })
    }
}

impl<T: Close> Closing<T> {
    pub(super) fn new(link: T) -> Self {
        Self(Some(link))
    }

    /// Closes `link` now if this is its last user (else its last user's drop does).
    pub(super) async fn close_now(link: Link<T>) {
        if let Ok(mut closing) = Arc::try_unwrap(link).map(Mutex::into_inner)
            && let Some(link) = closing.0.take()
        {
            let _ = tokio::time::timeout(LINK_CLOSE, link.close()).await;
        }
    }
}

impl<T: Close> std::ops::Deref for Closing<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("a link is taken only when dropped")
    }
}

impl<T: Close> std::ops::DerefMut for Closing<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("a link is taken only when dropped")
    }
}

impl<T: Close> Drop for Closing<T> {
    fn drop(&mut self) {
        let Some(link) = self.0.take() else { return };
        // Outside a runtime (the process is ending) there is no session left to end.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(LINK_CLOSE, link.close()).await;
            });
        }
    }
}

/// One delivery this process holds: settled on the link it came from, and only while
/// that link's connection is the current one.
pub(super) struct Held {
    pub(super) generation: u64,
    pub(super) receiver: Link<ServiceBusReceiver>,
    /// Locked only by a renewal or a settlement of this very message.
    pub(super) message: Arc<Mutex<ServiceBusReceivedMessage>>,
}

/// One AMQP connection and the links opened on it. Replaced as a whole when it dies.
pub(super) struct Connection {
    pub(super) generation: u64,
    /// Creating a link needs the client exclusively; held only for the (bounded) attach.
    pub(super) client: Mutex<Option<ServiceBusClient<azservicebus::core::BasicRetryPolicy>>>,
    pub(super) senders: StdMutex<HashMap<String, Link<ServiceBusSender>>>,
    pub(super) receivers: StdMutex<HashMap<String, Link<ServiceBusReceiver>>>,
    pub(super) dead_letter_receivers: StdMutex<HashMap<String, Link<ServiceBusReceiver>>>,
    /// Set when a failure says the connection or its session is gone.
    pub(super) dead: AtomicBool,
    /// Calls that failed in a row, by queue (any success on the connection resets
    /// them all: it is alive).
    pub(super) failures: StdMutex<HashMap<String, u32>>,
}

impl Connection {
    pub(super) fn new(
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
            failures: StdMutex::default(),
        }
    }

    pub(super) fn links<T: Close>(
        map: &StdMutex<HashMap<String, Link<T>>>,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Link<T>>> {
        map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a queue's links out of use: the next call opens fresh ones.
    pub(super) fn drop_links(&self, queue: &QueueName) {
        for links in [Links::Sender, Links::Receiver, Links::DeadLetters] {
            self.drop_link(queue, links);
        }
    }

    /// Takes one of a queue's links out of use (a receiver's prefetched messages go
    /// back to the broker with it: kept when only the sender failed).
    pub(super) fn drop_link(&self, queue: &QueueName, links: Links) {
        match links {
            Links::Sender => drop(Self::links(&self.senders).remove(queue.as_str())),
            Links::Receiver => drop(Self::links(&self.receivers).remove(queue.as_str())),
            Links::DeadLetters => {
                drop(Self::links(&self.dead_letter_receivers).remove(queue.as_str()))
            }
            Links::Own => {}
        }
    }
}

/// Which of a queue's links a call used, for [`ServiceBusTransport::judge`].
#[derive(Clone, Copy, Debug)]
pub(super) enum Links {
    Sender,
    Receiver,
    DeadLetters,
    /// A link of the call's own, closed by the call itself.
    Own,
}

/// The current connection, and when to try again after a failed attempt.
pub(super) struct ConnectionSlot {
    pub(super) current: Option<Arc<Connection>>,
    pub(super) generation: u64,
    pub(super) retry_at: Option<tokio::time::Instant>,
    pub(super) backoff: Duration,
    pub(super) last_cause: String,
}

/// First pause before reconnecting after a failed attempt, and the longest.
pub(super) const RECONNECT_MIN: Duration = Duration::from_millis(200);
pub(super) const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A receive waits for its first message in slices of this long, letting settlements
/// of the same queue in between (the link needs exclusive use for both).
pub(super) const RECEIVE_SLICE: Duration = Duration::from_millis(50);
/// How many try-timeouts an attach may go unanswered before its connection is retired
/// (30 s by default). Its caller stops waiting after one.
pub(super) const ATTACH_GIVE_UP_TRIES: u32 = 3;
/// Failures in a row after which a connection is taken for dead even if no error said so.
pub(super) const FAILURES_BEFORE_RECONNECT: u32 = 2;

/// Opens a client on the namespace of `settings`, within its try-timeout.
pub(super) async fn open_client(
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
        match (&settings.auth, settings.unsecured) {
            (ServiceBusAuth::ConnectionString(cs), true) => {
                ServiceBusClient::unsecured()
                    .new_from_connection_string(cs.as_str(), options)
                    .await
            }
            (ServiceBusAuth::ConnectionString(cs), false) => {
                ServiceBusClient::new_from_connection_string(cs.as_str(), options).await
            }
            (
                ServiceBusAuth::Entra {
                    namespace,
                    credential,
                    source,
                },
                unsecured,
            ) => {
                let bridged = super::entra::Bridged::new(credential.clone(), source.clone());
                if unsecured {
                    ServiceBusClient::unsecured()
                        .new_from_token_credential(namespace.as_str(), bridged, options)
                        .await
                } else {
                    ServiceBusClient::new_from_token_credential(
                        namespace.as_str(),
                        bridged,
                        options,
                    )
                    .await
                }
            }
        }
    };
    match tokio::time::timeout(settings.try_timeout, connecting).await {
        Ok(Ok(client)) => Ok(client),
        // The error may quote the connection string: never its key.
        Ok(Err(e)) => Err(unavailable(
            None,
            format!(
                "cannot connect: {}",
                settings.redact(&orderly_core::error::causes(&e))
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
    pub(super) async fn connection(&self) -> Result<Arc<Connection>, TransportError> {
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
                slot.last_cause.clear();
                Ok(c)
            }
            Err(e) => {
                // Exponential back-off with full jitter on the upper half.
                let jitter = rand_fraction();
                let pause = slot.backoff.mul_f64(0.5 + 0.5 * jitter);
                slot.retry_at = Some(now + pause);
                slot.backoff = (slot.backoff * 2).min(RECONNECT_MAX);
                // Logged when the failing begins or its cause changes; the same
                // cause again, at every back-off, only at debug.
                let cause = e.to_string();
                if cause != slot.last_cause {
                    tracing::warn!(error = %cause, retry_in_ms = pause.as_millis() as u64, "Service Bus reconnect failed; retrying (logged again if the cause changes)");
                } else {
                    tracing::debug!(error = %cause, retry_in_ms = pause.as_millis() as u64, "Service Bus reconnect failed again");
                }
                slot.last_cause = cause;
                Err(e)
            }
        }
    }

    /// Records the outcome of a call on `conn`: a success resets its failure counts; a
    /// failure that says the connection or session is gone, or the second in a row on
    /// one queue, takes the connection out of use (holds on it become lost locks: those
    /// messages come back by themselves when their locks expire). Failures are counted
    /// by queue so that one queue's trouble (a renewal the broker does not answer, or a
    /// send whose outcome the client lost) does not add up with another's to retire a
    /// connection that works: fe2o3-amqp 0.14 writes a transfer before it records it as
    /// unsettled, so a broker's quick answer can overtake that record on a loaded
    /// machine, and the send then waits out its try-timeout although it went through.
    pub(super) fn judge<T>(
        &self,
        conn: &Connection,
        queue: &QueueName,
        used: Links,
        result: &Result<T, TransportError>,
    ) {
        match result {
            Ok(_) | Err(TransportError::LockLost { .. }) | Err(TransportError::Invalid(_)) => {
                let mut failures = conn.failures.lock().unwrap_or_else(|p| p.into_inner());
                if !failures.is_empty() {
                    failures.clear();
                }
            }
            Err(TransportError::QueueNotFound(_)) => {
                conn.drop_links(queue);
            }
            Err(e) => {
                // A link that only failed to answer in time is kept (with what it has
                // prefetched): the failure counts, and a second in a row retires the
                // whole connection with its links.
                if !timed_out(e) {
                    conn.drop_link(queue, used);
                }
                let failures = {
                    let mut counts = conn.failures.lock().unwrap_or_else(|p| p.into_inner());
                    let count = counts.entry(queue.as_str().to_owned()).or_insert(0);
                    *count += 1;
                    *count
                };
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
    pub(super) async fn send_batch(
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
            self.judge(&conn, queue, Links::Sender, &result);
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

    pub(super) async fn sender(
        &self,
        conn: &Arc<Connection>,
        queue: &QueueName,
    ) -> Result<Link<ServiceBusSender>, TransportError> {
        if let Some(s) = Connection::links(&conn.senders).get(queue.as_str()) {
            return Ok(s.clone());
        }
        let q = queue.clone();
        let cache: LinkCache<ServiceBusSender> = |c| &c.senders;
        self.attach(
            conn,
            queue,
            "the attach of a sender",
            Some(cache),
            move |client| {
                Box::pin(async move {
                    client
                        .create_sender(q.as_str(), ServiceBusSenderOptions::default())
                        .await
                        .map_err(|e| classify(e, &q, None))
                })
            },
        )
        .await
    }

    pub(super) async fn receiver(
        &self,
        conn: &Arc<Connection>,
        queue: &QueueName,
        sub_queue: SubQueue,
    ) -> Result<Link<ServiceBusReceiver>, TransportError> {
        let dead_letters = matches!(sub_queue, SubQueue::DeadLetter);
        let cache: LinkCache<ServiceBusReceiver> = if dead_letters {
            |c| &c.dead_letter_receivers
        } else {
            |c| &c.receivers
        };
        if let Some(r) = Connection::links(cache(conn)).get(queue.as_str()) {
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
        self.attach_receiver(
            conn,
            queue,
            "the attach of a receiver",
            Some(cache),
            options,
        )
        .await
    }

    /// [`Self::attach`] of a receiver of `queue` with `options`.
    pub(super) async fn attach_receiver(
        &self,
        conn: &Arc<Connection>,
        queue: &QueueName,
        what: &'static str,
        cache: Option<LinkCache<ServiceBusReceiver>>,
        options: ServiceBusReceiverOptions,
    ) -> Result<Link<ServiceBusReceiver>, TransportError> {
        let q = queue.clone();
        self.attach(conn, queue, what, cache, move |client| {
            Box::pin(async move {
                client
                    .create_receiver_for_queue(q.as_str(), options)
                    .await
                    .map_err(|e| classify(e, &q, None))
            })
        })
        .await
    }

    /// Opens a link of `queue` on `conn` with `open`, kept in `cache` if one is given
    /// (a link of the caller's own otherwise). The caller waits the try-timeout; the
    /// attach itself always runs to its end in a task of its own: given up half-way, it
    /// would leave the client's session an answer for a link nobody waits for, and the
    /// session (fe2o3-amqp) then ends with amqp:session:unattached-handle, taking every
    /// link and hold on it along. A cached link attached after its caller left is kept
    /// for the next call; an uncached one is closed. An attach still unanswered after
    /// [`ATTACH_GIVE_UP_TRIES`] try-timeouts retires the connection: a broker that
    /// silent has lost the session anyway.
    pub(super) async fn attach<T, F>(
        &self,
        conn: &Arc<Connection>,
        queue: &QueueName,
        what: &'static str,
        cache: Option<LinkCache<T>>,
        open: F,
    ) -> Result<Link<T>, TransportError>
    where
        T: Close,
        F: for<'c> FnOnce(
                &'c mut Client,
            ) -> std::pin::Pin<
                Box<dyn std::future::Future<Output = Result<T, TransportError>> + Send + 'c>,
            > + Send
            + 'static,
    {
        let limit = self.settings.try_timeout;
        let give_up = limit * ATTACH_GIVE_UP_TRIES;
        let task = tokio::spawn({
            let conn = conn.clone();
            let queue = queue.clone();
            async move {
                let attached = tokio::time::timeout(give_up, async {
                    // Attaches take turns on the client; the one before may have opened
                    // this very link while this one waited.
                    let mut client = conn.client.lock().await;
                    if let Some(cache) = cache
                        && let Some(link) = Connection::links(cache(&conn)).get(queue.as_str())
                    {
                        return Ok(link.clone());
                    }
                    let Some(c) = client.as_mut() else {
                        return Err(unavailable(Some(&queue), "the connection is closing"));
                    };
                    let link = Arc::new(Mutex::new(Closing::new(open(c).await?)));
                    if let Some(cache) = cache {
                        Connection::links(cache(&conn))
                            .insert(queue.as_str().to_owned(), link.clone());
                    }
                    Ok(link)
                })
                .await;
                attached.unwrap_or_else(|_| {
                    if !conn.dead.swap(true, Ordering::Relaxed) {
                        metrics::gauge!("orderly_servicebus_connected").set(0.0);
                        tracing::warn!(queue = %queue, generation = conn.generation, waited_ms = give_up.as_millis() as u64, "{what} was never answered; retiring the Service Bus connection");
                    }
                    Err(unavailable(
                        Some(&queue),
                        format!("{what} did not answer within {} ms", give_up.as_millis()),
                    ))
                })
            }
        });
        bounded(limit, queue, what, task)
            .await?
            .map_err(|e| unavailable(Some(queue), format!("{what} failed: {e}")))?
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Held>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The delivery of `message` this transport holds, if its lock has not run out and
    /// its connection is still the current one. (The client does not wait for the
    /// broker's answer to a settlement, so a lock that ran out is caught here, on the
    /// injected clock; a settlement that races the broker's own expiry is undetectable
    /// and ends in a redelivery.)
    pub(super) async fn take_held(
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
    pub(super) async fn current(&self) -> Option<Arc<Connection>> {
        self.slot
            .lock()
            .await
            .current
            .clone()
            .filter(|c| !c.dead.load(Ordering::Relaxed))
    }

    pub(super) fn convert(queue: &QueueName, m: &ServiceBusReceivedMessage) -> ReceivedMessage {
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

    pub(super) fn convert_dead(queue: &QueueName, m: &ServiceBusPeekedMessage) -> DeadLetter {
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
    pub(super) async fn settle<F, E>(
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
        self.judge(&conn, &message.queue, Links::Receiver, &result);
        result
    }
}
