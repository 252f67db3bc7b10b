//! What the shared code hands a dialect to write, every value decided: messages to
//! insert, step touches and records, new orders and recoveries.

use crate::time::Ts;
use orderly_core::Fence;
use orderly_core::transport::ReceivedMessage;
use std::collections::{HashMap, HashSet};

/// One message to insert into a queue.
pub(crate) struct MessageRow<'a> {
    pub message_id: &'a str,
    pub correlation_id: Option<&'a str>,
    pub properties: String,
    pub body: &'a [u8],
    /// When it was scheduled to become visible (truncated to microseconds); `None`: at
    /// once. It is visible from the later of this and the send's now.
    pub scheduled_at: Option<Ts>,
}

/// What [`Driver::insert_messages`] or [`Driver::send_and_complete_alone`] did.
pub(crate) struct SentAndCompleted {
    /// How many messages it inserted (the rest were duplicates).
    pub inserted: usize,
    /// The holds it completed: seq and lock token.
    pub completed: HashMap<i64, String>,
}

/// A message a write sends if it writes the order `order_id`
/// ([`Driver::write_steps_sending`], [`Driver::insert_orders_sending`]).
pub(crate) struct SendFor<'a> {
    pub order_id: &'a str,
    pub queue: &'a orderly_core::transport::QueueName,
    pub row: MessageRow<'a>,
}

/// A delivery a write ends if it writes the order `order_id`.
pub(crate) struct HoldFor<'a> {
    pub order_id: &'a str,
    pub held: &'a ReceivedMessage,
}

/// What a write that sends did: the orders it wrote and the holds it completed (seq
/// and lock token).
pub(crate) struct SentWith {
    pub applied: HashSet<String>,
    pub completed: HashMap<i64, String>,
}

impl SentWith {
    /// The queues of `sends` it sent to (those of the orders it wrote), each once: to
    /// wake once it has committed.
    pub fn woken(&self, sends: &[SendFor<'_>]) -> Vec<orderly_core::transport::QueueName> {
        let mut woken: Vec<orderly_core::transport::QueueName> = Vec::new();
        for s in sends.iter().filter(|s| self.applied.contains(s.order_id)) {
            if !woken.contains(s.queue) {
                woken.push(s.queue.clone());
            }
        }
        woken
    }
}

/// The fenced touch of one step write, decided by the shared code: the step it must be
/// at (-1: any), the step to move to (-1: none), whether a step failed and its error
/// (already cut to the stored length), and whether its order completes with it (its
/// last step's record). What a dialect does with it is one write, the same in both:
/// the order's step becomes the greater of its own and `new_step` (an unguarded late
/// duplicate never moves it back), and a wait (`waiting_on`) ends only when the step
/// moves. `store/conformance.rs` holds both dialects to it.
pub(crate) struct Touch<'a> {
    pub fence: &'a Fence,
    pub expect: i32,
    pub new_step: i32,
    pub failed: bool,
    pub error: Option<String>,
    pub complete: bool,
}

/// A new order to insert, with its Pending state row and Submitted history entry.
pub(crate) struct NewOrderRow<'a> {
    pub order_id: &'a str,
    pub details: String,
    pub reply_to: Option<&'a str>,
    pub workflow: Option<&'a str>,
}

/// One step record to write, with the history entry it makes (`kind`).
pub(crate) struct StepRow<'a> {
    pub fence: &'a Fence,
    pub index: i32,
    pub name: &'a str,
    pub status: &'static str,
    pub idempotency_key: &'a str,
    pub detail: Option<String>,
    pub kind: &'static str,
    pub irreversible: bool,
    /// What the record adds to the step's attempts (a start counts one).
    pub attempts: i32,
}

/// One timed-out order's recovery, decided by the shared code.
pub(crate) struct RecoveryRow {
    pub order_id: String,
    pub epoch: i64,
    pub failure_count: i32,
    pub state: &'static str,
    pub finish_as: Option<&'static str>,
    pub next_attempt_at: Option<Ts>,
    /// Why, already cut to the stored length: the order's last error and its history
    /// entry's reason alike.
    pub reason: String,
    pub kind: &'static str,
}
