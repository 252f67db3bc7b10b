//! The statements the shared code runs whose text differs by dialect, named the same
//! in both.

/// The statements the shared code runs whose text differs by dialect. Each dialect's
/// `statements.rs` defines one of these, so both name the same statements.
#[derive(Debug)]
pub(crate) struct Statements {
    /// A subquery of the texts of list `$1`, one row each (for `x IN (...)`).
    pub texts_of_1: &'static str,
    /// What ends a `SELECT` that locks the rows it reads against writers until the
    /// transaction ends (empty where the transaction holds the one write lock).
    pub for_update: &'static str,
    /// What ends a `SELECT` that keeps the rows it reads from changing until the
    /// transaction ends, letting other readers do the same.
    pub for_share: &'static str,
    /// The start of the minute of the timestamp column `{}` (a timestamp again).
    pub minute_of: &'static str,
    /// An order state row's submit-to-last-change time in milliseconds.
    pub latency_ms: &'static str,
    /// Keeps the Error rows' causes of JSON array `$1` (objects `order_id`, `at`: the
    /// row's `updated_at` it was read at, in the text form, `cause`), each only where
    /// the row is still in Error without a cause and unchanged since (`store::causes`).
    pub fill_causes: &'static str,
    /// A condition on `order_state`: the order's customer id (in its details) is the
    /// parameter `?`.
    pub customer_orders: &'static str,
    /// The stored details of order `$1` (as text, column `details`).
    pub select_details: &'static str,
    /// Overdue orders for reading, most overdue first: `$1` the dialect's now
    /// parameter, `$2` limit.
    pub find_expired: &'static str,
    /// What a sweep has to do (`$1` the dialect's now parameter): one row of three
    /// booleans, `expired` (an order the sweep's `lock_expired` would find), `alerts`
    /// (an alert not yet published) and `outages` (an outage's start or end not yet
    /// announced, as `ServiceAlert::owed` decides).
    pub sweep_due: &'static str,
    /// When the next order comes due to be claimed: one row, `due` (the earliest
    /// `next_attempt_at` of the Pending orders no one holds, NULL without any) and `now`
    /// (`$1` the dialect's now parameter), so a scheduler that found nothing to claim
    /// knows how long it may wait for the clock alone.
    pub next_claimable: &'static str,
    /// When queue `$1`'s next message comes due: one row, `due` (the earliest
    /// `visible_at` of its messages, NULL without any) and `now` (`$2` the dialect's
    /// now parameter), so a receiver that found nothing knows how long it may wait for
    /// the clock alone (a lock that runs out, a scheduled time).
    pub next_visible: &'static str,
    /// The timed-out orders of a sweep (`$1` now, `$2` limit), locked where the
    /// dialect can, with what a recovery decision needs.
    pub lock_expired: &'static str,
    /// How a receive locks messages.
    pub q_receive: Receive,
    /// Whether a send and the completions that go with it run as one statement of
    /// their own ([`Driver::send_and_complete_alone`]) when nothing else shares their
    /// transaction.
    pub sends_alone: bool,
    /// Whether a batch of step writes or new orders sends what it causes and ends the
    /// deliveries that asked for it in its own statement
    /// ([`Driver::write_steps_sending`], [`Driver::insert_orders_sending`]).
    pub writes_send: bool,
    /// Leases unsent outbox rows: `$1` relay, `$2` lease end, `$3` now, `$4` limit.
    pub o_lease: &'static str,
    /// Outbox rows `$1` (list) of relay `$2` dead at `$3` for reason `$4`.
    pub o_dead: &'static str,
    /// Outbox rows `$1` (list) of relay `$2` sent at `$3`.
    pub o_sent: &'static str,
    /// Outbox rows `$1` (list) of relay `$2` failed with `$3`, retried after `$4`.
    pub o_failed: &'static str,
    /// How the hot tables are vacuumed, where the database keeps what updates and
    /// deletes left behind until a vacuum (`None`: it reclaims as it goes).
    pub tidy: Option<Tidy>,
}

/// The statements of [`crate::SqlStore`]'s `tidy`.
#[derive(Debug, Clone, Copy)]
pub struct Tidy {
    /// Per table of list `$1` in this schema: `table_name`, `dead` (row versions left
    /// behind, as the database counts them) and `live` (rows in use).
    pub dead_rows: &'static str,
    /// At most one row, `horizon`: the oldest transaction of another session that may
    /// still see rows others deleted or replaced (running, holding a snapshot,
    /// prepared, or held by a replication slot), as text; none when nothing holds
    /// them back. A vacuum removes only what is older; while the text stays the same,
    /// nothing more became removable.
    pub horizon: &'static str,
    /// Each hot table and the statement that vacuums it, skipping it if another
    /// vacuum holds it.
    pub vacuum: &'static [(&'static str, &'static str)],
    /// Run on the connection before the vacuums (lifts the session's statement
    /// timeout: a vacuum of a large table may rightly take longer) and after them.
    pub unbounded: &'static str,
    /// Run after the vacuums, whatever they did: the session's limits again.
    pub bounded: &'static str,
}

/// How a dialect's queue locks messages for a receive. A message is visible when its
/// `visible_at` has come and no lock holds it (`locked_until` NULL or past).
#[derive(Debug, Clone, Copy)]
pub enum Receive {
    /// The whole receive in one statement, alone or first in a transaction, with no
    /// look at the queue's head before it (PostgreSQL: a statement is a transaction of
    /// its own without a round trip more). Of the first `$3` visible messages of queue
    /// `$1` at `$2` (the dialect's now parameter), those delivered `$4` times already
    /// are dead-lettered, the rest locked under token `$5` for `$6` milliseconds. Every
    /// row carries the clock it read (`now`) and how many it dead-lettered
    /// (`dead_lettered`); a take of nothing returns one row of those alone (`seq`
    /// NULL).
    OneStatement {
        /// The receive alone, or first in a transaction that only takes: the lock
        /// moves the messages' `visible_at` to its end, out of the receivers' way.
        alone: &'static str,
        /// The take first in the transaction that acts on what it takes and deletes
        /// what it consumes: the lock leaves `visible_at` alone (the messages'
        /// `locked_until` hides those left held).
        in_tx: &'static str,
    },
    /// A cheap read of the head first, so an idle receiver takes no write lock, then a
    /// take in the writer's turn (SQLite).
    LookThenTake(LookThenTake),
}

/// The statements of [`Receive::LookThenTake`].
#[derive(Debug, Clone, Copy)]
pub struct LookThenTake {
    /// The first visible message of queue `$1` at `$2` (the dialect's now parameter):
    /// `seq`, `delivery_count`.
    pub any_ready: &'static str,
    /// Locks up to `$3` visible messages of queue `$1` at `$2` delivered fewer than `$4`
    /// times under token `$5` until `$6`, in queue order; returns the messages.
    pub take: &'static str,
    /// [`Self::take`] in the transaction that acts on what it takes: the lock leaves
    /// `visible_at` alone, as [`Receive::OneStatement`]'s `in_tx`.
    pub take_in_tx: &'static str,
    /// Up to `$3` visible messages of queue `$1` at `$2`: `seq`, `delivery_count`.
    pub candidates: &'static str,
    /// Locks the messages `$1` (list) under token `$2` until `$3`.
    pub lock: &'static str,
    /// Dead-letters the messages `$1` (list) at `$2`: delivered too often.
    pub dead_letter_exhausted: &'static str,
    /// Deletes the messages `$1` (list).
    pub delete_many: &'static str,
}
