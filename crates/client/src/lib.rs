//! Posting orders to orderly, for the applications that take them.
//!
//! A [`Client`] puts order-submitted messages on the orders queue of the configured
//! transport (the SQL queue in the state store's database, or Azure Service Bus), the
//! way the submitter expects them: the order as JSON, the order id as message id, so a
//! repeated post is absorbed (by the queue's duplicate detection, and after its window
//! by the submitter, which records an order id once). With a reply queue it also reads
//! the status notices orderly sends about those orders (`received`, `processing`,
//! `step_done`, `completed`, `failed`, `cancelled`).
//!
//! Everything that can be checked is checked before anything is sent: an invalid order
//! or one too large for the submitter is refused with the field or the size named, and
//! nothing of a batch is sent if one of its orders is refused.
//!
//! ```no_run
//! # async fn demo() -> Result<(), orderly_client::ClientError> {
//! use std::time::Duration;
//! use orderly_client::{Client, ClientConfig, Target};
//! use orderly_core::messages::OrderStatus;
//! use orderly_core::store::NewOrder;
//!
//! let client = Client::connect(
//!     ClientConfig::new(Target::Sql {
//!         database_url: "sqlite://orderly.db".into(),
//!         password: None,
//!     })
//!     .with_reply_queue("shop-1")?,
//! )
//! .await?;
//! let order: NewOrder = serde_json::from_str(
//!     r#"{"order_id": "o-1", "details": {"customer_id": "c-1", "currency": "EUR",
//!         "lines": [{"sku": "MOUSE-02", "quantity": 1, "unit_price_minor": 1999}]}}"#,
//! )
//! .map_err(|e| orderly_client::ClientError::Decode(e.to_string()))?;
//! let id = client.post(order).await?;
//! let done = client.wait_for(&id, OrderStatus::Completed, Duration::from_secs(30)).await?;
//! # let _ = done; Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orderly_azure::{Provisioned, ServiceBusSettings, ServiceBusTransport};
use orderly_core::messages::{OrderStatus, StatusNotice, order_submitted, queues};
use orderly_core::store::NewOrder;
use orderly_core::transport::{
    MAX_MESSAGES, OutgoingMessage, QueueName, QueueSettings, Transport, TransportError,
};
use orderly_core::{OrderId, SystemClock, TimeSource, ValidationError};
use tokio::sync::Mutex;

/// Orders one send carries at most.
const SEND_BATCH: usize = 100;
/// How long one receive of notices waits at most before the deadline is looked at again.
const NOTICE_WAIT: Duration = Duration::from_millis(500);
/// Most orders whose notices are kept for a later [`Client::wait_for`]: past it, the
/// notices of the order first seen longest ago are dropped (logged), so a client that
/// posts without waiting does not grow without bound.
pub const INBOX_ORDERS: usize = 100_000;
/// Most notices kept per order (a workflow of many steps sends one per step): past it,
/// the oldest that is not final is dropped.
pub const INBOX_PER_ORDER: usize = 256;

/// Where the orders queue is.
#[derive(Clone)]
pub enum Target {
    /// The SQL queue in the state store's database (`sqlite://FILE` or `postgres://...`).
    Sql {
        /// The state store's URL (a secret where it holds a password: never printed).
        database_url: String,
        /// PostgreSQL's password when it is a token (Azure Database for PostgreSQL
        /// with Entra ID: `orderly_azure::EntraPassword`), renewed before it expires;
        /// `None`: the URL's.
        password: Option<Arc<dyn orderly_core::credentials::PasswordSource>>,
    },
    /// Azure Service Bus.
    ServiceBus(ServiceBusSettings),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Sql { .. } => f.write_str("Sql { database_url: <hidden> }"),
            Target::ServiceBus(s) => f.debug_tuple("ServiceBus").field(s).finish(),
        }
    }
}

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The transport.
    pub target: Target,
    /// The orders queue (default `orders`).
    pub orders: QueueName,
    /// The client's own queue for status notices, if it wants them. Orders posted
    /// without a `reply_to` of their own name it.
    pub reply_to: Option<QueueName>,
}

impl ClientConfig {
    /// The default orders queue on `target`, no reply queue.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            orders: QueueName::parse(queues::ORDERS)
                .unwrap_or_else(|_| unreachable!("literal queue name")),
            reply_to: None,
        }
    }

    /// Status notices go to `queue` (created on the SQL transport if missing; on
    /// Service Bus it must exist).
    pub fn with_reply_queue(mut self, queue: &str) -> Result<Self, ClientError> {
        self.reply_to = Some(QueueName::parse(queue).map_err(|e| ClientError::Invalid {
            order_id: None,
            error: e,
        })?);
        Ok(self)
    }
}

/// What went wrong; nothing was sent unless the variant says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An order (or a setting) is not valid; the error names the field.
    #[error("{}{error}", order_id.as_ref().map(|id| format!("order {id}: ")).unwrap_or_default())]
    Invalid {
        /// The order, where one is concerned.
        order_id: Option<String>,
        /// The field and what is wrong with it.
        error: ValidationError,
    },
    /// An order's message is over the limit the submitter accepts.
    #[error("order {order_id}: its message is {size} bytes, over the {limit}-byte limit")]
    PayloadTooLarge {
        /// The order.
        order_id: String,
        /// Its message's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A queue does not exist (on Service Bus queues are provisioned as infrastructure).
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    /// The transport could not be reached or failed; posting again is safe (a repeat
    /// is absorbed).
    #[error("{what} is unavailable: {source}")]
    Unavailable {
        /// The queue or store concerned.
        what: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `wait_for` needs a reply queue.
    #[error("no reply queue: give one (ClientConfig::with_reply_queue) to receive status notices")]
    NoReplyQueue,
    /// The awaited notice did not come in time.
    #[error("no {status:?} notice for order {order_id} within {waited:?}")]
    Timeout {
        /// The order.
        order_id: String,
        /// The notice awaited.
        status: OrderStatus,
        /// How long it waited.
        waited: Duration,
    },
    /// The order ended otherwise than awaited (e.g. `failed` while waiting for
    /// `completed`); the notice says how.
    #[error("order {} ended {:?}{}", .0.order_id, .0.status, .0.detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Ended(StatusNotice),
    /// Input that is not an order at all (JSON that does not decode).
    #[error("not an order: {0}")]
    Decode(String),
}

impl ClientError {
    fn from_transport(e: TransportError, what: &QueueName) -> Self {
        match e {
            TransportError::QueueNotFound(q) => ClientError::QueueNotFound(q),
            TransportError::Invalid(error) => ClientError::Invalid {
                order_id: None,
                error,
            },
            other => ClientError::Unavailable {
                what: format!("queue {what}"),
                source: Box::new(other),
            },
        }
    }
}

/// Posts orders and reads their notices. Cheap to share (`&self` everywhere).
pub struct Client {
    transport: Arc<dyn Transport>,
    orders: QueueName,
    reply_to: Option<QueueName>,
    /// Notices received for orders nobody is waiting on yet, by order.
    inbox: Mutex<Inbox>,
}

/// The notices read but not yet taken, by order, within [`INBOX_ORDERS`] and
/// [`INBOX_PER_ORDER`].
struct Inbox {
    by_order: HashMap<OrderId, Vec<StatusNotice>>,
    /// Orders by when their first kept notice came (some may be gone since).
    arrival: std::collections::VecDeque<OrderId>,
    max_orders: usize,
    max_per_order: usize,
}

impl Default for Inbox {
    fn default() -> Self {
        Self::with_caps(INBOX_ORDERS, INBOX_PER_ORDER)
    }
}

impl Inbox {
    fn with_caps(max_orders: usize, max_per_order: usize) -> Self {
        Self {
            by_order: HashMap::new(),
            arrival: std::collections::VecDeque::new(),
            max_orders,
            max_per_order,
        }
    }

    fn keep(&mut self, n: StatusNotice) {
        let id = n.order_id.clone();
        let seen = self.by_order.entry(id.clone()).or_default();
        if seen.is_empty() {
            self.arrival.push_back(id.clone());
        }
        seen.push(n);
        if seen.len() > self.max_per_order {
            let oldest = seen.iter().position(|n| !is_final(n.status)).unwrap_or(0);
            seen.remove(oldest);
            tracing::warn!(order_id = %id, kept = self.max_per_order, "status notices of one order over the client's inbox bound: the oldest dropped");
        }
        while self.by_order.len() > self.max_orders {
            let Some(old) = self.arrival.pop_front() else {
                break;
            };
            if self.by_order.remove(&old).is_some() {
                tracing::warn!(order_id = %old, kept = self.max_orders, "status notices of more orders than the client's inbox keeps: those of the order seen longest ago dropped (wait_for it in time, or forget it)");
            }
        }
        // Orders taken or forgotten leave their place behind: clear those out now and
        // then, so the queue stays within a multiple of what is kept.
        if self.arrival.len() > 2 * self.max_orders.max(self.by_order.len()) {
            let kept = &self.by_order;
            self.arrival.retain(|id| kept.contains_key(id));
        }
    }

    fn get_mut(&mut self, id: &OrderId) -> Option<&mut Vec<StatusNotice>> {
        self.by_order.get_mut(id)
    }

    fn remove(&mut self, id: &OrderId) {
        self.by_order.remove(id);
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("orders", &self.orders)
            .field("reply_to", &self.reply_to)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the configured transport and checks the queues: on the SQL
    /// transport the orders queue and the reply queue are created if missing (the
    /// defaults the roles use), so orders can be posted before any role started; on
    /// Service Bus they must exist, or [`ClientError::QueueNotFound`] names the one
    /// that does not.
    pub async fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        let transport: Arc<dyn Transport> = match &cfg.target {
            Target::Sql {
                database_url,
                password,
            } => {
                orderly_sql::connect_with(database_url, TimeSource::Database, password.clone())
                    .await
                    .map_err(|e| match e {
                        orderly_core::Error::Invalid(error) => ClientError::Invalid {
                            order_id: None,
                            error,
                        },
                        other => ClientError::Unavailable {
                            what: "the state store's database (the SQL queue)".into(),
                            source: Box::new(other),
                        },
                    })?
                    .transport
            }
            Target::ServiceBus(settings) => Arc::new(
                ServiceBusTransport::connect(
                    settings,
                    Arc::new(Provisioned),
                    Arc::new(SystemClock),
                )
                .await
                .map_err(|e| ClientError::Unavailable {
                    what: "Service Bus".into(),
                    source: Box::new(e),
                })?,
            ),
        };
        Self::on_transport(transport, cfg.orders, cfg.reply_to).await
    }

    /// A client on a transport you already hold (tests, or an application that shares
    /// one); the queues are checked as in [`Client::connect`].
    pub async fn on_transport(
        transport: Arc<dyn Transport>,
        orders: QueueName,
        reply_to: Option<QueueName>,
    ) -> Result<Self, ClientError> {
        for q in std::iter::once(&orders).chain(reply_to.as_ref()) {
            transport
                .ensure_queue(q, &QueueSettings::default())
                .await
                .map_err(|e| ClientError::from_transport(e, q))?;
        }
        Ok(Self {
            transport,
            orders,
            reply_to,
            inbox: Mutex::default(),
        })
    }

    /// The client's reply queue, if it has one.
    pub fn reply_queue(&self) -> Option<&QueueName> {
        self.reply_to.as_ref()
    }

    /// The message for `order`, or why it cannot be sent. An order without a
    /// `reply_to` gets the client's.
    fn message(&self, mut order: NewOrder) -> Result<OutgoingMessage, ClientError> {
        if order.reply_to.is_none() {
            order.reply_to = self.reply_to.as_ref().map(|q| q.as_str().to_owned());
        }
        if let Some(q) = &order.reply_to {
            QueueName::parse(q.clone()).map_err(|mut error| {
                error.field = "reply_to".into();
                ClientError::Invalid {
                    order_id: Some(order.order_id.to_string()),
                    error,
                }
            })?;
        }
        order_submitted(&order).map_err(|e| match e {
            TransportError::PayloadTooLarge { size, limit } => ClientError::PayloadTooLarge {
                order_id: order.order_id.to_string(),
                size,
                limit,
            },
            TransportError::Invalid(error) => ClientError::Invalid {
                order_id: Some(order.order_id.to_string()),
                error,
            },
            other => ClientError::from_transport(other, &self.orders),
        })
    }

    /// Posts one order; returns its id once the message is durably on the orders queue.
    pub async fn post(&self, order: NewOrder) -> Result<OrderId, ClientError> {
        let id = order.order_id.clone();
        self.post_many(vec![order]).await?;
        Ok(id)
    }

    /// Posts orders in batches. Every order is checked first: if one is refused,
    /// nothing is sent. A failure part-way leaves the earlier batches posted; posting
    /// all of them again is safe (repeats are absorbed). Returns how many messages the
    /// queue took as new (repeats within its duplicate-detection window are not
    /// counted where the transport can tell).
    pub async fn post_many(&self, orders: Vec<NewOrder>) -> Result<usize, ClientError> {
        let messages = orders
            .into_iter()
            .map(|o| self.message(o))
            .collect::<Result<Vec<_>, _>>()?;
        let mut accepted = 0;
        for chunk in messages.chunks(SEND_BATCH.min(MAX_MESSAGES as usize)) {
            let outcome = self
                .transport
                .send(&self.orders, chunk)
                .await
                .map_err(|e| ClientError::from_transport(e, &self.orders))?;
            accepted += outcome.accepted;
        }
        Ok(accepted)
    }

    /// Receives the notices waiting on the reply queue (waiting at most `wait` for the
    /// first). Each is removed from the queue once read. Notices that do not decode are
    /// dead-lettered on the reply queue with the reason.
    pub async fn notices(&self, wait: Duration) -> Result<Vec<StatusNotice>, ClientError> {
        let queue = self.reply_to.as_ref().ok_or(ClientError::NoReplyQueue)?;
        let (decoded, poison) = orderly_core::transport::receive_json::<StatusNotice>(
            self.transport.as_ref(),
            queue,
            64,
            wait,
            orderly_core::transport::MAX_BODY_BYTES,
        )
        .await
        .map_err(|e| ClientError::from_transport(e, queue))?;
        for p in poison {
            tracing::warn!(queue = %queue, message_id = %p.message_id, problem = %p.description, "status notice dead-lettered");
        }
        let (notices, messages): (Vec<_>, Vec<_>) = decoded.into_iter().unzip();
        if !messages.is_empty() {
            // A notice whose completion fails comes back and is read again: harmless.
            let _ = self.transport.complete_messages(&messages).await;
        }
        Ok(notices)
    }

    /// Waits until the notice `status` for `order_id` arrives, or `timeout` passes.
    /// If the order ends otherwise first (`failed` or `cancelled` while waiting for
    /// `completed`, say), returns [`ClientError::Ended`] with that notice. Notices for
    /// other orders read meanwhile are kept for their own `wait_for`.
    pub async fn wait_for(
        &self,
        order_id: &OrderId,
        status: OrderStatus,
        timeout: Duration,
    ) -> Result<StatusNotice, ClientError> {
        if self.reply_to.is_none() {
            return Err(ClientError::NoReplyQueue);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(found) = self.take(order_id, status).await {
                return found;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout {
                    order_id: order_id.to_string(),
                    status,
                    waited: timeout,
                });
            }
            let notices = self.notices(left.min(NOTICE_WAIT)).await?;
            let mut inbox = self.inbox.lock().await;
            for n in notices {
                inbox.keep(n);
            }
        }
    }

    /// The awaited notice (or a final one that rules it out) from the inbox.
    async fn take(
        &self,
        order_id: &OrderId,
        status: OrderStatus,
    ) -> Option<Result<StatusNotice, ClientError>> {
        let mut inbox = self.inbox.lock().await;
        let seen = inbox.get_mut(order_id)?;
        let found = if let Some(i) = seen.iter().position(|n| n.status == status) {
            Ok(seen.remove(i))
        } else if let Some(i) = seen.iter().position(|n| is_final(n.status)) {
            Err(ClientError::Ended(seen.remove(i)))
        } else {
            return None;
        };
        // After its final notice nothing more is awaited of an order: drop what is left.
        let ended = match &found {
            Ok(n) | Err(ClientError::Ended(n)) => is_final(n.status),
            Err(_) => false,
        };
        if seen.is_empty() || ended {
            inbox.remove(order_id);
        }
        Some(found)
    }

    /// Drops the notices kept for `order_id` (read while waiting on other orders).
    pub async fn forget(&self, order_id: &OrderId) {
        self.inbox.lock().await.remove(order_id);
    }
}

fn is_final(status: OrderStatus) -> bool {
    matches!(
        status,
        OrderStatus::Completed | OrderStatus::Failed | OrderStatus::Cancelled
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(order: &str, status: OrderStatus, step: Option<&str>) -> StatusNotice {
        StatusNotice {
            order_id: OrderId::parse(order).unwrap(),
            status,
            step: step.map(str::to_owned),
            detail: None,
        }
    }

    #[test]
    fn the_inbox_keeps_the_newest_orders_and_an_orders_final_notice_within_its_bounds() {
        let mut inbox = Inbox::with_caps(3, 2);
        for i in 0..5 {
            inbox.keep(notice(&format!("o-{i}"), OrderStatus::Received, None));
        }
        let mut kept: Vec<String> = inbox.by_order.keys().map(ToString::to_string).collect();
        kept.sort();
        assert_eq!(
            kept,
            ["o-2", "o-3", "o-4"],
            "the orders seen longest ago go"
        );

        // One order's notices: the oldest that is not final goes, the final one stays.
        let id = OrderId::parse("o-4").unwrap();
        inbox.keep(notice("o-4", OrderStatus::StepDone, Some("reserve")));
        inbox.keep(notice("o-4", OrderStatus::Completed, None));
        inbox.keep(notice("o-4", OrderStatus::StepDone, Some("late")));
        let statuses: Vec<OrderStatus> = inbox
            .get_mut(&id)
            .unwrap()
            .iter()
            .map(|n| n.status)
            .collect();
        assert_eq!(statuses, [OrderStatus::Completed, OrderStatus::StepDone]);

        // Taken or forgotten orders do not pile up in the arrival queue.
        for i in 5..1_000 {
            let id = format!("o-{i}");
            inbox.keep(notice(&id, OrderStatus::Received, None));
            inbox.remove(&OrderId::parse(&id).unwrap());
        }
        assert!(inbox.arrival.len() <= 2 * 3 + 1, "{}", inbox.arrival.len());
        assert!(inbox.by_order.len() <= 3);
    }
}
