//! What the submitter hands the store: new orders, the reply queues they may name,
//! and the outcome of a batch whose messages the store consumes with it.

use super::MAX_REPLY_TO_LEN;
use crate::error::Result;
use crate::id::OrderId;
use crate::order::OrderDetails;
use crate::transport::{Envelope, ReceivedMessage};
use crate::validation::ValidationError;
use serde::{Deserialize, Serialize};

/// An order accepted from the orders queue. A field it does not know (a misspelt
/// `workflow`, say) makes the message invalid rather than silently ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// The client's id for it.
    pub order_id: OrderId,
    /// What was ordered.
    pub details: OrderDetails,
    /// Where to send status notifications, if anywhere.
    pub reply_to: Option<String>,
    /// The workflow to run it under (by name); `None`: the schedulers' default. The
    /// order is pinned to that workflow's version when it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
}

impl NewOrder {
    /// Checks what `OrderDetails` cannot: the reply queue's name and the workflow name.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(w) = &self.workflow {
            crate::workflow::check_workflow_name("workflow", w)?;
        }
        if let Some(q) = &self.reply_to {
            if q.is_empty() || q.len() > MAX_REPLY_TO_LEN || q.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    "reply_to",
                    format!("must be 1 to {MAX_REPLY_TO_LEN} printable characters"),
                ));
            }
            // Notices sent there would land among orderly's own messages.
            if is_internal_queue(q) {
                return Err(ValidationError::new(
                    "reply_to",
                    format!(
                        "{q:?} is one of orderly's own queues (orders, replies, alerts, agent.*): \
                         name the client's own queue"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Which queues an order may name as its `reply_to`: any but orderly's own (the
/// default), or, where the deployment sets a prefix, only the queues whose names start
/// with it (`client-`, say), so an order cannot have notices sent to a queue another
/// system reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyQueues {
    prefix: Option<String>,
}

impl ReplyQueues {
    /// Any queue but orderly's own.
    pub fn any() -> Self {
        Self::default()
    }

    /// Only queues whose names start with `prefix`: 1 to 100 characters a queue name
    /// may hold, not a prefix of orderly's own queues; `setting` names the setting in
    /// the refusal.
    pub fn prefixed(prefix: &str, setting: &'static str) -> Result<Self> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/');
        if prefix.is_empty() || prefix.len() > 100 || !prefix.chars().all(allowed) {
            return Err(ValidationError::new(
                setting,
                "must be 1 to 100 letters, digits, '-', '_', '.' or '/' (the start of the clients' queue names)",
            )
            .into());
        }
        if is_internal_queue(prefix) || is_internal_prefix(prefix) {
            return Err(ValidationError::new(
                setting,
                format!(
                    "{prefix:?} is the start of orderly's own queues: name the clients' prefix"
                ),
            )
            .into());
        }
        Ok(Self {
            prefix: Some(prefix.to_owned()),
        })
    }

    /// The prefix, if one is set.
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// `order` as [`NewOrder::validate`] checks it, and its `reply_to`, if any, one of
    /// these queues.
    pub fn check(&self, order: &NewOrder) -> std::result::Result<(), ValidationError> {
        order.validate()?;
        if let (Some(prefix), Some(q)) = (&self.prefix, &order.reply_to)
            && !q.starts_with(prefix.as_str())
        {
            return Err(ValidationError::new(
                "reply_to",
                format!(
                    "{q:?} is not a client queue here: reply queues must start with {prefix:?}"
                ),
            ));
        }
        Ok(())
    }
}

/// Whether `prefix` starts every name of some of orderly's own queues (`agent`,
/// `ord`): a reply prefix like that would let orders name them.
fn is_internal_prefix(prefix: &str) -> bool {
    use crate::transport::queues::{ALERTS, ORDERS, REPLIES};
    let p = prefix.to_ascii_lowercase();
    [ORDERS, REPLIES, ALERTS, "agent."]
        .iter()
        .any(|q| q.starts_with(&p))
}

/// Whether `queue` is one of orderly's own: the fixed queues and the agents' step
/// queues (`agent.*`, the convention every workflow here follows), compared without case.
pub fn is_internal_queue(queue: &str) -> bool {
    use crate::transport::queues::{ALERTS, ORDERS, REPLIES};
    let q = queue.to_ascii_lowercase();
    [ORDERS, REPLIES, ALERTS].contains(&q.as_str()) || q.starts_with("agent.")
}

/// What `submit` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// The order is new and now Pending.
    Accepted,
    /// The same order (same id, same details) was already there; nothing changed.
    Duplicate,
}

/// One order of a [`IntakeStore::submit_many`] batch, with the messages its
/// acceptance causes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The order.
    pub order: NewOrder,
    /// Sent if, and only if, the order is new.
    pub sends: Vec<Envelope>,
}

/// A batch's outcomes, item by item, and whether each item's message was consumed:
/// deleted from its queue in the batch's own transaction, so the state change and the
/// end of the message that asked for it commit together (exactly once on a queue that
/// lives in the store's database). A message not consumed is the caller's to settle.
#[derive(Debug)]
pub struct Consumed<T> {
    /// Per item, as the batch call without messages returns them.
    pub outcomes: Vec<T>,
    /// Per item: its message is settled; the caller must not settle it again.
    pub consumed: Vec<bool>,
}

impl<T> Consumed<T> {
    /// Outcomes with no message consumed (a store that holds no queue).
    pub fn none(outcomes: Vec<T>) -> Self {
        Self {
            consumed: vec![false; outcomes.len()],
            outcomes,
        }
    }
}

/// Messages received and acted on in one transaction
/// ([`SchedulerStore::take_and_record`], [`IntakeStore::take_and_submit`]).
#[derive(Debug)]
pub struct Taken<T = ()> {
    /// Every message received, in queue order. Those without a verdict in `recorded`
    /// are held by the caller, to apply or settle as after a receive.
    pub messages: Vec<ReceivedMessage>,
    /// Per message: `None` when nothing was planned for it; else the outcome of what
    /// was (applied, or why it was refused) and whether its message was consumed with
    /// it (a message not consumed is the caller's to settle).
    pub recorded: Vec<Option<(Result<T>, bool)>>,
}

impl<T> Taken<T> {
    /// `messages` held by the caller, nothing done with them.
    pub fn held(messages: Vec<ReceivedMessage>) -> Self {
        let recorded = messages.iter().map(|_| None).collect();
        Self { messages, recorded }
    }
}

/// Refuses a batch whose messages are not one per item.
pub fn check_consuming(items: usize, messages: &[ReceivedMessage]) -> Result<()> {
    if items == messages.len() {
        Ok(())
    } else {
        Err(ValidationError::new(
            "messages",
            format!(
                "one message per item: {items} items, {} messages",
                messages.len()
            ),
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// An order names the client's own queue for notices, never one of orderly's, and
    /// a field it does not know makes it invalid (a misspelt `workflow` is not ignored).
    #[test]
    fn an_order_names_its_own_reply_queue_and_only_known_fields() {
        let mut order: NewOrder = serde_json::from_value(serde_json::json!({
            "order_id": "o-1",
            "details": {"customer_id": "c-1", "currency": "EUR",
                        "lines": [{"sku": "A", "quantity": 1, "unit_price_minor": 100}]},
            "reply_to": "client-7",
        }))
        .unwrap();
        order.validate().unwrap();
        for internal in [
            "orders",
            "replies",
            "alerts",
            "agent.payment",
            "Agent.Inventory",
            "REPLIES",
        ] {
            order.reply_to = Some(internal.into());
            let e = order.validate().unwrap_err();
            assert!(e.to_string().contains("reply_to"), "{internal}: {e}");
        }
        let misspelt = serde_json::from_value::<NewOrder>(serde_json::json!({
            "order_id": "o-1",
            "details": {"customer_id": "c-1", "currency": "EUR",
                        "lines": [{"sku": "A", "quantity": 1, "unit_price_minor": 100}]},
            "reply_to": null,
            "worklfow": "gift",
        }))
        .unwrap_err();
        assert!(misspelt.to_string().contains("worklfow"), "{misspelt}");
    }

    /// With a prefix set, an order's reply queue must start with it; a prefix that
    /// would let orders name orderly's own queues is refused, naming the setting.
    #[test]
    fn a_reply_prefix_limits_reply_queues_to_the_clients_own() {
        let mut order: NewOrder = serde_json::from_value(serde_json::json!({
            "order_id": "o-1",
            "details": {"customer_id": "c-1", "currency": "EUR",
                        "lines": [{"sku": "A", "quantity": 1, "unit_price_minor": 100}]},
            "reply_to": "client-7",
        }))
        .unwrap();
        let any = ReplyQueues::any();
        let clients = ReplyQueues::prefixed("client-", "ORDERLY_REPLY_TO_PREFIX").unwrap();
        any.check(&order).unwrap();
        clients.check(&order).unwrap();
        order.reply_to = Some("billing-events".into());
        any.check(&order).unwrap();
        let e = clients.check(&order).unwrap_err();
        assert!(
            e.to_string().contains("reply_to") && e.to_string().contains("\"client-\""),
            "{e}"
        );
        order.reply_to = None;
        clients.check(&order).unwrap();
        // Orderly's own queues stay refused whatever the prefix.
        order.reply_to = Some("replies".into());
        assert!(any.check(&order).is_err());
        for bad in ["", "agent", "agent.", "Ord", "r", "client 7", "c\u{202e}"] {
            let e = ReplyQueues::prefixed(bad, "ORDERLY_REPLY_TO_PREFIX").unwrap_err();
            assert!(
                e.to_string().contains("ORDERLY_REPLY_TO_PREFIX"),
                "{bad:?}: {e}"
            );
        }
    }
}
