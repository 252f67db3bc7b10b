//! The records operators and retention read: pages of orders, an order's whole
//! view, what a prune or a vacuum did, and the stored workflow versions.

use crate::history::HistoryEvent;
use crate::id::OrderId;
use crate::order::OrderDetails;
use crate::state::{ProcessState, StateRow};
use crate::step::StepRecord;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a page of orders starts: after this order (in creation order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The last order's creation time.
    pub created_at: DateTime<Utc>,
    /// The last order's id.
    pub order_id: OrderId,
}

/// Which orders to list, oldest first.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    /// Only orders in this state.
    pub state: Option<ProcessState>,
    /// Only orders whose last error contains this text (case-insensitive).
    pub error_contains: Option<String>,
    /// Only orders whose current step is this one.
    pub current_step: Option<i32>,
    /// Only orders created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only orders waiting (Pending, held) for this service to be back.
    pub waiting_for: Option<String>,
    /// Only orders of this customer (`customer_id` in their details).
    pub customer: Option<String>,
    /// Only orders whose id starts with this.
    pub id_prefix: Option<String>,
    /// Page size (1 to [`MAX_BATCH`]; 0 means 50).
    pub limit: u32,
    /// Continue after this cursor.
    pub after: Option<Cursor>,
}

/// One page of orders.
#[derive(Debug, Clone)]
pub struct Page {
    /// The orders, oldest first.
    pub orders: Vec<StateRow>,
    /// Where the next page starts, if there may be one.
    pub next: Option<Cursor>,
}

/// Everything known about one order.
#[derive(Debug, Clone)]
pub struct OrderView {
    /// The state row.
    pub state: StateRow,
    /// What was ordered.
    pub details: OrderDetails,
    /// Its steps, by position.
    pub steps: Vec<StepRecord>,
    /// Its history, oldest first.
    pub history: Vec<HistoryEvent>,
}

impl OrderView {
    /// How many entries of its history are of `kind`.
    pub fn history_count(&self, kind: crate::history::HistoryKind) -> usize {
        self.history.iter().filter(|e| e.kind == kind).count()
    }
}

/// What a [`SupervisorStore::tally_finished`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tallied {
    /// The orders finished before this instant are in the tallies (the start of a
    /// minute); those since are counted by reading them.
    pub upto: chrono::DateTime<chrono::Utc>,
    /// The finished orders this call read into the tallies (those of the minutes it
    /// counted again included).
    pub orders: u64,
    /// The transactions it took (at most [`TALLY_STRIDE`] of finishes each).
    pub transactions: u32,
}

/// How long after a minute ends its finished orders are tallied: an order's finish is
/// stamped when its transaction begins, and is seen by others when it commits.
pub const TALLY_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// How far back each tally counts again the minutes already tallied, for an order
/// whose transaction committed later than [`TALLY_GRACE`] after its finish.
pub const TALLY_RECOUNT: std::time::Duration = std::time::Duration::from_secs(300);

/// The most time of finishes one transaction of a tally reads: a first tally of a large
/// store goes in steps, so that it never holds the writers (SQLite) for long.
pub const TALLY_STRIDE: std::time::Duration = std::time::Duration::from_secs(900);

/// Fewest left-behind row versions in a table for [`SupervisorStore::tidy`] to vacuum it.
pub const TIDY_MIN_DEAD: u64 = 1_000;

/// A table [`SupervisorStore::tidy`] vacuumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vacuumed {
    /// The table.
    pub table: String,
    /// Row versions left behind that the database counted before the vacuum.
    pub dead_rows: u64,
}

/// What a [`SupervisorStore::tidy`] did and saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Tidied {
    /// The tables vacuumed.
    pub vacuumed: Vec<Vacuumed>,
    /// The row versions left behind in the tidied tables, as the database counted them
    /// before vacuuming (`None`: the store keeps no such count, as SQLite). The same
    /// count as at the last tidy means nothing was updated or deleted meanwhile: the
    /// next look may wait longer.
    pub dead_rows: Option<u64>,
}

/// What retention keeps: see [`SupervisorStore::prune`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long finished orders (and sent or dead-lettered messages) are kept.
    pub keep: std::time::Duration,
    /// Most orders (or rows) removed per transaction.
    pub batch: u32,
}

/// What a prune removed (or, dry, would remove), by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Finished orders.
    pub orders: u64,
    /// Their steps.
    pub steps: u64,
    /// Their history entries.
    pub history: u64,
    /// Their alerts.
    pub alerts: u64,
    /// Dead letters of the SQL queues.
    pub dead_letters: u64,
    /// Outbox rows already sent, or dead-lettered.
    pub outbox: u64,
    /// Expired duplicate-detection rows.
    pub dedup: u64,
}

impl Pruned {
    /// Whether nothing was (or would be) removed.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}
