//! The errors of the domain and of every state-store operation.

use crate::id::{InstanceId, OrderId};
use crate::state::{Epoch, ProcessState};

/// A convenient alias: every fallible operation of the domain and its ports.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Input that does not make a valid order (or id); the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ValidationError {
    /// The field at fault, as a path such as `lines[2].quantity`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ValidationError {
    /// A validation error for `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// What went wrong in a state-store operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The order does not exist.
    #[error("order {0} not found")]
    OrderNotFound(OrderId),

    /// The caller no longer owns the order: another owner or a newer epoch holds it.
    /// The row was left untouched.
    #[error(
        "order {order_id} is fenced: caller {caller} at epoch {caller_epoch} \
         but the row is held by {holder:?} at epoch {row_epoch} ({state})"
    )]
    Fenced {
        /// The order concerned.
        order_id: OrderId,
        /// The instance that attempted the write.
        caller: InstanceId,
        /// The epoch the caller presented.
        caller_epoch: Epoch,
        /// Who holds the row now, if anyone.
        holder: Option<InstanceId>,
        /// The epoch stored in the row.
        row_epoch: Epoch,
        /// The row's current state.
        state: ProcessState,
    },

    /// A leader's write carried a term that is no longer the current one: another
    /// leader took over. Nothing was written.
    #[error("leadership {name}: term {epoch} of {holder} is over; the write was refused")]
    Deposed {
        /// What is led.
        name: String,
        /// The deposed leader.
        holder: InstanceId,
        /// Its term.
        epoch: Epoch,
    },

    /// The owner's deadline (CompleteBy) has passed: only the supervisor may act now.
    #[error("order {order_id}: deadline {complete_by} has passed")]
    DeadlinePassed {
        /// The order concerned.
        order_id: OrderId,
        /// The deadline that passed.
        complete_by: chrono::DateTime<chrono::Utc>,
    },

    /// The write was for another step than the one the order is at: a late or repeated
    /// reply. The row was left untouched.
    #[error("order {order_id} is at step {current}, not step {expected}")]
    StaleStep {
        /// The order concerned.
        order_id: OrderId,
        /// The step the write was for.
        expected: i32,
        /// The step the order is at.
        current: i32,
    },

    /// The state machine does not allow this transition.
    #[error("order {order_id}: illegal transition {from} -> {to}")]
    IllegalTransition {
        /// The order concerned.
        order_id: OrderId,
        /// Its current state.
        from: ProcessState,
        /// The state asked for.
        to: ProcessState,
    },

    /// An order with this id exists with different details.
    #[error("order {0} already exists with different details")]
    OrderIdConflict(OrderId),

    /// The request itself is invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),

    /// The store could not be reached or failed; the operation may be retried.
    #[error("state store unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),

    /// A queue could not be read or settled (the transport failed, not the state store);
    /// the call may be retried when the transport says so.
    #[error("{0}")]
    Queue(#[source] Box<crate::transport::TransportError>),

    /// A message this change causes could not be enqueued; nothing was committed.
    #[error("a message this change causes cannot be enqueued, so nothing was committed: {0}")]
    Send(#[source] Box<crate::transport::TransportError>),

    /// A cancel that would undo the order was refused: steps that can never be undone
    /// may have taken effect, and undoing the others would leave it half undone.
    #[error(
        "order {order_id} cannot be undone: {steps} may have taken effect and cannot be \
         undone; it runs on to its end (or, once dealt with, cancel it without \
         compensation to end it as it stands)"
    )]
    PastReturn {
        /// The order concerned.
        order_id: OrderId,
        /// The steps in the way, comma-separated.
        steps: String,
    },

    /// The store holds data this version cannot read (corruption or a newer schema).
    #[error("state store holds unreadable data: {0}")]
    Corrupt(String),
}

impl Error {
    /// The order the error's own text names, if it names one.
    pub fn order_id(&self) -> Option<&OrderId> {
        match self {
            Error::OrderNotFound(id) | Error::OrderIdConflict(id) => Some(id),
            Error::Fenced { order_id, .. }
            | Error::DeadlinePassed { order_id, .. }
            | Error::StaleStep { order_id, .. }
            | Error::IllegalTransition { order_id, .. }
            | Error::PastReturn { order_id, .. } => Some(order_id),
            Error::Deposed { .. }
            | Error::Invalid(_)
            | Error::Unavailable(_)
            | Error::Queue(_)
            | Error::Send(_)
            | Error::Corrupt(_) => None,
        }
    }

    /// The error as one line about `order_id`, which it names once: as it is when its
    /// text names the order already, else after `order <id>: `.
    pub fn about(&self, order_id: &OrderId) -> String {
        if self.order_id() == Some(order_id) {
            self.to_string()
        } else {
            format!("order {order_id}: {self}")
        }
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Unavailable(_) => true,
            Error::Send(inner) | Error::Queue(inner) => inner.is_retryable(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_about_an_order_names_it_once() {
        let id = OrderId::parse("o-1").unwrap();
        let past = Error::PastReturn {
            order_id: id.clone(),
            steps: "ship".into(),
        };
        let line = past.about(&id);
        assert_eq!(line.matches("o-1").count(), 1, "{line}");
        assert!(line.starts_with("order o-1 cannot be undone"), "{line}");
        let corrupt = Error::Corrupt("bad row".into());
        assert_eq!(
            corrupt.about(&id),
            "order o-1: state store holds unreadable data: bad row"
        );
        // An error naming another order keeps the one it was about in front.
        let other = Error::OrderNotFound(OrderId::parse("o-2").unwrap());
        assert_eq!(other.about(&id), "order o-1: order o-2 not found");
    }
}
