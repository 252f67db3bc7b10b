//! SQL that reads the same in both dialects: `$n` parameters, no casts, no dialect
//! functions. Times are bound as [`Ts`](crate::time::Ts), which each dialect encodes
//! its own way. Statements that differ live in `sqlite/statements.rs` and
//! `postgres/statements.rs`, named alike (`driver::Statements`).

use orderly_core::ProcessState;
use orderly_core::store::{MAX_BATCH, OrderFilter};

use const_format::concatcp;

use crate::rows::{HISTORY_COLUMNS, STATE_COLUMNS, STEP_COLUMNS};
use crate::time::Ts;

/// The state row of one order.
pub(crate) const SELECT_STATE: &str = concatcp!(
    "SELECT ",
    STATE_COLUMNS,
    " FROM order_state WHERE order_id = $1"
);

/// One history entry.
pub(crate) const INSERT_HISTORY: &str = "INSERT INTO order_history \
    (order_id, at, actor, kind, from_state, to_state, epoch, step, reason) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// The fence every scheduler write carries: `$1` order, `$2` owner, `$3` epoch, and the
/// deadline not yet passed at `$5`.
const FENCED: &str = " WHERE order_id = $1 AND locked_by = $2 AND lock_epoch = $3 \
    AND process_state = 'Processing' AND complete_by > $5";

/// The owner starts undoing the order, to end as `$4`.
pub(crate) const BEGIN_COMPENSATION: &str = concatcp!(
    "UPDATE order_state SET finish_as = $4, updated_at = $5",
    FENCED
);

/// The owner ends a cancel-requested order: Cancelled (`$4` is now).
pub(crate) const FINISH_CANCELLED: &str = concatcp!(
    "UPDATE order_state SET process_state = 'Cancelled', locked_by = NULL, complete_by = NULL, \
     finish_as = NULL, updated_at = $4",
    FENCED
);

/// A restarted owner (`$1`) takes its live orders back under a new epoch at `$2`.
pub(crate) const RESUME_OWNED: &str = "UPDATE order_state SET lock_epoch = lock_epoch + 1, \
    updated_at = $2 \
    WHERE locked_by = $1 AND process_state = 'Processing' AND complete_by > $2 \
    RETURNING order_id, lock_epoch, complete_by, current_step, failure_count, reply_to, finish_as, \
    generation, last_error, workflow, workflow_version, waiting_on";

/// Orders held by `$1`: only Processing rows are scanned (the deadlines index).
pub(crate) const COUNT_OWNED: &str =
    "SELECT count(*) AS n FROM order_state WHERE process_state = 'Processing' AND locked_by = $1";

/// The fences of the Processing orders `$1` holds.
pub(crate) const OWNED: &str = "SELECT order_id, lock_epoch FROM order_state \
     WHERE process_state = 'Processing' AND locked_by = $1 ORDER BY order_id";

/// Whether any step of order `$1` may have taken effect.
/// The steps of an order that may have taken effect (started or done), in order, and
/// whether each can never be undone.
pub(crate) const IN_EFFECT: &str = "SELECT name, irreversible FROM order_steps \
    WHERE order_id = $1 AND status IN ('Started', 'Succeeded') ORDER BY step_index";

/// The columns an alert is read from (`a` alerts, `s` its step).
const ALERT_SELECT: &str = "SELECT a.alert_id, a.order_id, a.raised_at, a.step_index, \
    s.name AS step, a.last_error, a.failure_count, a.reply_to, a.published_at, \
    a.acknowledged_at, a.acknowledged_by \
    FROM alerts a LEFT JOIN order_steps s \
    ON s.order_id = a.order_id AND s.step_index = a.step_index ";

/// Unpublished alerts, oldest first: `$1` limit.
pub(crate) const UNPUBLISHED_ALERTS: &str = concatcp!(
    ALERT_SELECT,
    "WHERE a.published_at IS NULL ORDER BY a.alert_id LIMIT $1"
);

/// Alerts newest first: `$1` open only (1) or all (0), `$2` limit.
pub(crate) const LIST_ALERTS: &str = concatcp!(
    ALERT_SELECT,
    "WHERE ($1 = 0 OR a.acknowledged_at IS NULL) ORDER BY a.alert_id DESC LIMIT $2"
);

/// Acknowledges alert `$1` by `$2` at `$3`, unless it already was.
pub(crate) const ACK_ALERT: &str = "UPDATE alerts SET acknowledged_at = $3, acknowledged_by = $2 \
     WHERE alert_id = $1 AND acknowledged_at IS NULL";

/// One alert by id (`$1`).
pub(crate) const ONE_ALERT: &str = concatcp!(ALERT_SELECT, "WHERE a.alert_id = $1");

/// Marks one alert (`$1`) published at `$2`.
pub(crate) const MARK_ALERT_PUBLISHED: &str =
    "UPDATE alerts SET published_at = $2 WHERE alert_id = $1 AND published_at IS NULL";

/// A heartbeat: the deadline moves to `$4` (never backwards).
pub(crate) const EXTEND: &str = concatcp!(
    "UPDATE order_state SET \
     complete_by = CASE WHEN complete_by < $4 THEN $4 ELSE complete_by END, updated_at = $5",
    FENCED,
    " RETURNING complete_by"
);

/// The owner gives up: Error, with `$4` as the last error. A permanent failure is a
/// real failure, so it counts in FailureCount like a timeout does.
pub(crate) const FAIL: &str = concatcp!(
    "UPDATE order_state SET process_state = 'Error', locked_by = NULL, complete_by = NULL, \
     failure_count = failure_count + 1, last_error = $4, finish_as = NULL, updated_at = $5",
    FENCED
);

/// The owner hands the order back: Pending, due again at `$4`.
pub(crate) const RELEASE: &str = concatcp!(
    "UPDATE order_state SET process_state = 'Pending', locked_by = NULL, complete_by = NULL, \
     next_attempt_at = $4, updated_at = $5",
    FENCED
);

/// An operator's retry as a fresh run: the next generation, from the first step.
pub(crate) const FRESH_RUN: &str = concatcp!(
    "UPDATE order_state SET generation = generation + 1, current_step = 0 \
     WHERE order_id = $1 RETURNING ",
    STATE_COLUMNS
);

/// An operator's retry of an order that stopped half undone: it finishes undoing
/// first (as after a failure), then runs afresh ([`RUN_AFRESH_AFTER_UNDO`]).
pub(crate) const UNDO_THEN_RETRY: &str = concatcp!(
    "UPDATE order_state SET finish_as = 'Error', retry_after_undo = TRUE \
     WHERE order_id = $1 RETURNING ",
    STATE_COLUMNS
);

/// The owner finished undoing an order an operator retried: instead of Error it starts
/// the fresh run (the next generation, from the first step), due at once (`$4` is now).
/// Zero rows: the order was not marked so (or the fence failed).
pub(crate) const RUN_AFRESH_AFTER_UNDO: &str = concatcp!(
    "UPDATE order_state SET process_state = 'Pending', locked_by = NULL, complete_by = NULL, \
     finish_as = NULL, retry_after_undo = FALSE, generation = generation + 1, \
     current_step = 0, next_attempt_at = $4, last_error = NULL, updated_at = $5",
    FENCED,
    " AND retry_after_undo RETURNING generation"
);

/// The step records of the previous run, gone with a fresh run (its history keeps them).
pub(crate) const CLEAR_STEPS: &str = "DELETE FROM order_steps WHERE order_id = $1";

/// An operator moves an order whose state (`$2`) and epoch (`$4`) were just read:
/// to `$5`, at `$3`, marked to end as `$6` once its steps are undone (NULL: not). Sent
/// back to Pending, it starts a new run: no failures counted and no last error (the
/// earlier run's error stays in its history). Zero rows means it changed meanwhile.
pub(crate) const OPERATOR_MOVE: &str = concatcp!(
    "UPDATE order_state SET process_state = $5, locked_by = NULL, complete_by = NULL, \
     finish_as = $6, retry_after_undo = FALSE, \
     failure_count = CASE WHEN $5 = 'Pending' THEN 0 ELSE failure_count END, \
     next_attempt_at = CASE WHEN $5 = 'Pending' THEN $3 ELSE next_attempt_at END, \
     last_error = CASE WHEN $5 = 'Pending' THEN NULL ELSE last_error END, \
     updated_at = $3 \
     WHERE order_id = $1 AND process_state = $2 AND lock_epoch = $4 RETURNING ",
    STATE_COLUMNS
);

/// The steps of one order.
pub(crate) const SELECT_STEPS: &str = concatcp!(
    "SELECT ",
    STEP_COLUMNS,
    " FROM order_steps WHERE order_id = $1 ORDER BY step_index"
);

/// The history of one order.
pub(crate) const SELECT_HISTORY: &str = concatcp!(
    "SELECT ",
    HISTORY_COLUMNS,
    " FROM order_history WHERE order_id = $1 ORDER BY seq"
);

/// Orders by state, in rows to add up per state: the live ones and those in Error, each
/// state through its own index; the Processed and Cancelled ones from the tallies
/// (migration 0022) of the minutes before `$1` and the rows finished since. `$1` is a
/// mark the tallies reached ([`TALLY_MARK`], read first): the mark only moves forward,
/// so the tallies before it are whole in this statement's snapshot, whatever tally
/// commits meanwhile. Bound rather than read by a subquery, for PostgreSQL's planner
/// to see how few rows follow it (with a subquery it reads every order in parallel).
pub(crate) const COUNT_BY_STATE: &str = "\
    SELECT process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Pending' GROUP BY process_state \
    UNION ALL \
    SELECT process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Processing' GROUP BY process_state \
    UNION ALL \
    SELECT process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Error' GROUP BY process_state \
    UNION ALL \
    SELECT process_state, CAST(sum(orders) AS BIGINT) AS n FROM finished_tally \
    WHERE minute < $1 GROUP BY process_state \
    UNION ALL \
    SELECT process_state, count(*) AS n FROM order_state \
    WHERE finished_at >= $1 AND process_state IN ('Processed', 'Cancelled') \
    GROUP BY process_state";

/// Up to when the tallies of finished orders go.
pub(crate) const TALLY_MARK: &str = "SELECT upto FROM finished_tally_mark";

/// Live orders by workflow, version and state.
/// Stores a workflow version's definition unless it is stored: `$1` name, `$2` version,
/// `$3` definition, `$4` now, `$5` who.
pub(crate) const RECORD_WORKFLOW: &str = "INSERT INTO workflow_definitions \
    (name, version, definition, first_seen_at, first_seen_by) VALUES ($1, $2, $3, $4, $5) \
    ON CONFLICT (name, version) DO NOTHING";

/// One stored workflow version's definition: `$1` name, `$2` version.
pub(crate) const STORED_WORKFLOW: &str =
    "SELECT definition FROM workflow_definitions WHERE name = $1 AND version = $2";

/// Moves a batch of orders of workflow `$1` pinned to version `$2` and in state `$5`
/// or `$6` to version `$3` at `$4`, at most `$7` of them; returns each with its state
/// and epoch (for its history entry).
pub(crate) const MOVE_VERSION: &str = "UPDATE order_state SET workflow_version = $3, \
    updated_at = $4 \
    WHERE order_id IN (SELECT order_id FROM order_state WHERE workflow = $1 \
        AND workflow_version = $2 AND process_state IN ($5, $6) LIMIT $7) \
    AND workflow = $1 AND workflow_version = $2 AND process_state IN ($5, $6) \
    RETURNING order_id, process_state, lock_epoch";

/// Stores the message key unless one is: `$1` secret (hex), `$2` now, `$3` who.
pub(crate) const RECORD_MESSAGE_KEY: &str = "INSERT INTO message_keys \
    (id, secret, created_at, created_by) VALUES (1, $1, $2, $3) ON CONFLICT (id) DO NOTHING";

/// The stored message key.
pub(crate) const MESSAGE_KEY: &str = "SELECT secret FROM message_keys WHERE id = 1";

/// Every stored workflow version, oldest first per name.
pub(crate) const STORED_WORKFLOWS: &str = "SELECT name, version, definition, first_seen_at, \
    first_seen_by FROM workflow_definitions ORDER BY name, first_seen_at, version";

/// Orders not finished (Pending, Processing, Error) by workflow version and state.
/// One count per state, so each reads its state's partial index (one `IN` over the
/// three reads every order).
pub(crate) const WORKFLOWS_IN_FLIGHT: &str = "\
    SELECT workflow, workflow_version, process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Pending' GROUP BY workflow, workflow_version, process_state \
    UNION ALL \
    SELECT workflow, workflow_version, process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Processing' GROUP BY workflow, workflow_version, process_state \
    UNION ALL \
    SELECT workflow, workflow_version, process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Error' GROUP BY workflow, workflow_version, process_state \
    ORDER BY workflow, workflow_version, process_state";

/// Orders that reached a final state since `$1` (and are still in it), in rows to add up
/// per state: the Processed and Cancelled ones of the whole minutes from `$2` to the
/// tallies' mark `$3` from the tallies (see [`COUNT_BY_STATE`]), the others from their
/// rows (`finished_at` is set only on a finished row: the index of finished orders). At
/// 100 orders a second an hour is 360,000 rows; its tallies are 60 minutes'.
pub(crate) const FINISHED_SINCE: &str = "\
    SELECT process_state, CAST(sum(orders) AS BIGINT) AS n FROM finished_tally \
    WHERE minute >= $2 AND minute < $3 GROUP BY process_state \
    UNION ALL \
    SELECT process_state, count(*) AS n FROM order_state \
    WHERE finished_at >= $1 AND (finished_at < $2 OR finished_at >= $3) \
    AND process_state IN ('Processed', 'Cancelled') GROUP BY process_state \
    UNION ALL \
    SELECT process_state, count(*) AS n FROM order_state \
    WHERE process_state = 'Error' AND finished_at >= $1 GROUP BY process_state";

/// A bound value of a query built at run time.
pub(crate) enum Arg {
    Text(String),
    Int(i32),
    Time(Ts),
}

/// Default page size.
pub(crate) const DEFAULT_PAGE: u32 = 50;

/// The list query for `filter`, fetching one row more than the page to tell whether a
/// next page exists. Returns the SQL, its arguments and the page size.
/// `customer_orders`: the dialect's condition that an order is the customer's.
pub(crate) fn list_query(filter: &OrderFilter, customer_orders: &str) -> (String, Vec<Arg>, u32) {
    let mut q = Query {
        sql: String::from(concatcp!(
            "SELECT ",
            STATE_COLUMNS,
            " FROM order_state WHERE 1 = 1"
        )),
        args: Vec::new(),
    };
    q.filter(filter, customer_orders);
    if let Some(after) = &filter.after {
        q.bind(" AND (created_at > ?", Arg::Time(Ts(after.created_at)));
        q.bind(" OR (created_at = ?", Arg::Time(Ts(after.created_at)));
        q.bind(
            " AND order_id > ?))",
            Arg::Text(after.order_id.as_str().to_owned()),
        );
    }
    let limit = match filter.limit {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_BATCH),
    };
    if matches!(
        filter.state,
        Some(ProcessState::Pending | ProcessState::Processing)
    ) {
        // The orders in flight are few and the newest: read them through their state's
        // partial index, then sort. Walking every order oldest first until the page is
        // full (what the planner picks for `ORDER BY ... LIMIT`, as if they were spread
        // evenly) reads past every finished order first (a million of them: 0.5 s).
        q.sql = format!(
            "WITH live AS MATERIALIZED ({}) SELECT * FROM live \
             ORDER BY created_at, order_id LIMIT {}",
            q.sql,
            limit + 1
        );
    } else {
        q.sql.push_str(&format!(
            " ORDER BY created_at, order_id LIMIT {}",
            limit + 1
        ));
    }
    (q.sql, q.args, limit)
}

/// A query built at run time and its bound values.
struct Query {
    sql: String,
    args: Vec<Arg>,
}

impl Query {
    /// Appends `clause`, its `?` the next parameter, bound to `arg`.
    fn bind(&mut self, clause: &str, arg: Arg) {
        self.args.push(arg);
        self.sql
            .push_str(&clause.replace('?', &format!("${}", self.args.len())));
    }

    /// The conditions of `filter` on the orders' fields.
    fn filter(&mut self, filter: &OrderFilter, customer_orders: &str) {
        if let Some(state) = filter.state {
            // A literal from a closed enum (no injection possible), so that the planner
            // can use that state's partial index, which a bound parameter would hide
            // from it.
            self.sql
                .push_str(&format!(" AND process_state = '{}'", state.as_str()));
        }
        if let Some(text) = &filter.error_contains {
            let pattern = format!("%{}%", like_escaped(&text.to_lowercase()));
            self.bind(
                " AND lower(last_error) LIKE ? ESCAPE '\\'",
                Arg::Text(pattern),
            );
        }
        if let Some(step) = filter.current_step {
            self.bind(" AND current_step = ?", Arg::Int(step));
        }
        if let Some(before) = filter.created_before {
            self.bind(" AND created_at < ?", Arg::Time(Ts(before)));
        }
        if let Some(customer) = &filter.customer {
            self.bind(
                &format!(" AND {customer_orders}"),
                Arg::Text(customer.clone()),
            );
        }
        if let Some(prefix) = &filter.id_prefix {
            let pattern = format!("{}%", like_escaped(prefix));
            self.bind(" AND order_id LIKE ? ESCAPE '\\'", Arg::Text(pattern));
        }
        if let Some(service) = &filter.waiting_for {
            // The waiting index's condition, so the planner can use it.
            self.sql
                .push_str(" AND process_state = 'Pending' AND waiting_on IS NOT NULL");
            self.bind(" AND waiting_on = ?", Arg::Text(service.clone()));
            self.bind(
                " AND next_attempt_at >= ?",
                Arg::Time(Ts(orderly_core::service::held())),
            );
        }
    }
}

/// `text` with the characters `LIKE` reads as patterns escaped (`\` the escape).
fn like_escaped(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

/// The check every leader's write makes first, in its transaction: `$1` name, `$2`
/// epoch, `$3` holder, `$4` now. One row: the term is current (and its SQL lease, if it
/// has one, unexpired). The row lock it takes orders it against a new term's start.
pub(crate) const LEADER_GUARD: &str = "UPDATE leadership SET last_write_at = $4 \
     WHERE name = $1 AND epoch = $2 AND holder = $3 \
       AND (lease_expires_at IS NULL OR lease_expires_at > $4)";

/// A new term whose lease lives elsewhere: `$1` name, `$2` holder, `$3` now. Returns
/// the epoch.
pub(crate) const BEGIN_TERM: &str = "INSERT INTO leadership \
     (name, epoch, holder, lease_expires_at, started_at, renewed_at) VALUES ($1, 1, $2, NULL, $3, $3) \
     ON CONFLICT (name) DO UPDATE SET epoch = leadership.epoch + 1, holder = excluded.holder, \
       lease_expires_at = NULL, started_at = excluded.started_at, \
       renewed_at = excluded.renewed_at, last_write_at = NULL \
     RETURNING epoch";

/// The SQL elector's acquire: `$1` name, `$2` holder, `$3` now, `$4` expiry. A new term
/// if none exists or the current one's SQL lease has expired or was released; no row
/// otherwise.
pub(crate) const ACQUIRE_LEASE: &str = "INSERT INTO leadership \
     (name, epoch, holder, lease_expires_at, started_at, renewed_at) VALUES ($1, 1, $2, $4, $3, $3) \
     ON CONFLICT (name) DO UPDATE SET epoch = leadership.epoch + 1, holder = excluded.holder, \
       lease_expires_at = excluded.lease_expires_at, started_at = excluded.started_at, \
       renewed_at = excluded.renewed_at, last_write_at = NULL \
     WHERE leadership.lease_expires_at IS NOT NULL AND leadership.lease_expires_at <= $3 \
     RETURNING epoch";

/// Renews (`$5` new expiry) or, with `$5` = `$4`, releases the SQL lease of a current
/// term: `$1` name, `$2` epoch, `$3` holder, `$4` now.
pub(crate) const SET_LEASE_EXPIRY: &str = "UPDATE leadership SET lease_expires_at = $5, renewed_at = $4 \
     WHERE name = $1 AND epoch = $2 AND holder = $3 AND lease_expires_at > $4";

/// The current term of `$1`.
pub(crate) const SELECT_TERM: &str = "SELECT name, epoch, holder, lease_expires_at, started_at, renewed_at \
     FROM leadership WHERE name = $1";

/// A claim's workflows it starts, as a JSON object of name to version (a bind value).
pub(crate) fn start_json(
    filter: &orderly_core::workflow::WorkflowFilter,
) -> orderly_core::Result<String> {
    serde_json::to_string(&filter.start).map_err(|e| crate::error::corrupt("claim filter", e))
}

/// A claim's versions it carries on, as `name@version` texts.
pub(crate) fn carry_on(filter: &orderly_core::workflow::WorkflowFilter) -> Vec<String> {
    filter.carry_on.iter().map(ToString::to_string).collect()
}
