//! The errors of the domain and of every state-store operation.

use crate::id::{InstanceId, OrderId};
use crate::state::{Epoch, ProcessState};
pub use crate::validation::ValidationError;

/// An error with its causes, each said once: `outer: cause: root`, leaving out a cause
/// whose text its error already shows (many errors print their source in their own
/// text, which a plain walk of the chain repeats: "X: Y: Y").
pub fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// A convenient alias: every fallible operation of the domain and its ports.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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

    /// Whether the error says the caller's view moved on: a race lost or a state that
    /// changed under it (fenced, deposed, past its deadline, a stale step, a transition
    /// no longer allowed, an order gone or past its point of no return). Such a
    /// refusal is final and expected; a message that asked for the change is done with.
    pub fn is_moved_on(&self) -> bool {
        matches!(
            self,
            Error::OrderNotFound(_)
                | Error::Fenced { .. }
                | Error::Deposed { .. }
                | Error::DeadlinePassed { .. }
                | Error::StaleStep { .. }
                | Error::IllegalTransition { .. }
                | Error::PastReturn { .. }
        ) || matches!(self, Error::Queue(inner)
            if matches!(**inner, crate::transport::TransportError::LockLost { .. }))
    }

    /// Whether the error says the input or the stored data cannot be used (invalid,
    /// unreadable, a conflict, a message the change causes that can never be sent):
    /// neither a retry nor a lost race, so a message that met it is dead-lettered with
    /// the error as its reason, for an operator to see, not dropped.
    pub fn is_unusable(&self) -> bool {
        !self.is_retryable() && !self.is_moved_on()
    }

    /// A short name of the error's kind, for a dead letter's reason and a metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::OrderNotFound(_) => "OrderNotFound",
            Error::Fenced { .. } => "Fenced",
            Error::Deposed { .. } => "Deposed",
            Error::DeadlinePassed { .. } => "DeadlinePassed",
            Error::StaleStep { .. } => "StaleStep",
            Error::IllegalTransition { .. } => "IllegalTransition",
            Error::OrderIdConflict(_) => "OrderIdConflict",
            Error::Invalid(_) => "Invalid",
            Error::Unavailable(_) => "Unavailable",
            Error::Queue(_) => "Queue",
            Error::Send(_) => "Unsendable",
            Error::PastReturn { .. } => "PastReturn",
            Error::Corrupt(_) => "Corrupt",
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

impl From<Error> for crate::transport::TransportError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(v) => crate::transport::TransportError::Invalid(v),
            Error::Send(inner) | Error::Queue(inner) => *inner,
            other => crate::transport::TransportError::Unavailable(Box::new(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error is exactly one of: worth retrying, the caller's view moved on, or
    /// unusable input or data (dead-lettered).
    #[test]
    fn every_error_is_retryable_moved_on_or_unusable() {
        let id = OrderId::parse("o-1").unwrap();
        let unreachable = || -> Box<dyn std::error::Error + Send + Sync> { "down".into() };
        let cases = [
            (Error::Unavailable(unreachable()), "retry"),
            (Error::OrderNotFound(id.clone()), "moved on"),
            (
                Error::StaleStep {
                    order_id: id.clone(),
                    expected: 1,
                    current: 2,
                },
                "moved on",
            ),
            (Error::Corrupt("bad row".into()), "unusable"),
            (
                Error::Invalid(ValidationError::new("step", "too long")),
                "unusable",
            ),
            (Error::OrderIdConflict(id.clone()), "unusable"),
            (
                Error::Send(Box::new(crate::transport::TransportError::QueueNotFound(
                    crate::transport::QueueName::parse("agent.x").unwrap(),
                ))),
                "unusable",
            ),
        ];
        for (e, want) in cases {
            let got = match (e.is_retryable(), e.is_moved_on(), e.is_unusable()) {
                (true, false, false) => "retry",
                (false, true, false) => "moved on",
                (false, false, true) => "unusable",
                other => panic!("{e}: {other:?}"),
            };
            assert_eq!(got, want, "{e} ({})", e.kind());
        }
    }

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

#[cfg(test)]
mod cause_tests {
    /// An error that prints its source in its own text, as sqlx's do.
    #[derive(Debug)]
    struct Io(std::io::Error);

    impl std::fmt::Display for Io {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error communicating with database: {}", self.0)
        }
    }

    impl std::error::Error for Io {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// An outer error that names its source only through `source()`.
    #[derive(Debug)]
    struct Outer(Io);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("cannot open the state store")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let root = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert_eq!(
            super::causes(&Outer(Io(root))),
            "cannot open the state store: error communicating with database: invalid peer certificate: UnknownIssuer"
        );
        let plain = std::io::Error::other("refused");
        assert_eq!(super::causes(&plain), "refused");
    }
}
