//! The SQLite text of the store's statements. Lists are bound as JSON arrays and read
//! with `json_each`; the statements of a batch that PostgreSQL runs set-based over
//! arrays run here once per row (in-process calls; the commit is what costs).
//!
//! A batch of rows (an array of arrays, each row's fields read with `value ->> n`) is
//! bound in SQLite's binary JSON (`jsonb.rs`) and read with `jsonb_each`, whose `value`
//! for an inner array is that array in binary form, which `->>` reads as it is. Bound
//! as text and read with `json_each`, the batch was parsed into binary form, each row
//! written back to text, and that text parsed again for every field. Under a burst
//! SQLite's JSON functions went from about 9% of the machine's samples (`perf`, idle
//! time included) to about 4% with `jsonb_each`, and to about 3% with the batch bound
//! in binary form too. A list of single values (`SELECT value FROM json_each(..)`) has
//! no inner text to parse; it stays text. (`jsonb_each` is in the SQLite that sqlx
//! bundles, 3.51.)
//!
//! A hot statement's `LIMIT` is written `LIMIT CAST($n AS INTEGER)`, not `LIMIT $n`.
//! SQLite reads a bare parameter in `LIMIT` as a constant for its plan and marks the
//! statement to be compiled again whenever that parameter is bound anew, which sqlx
//! does at every execution: the receive and the claim were parsed and planned again
//! on every call. The cast is the same number to the statement and no constant to
//! the planner, so the prepared statement is kept.

use const_format::concatcp;

use crate::driver::{LookThenTake, Receive, Statements};
use crate::rows::{DEAD_LETTER_COLUMNS, MESSAGE_COLUMNS};

/// Many messages on a queue, enqueued at a time, read from the one row of `m(queue,
/// now, batch)`, a CTE that names the parameters of the statement it is part of:
/// `batch` is a JSON array of `[message_id, correlation_id, properties, body as hex,
/// visible_at]`, inserted in order.
const INSERT_MESSAGES: &str = "INSERT INTO queue_messages \
    (queue, message_id, correlation_id, properties, body, enqueued_at, visible_at) \
    SELECT m.queue, value ->> 0, value ->> 1, value ->> 2, unhex(value ->> 3), m.now, \
        value ->> 4 \
    FROM m, jsonb_each(m.batch) ORDER BY key";

/// See `Statements::fill_causes`.
const FILL_CAUSES: &str = "UPDATE order_state SET error_cause = v.value ->> '$.cause', \
        error_cause_step = order_state.current_step, error_cause_at = order_state.updated_at \
        FROM jsonb_each($1) AS v \
        WHERE order_state.order_id = v.value ->> '$.order_id' \
        AND order_state.updated_at = v.value ->> '$.at' AND order_state.process_state = 'Error' \
        AND order_state.error_cause IS NULL";

/// The statements the shared code runs, in SQLite.
pub(crate) const SQL: Statements = Statements {
    texts_of_1: "SELECT value FROM json_each($1)",
    // A write transaction holds SQLite's one write lock from its start.
    for_update: "",
    for_share: "",
    // Times are text in one format: the minute is its first 16 characters.
    minute_of: "(substr({}, 1, 16) || ':00.000000Z')",
    latency_ms: "((julianday(updated_at) - julianday(created_at)) * 86400000.0)",
    fill_causes: FILL_CAUSES,
    // The expression of the index `orders_by_customer` (migration 0020).
    customer_orders: "order_id IN (SELECT o.order_id FROM orders o WHERE json_extract(o.details, '$.customer_id') = ?)",
    select_details: SELECT_DETAILS,
    find_expired: LOCK_EXPIRED,
    next_claimable: NEXT_CLAIMABLE,
    next_visible: NEXT_VISIBLE,
    sweep_due: SWEEP_DUE,
    lock_expired: LOCK_EXPIRED,
    q_receive: Receive::LookThenTake(LookThenTake {
        any_ready: Q_ANY_READY,
        take: Q_TAKE,
        take_in_tx: Q_TAKE_IN_TX,
        candidates: Q_CANDIDATES,
        lock: Q_LOCK,
        dead_letter_exhausted: Q_DEAD_LETTER_EXHAUSTED,
        delete_many: Q_DELETE_MANY,
    }),
    sends_alone: false,
    writes_send: false,
    o_lease: O_LEASE,
    o_dead: O_DEAD,
    o_sent: O_SENT,
    o_failed: O_FAILED,
    // A delete or update frees its space and index entries as it commits.
    tidy: None,
};

/// No lock holds the message at `$2`.
const UNLOCKED: &str = "(locked_until IS NULL OR locked_until <= $2)";

/// The first visible message of queue `$1` at `$2`.
pub(crate) const Q_ANY_READY: &str = concatcp!(
    "SELECT seq, delivery_count FROM queue_messages WHERE queue = $1 AND visible_at <= $2 AND ",
    UNLOCKED,
    " ORDER BY visible_at, seq LIMIT 1"
);

/// What another process's commit may have filled: those of the queues `$1` (a JSON
/// array of names) holding a message visible at `$2`, and `$3` when an order is
/// claimable at `$2`. Each a seek on an index.
pub(crate) const FILLED: &str = concatcp!(
    "SELECT j.value AS what FROM json_each($1) j WHERE EXISTS (SELECT 1 FROM queue_messages \
    WHERE queue = j.value AND visible_at <= $2 AND ",
    UNLOCKED,
    ") UNION ALL SELECT $3 AS what WHERE EXISTS (SELECT 1 FROM order_state \
    INDEXED BY order_state_claimable WHERE process_state = 'Pending' AND locked_by IS NULL \
    AND next_attempt_at <= $2)"
);

/// The lock of [`Q_TAKE`], to which it adds what the lock does to `visible_at`.
const TAKE_LOCK: &str = "UPDATE queue_messages SET delivery_count = delivery_count + 1, \
    lock_token = $5, locked_until = $6";

/// The messages [`Q_TAKE`] locks, and what it returns of them.
const TAKE_WHICH: &str = concatcp!(
    " WHERE seq IN (SELECT seq FROM queue_messages \
        WHERE queue = $1 AND visible_at <= $2 AND delivery_count < $4 AND ",
    UNLOCKED,
    " ORDER BY visible_at, seq LIMIT CAST($3 AS INTEGER)) RETURNING ",
    MESSAGE_COLUMNS
);

/// Locks up to `$3` visible messages of queue `$1` at `$2` delivered fewer than `$4`
/// times, under token `$5` until `$6`, moving them out of the receivers' way until then.
pub(crate) const Q_TAKE: &str = concatcp!(TAKE_LOCK, ", visible_at = $6", TAKE_WHICH);

/// [`Q_TAKE`] in the transaction that acts on what it takes: `visible_at` stays (the
/// lock's `locked_until` hides a message left held), so the queue's index of ready
/// messages is not written for a message deleted before the transaction ends.
pub(crate) const Q_TAKE_IN_TX: &str = concatcp!(TAKE_LOCK, TAKE_WHICH);

/// Up to `$3` visible messages of queue `$1` at `$2`.
pub(crate) const Q_CANDIDATES: &str = concatcp!(
    "SELECT seq, delivery_count FROM queue_messages WHERE queue = $1 AND visible_at <= $2 AND ",
    UNLOCKED,
    " ORDER BY visible_at, seq LIMIT CAST($3 AS INTEGER)"
);

/// `$1` JSON array of seqs, `$2` lock token, `$3` locked until.
pub(crate) const Q_LOCK: &str = concatcp!(
    "UPDATE queue_messages SET delivery_count = delivery_count + 1, lock_token = $2, \
     locked_until = $3, visible_at = $3 WHERE seq IN (SELECT value FROM json_each($1)) RETURNING ",
    MESSAGE_COLUMNS
);

/// `$1` JSON array of seqs dead-lettered at `$2`: delivered too often.
pub(crate) const Q_DEAD_LETTER_EXHAUSTED: &str = concatcp!(
    "INSERT INTO queue_dead_letters (",
    DEAD_LETTER_COLUMNS,
    ") SELECT seq, queue, message_id, correlation_id, properties, body, enqueued_at, delivery_count, \
     'MaxDeliveryCountExceeded', 'delivered ' || delivery_count || ' times without being completed', $2 \
     FROM queue_messages WHERE seq IN (SELECT value FROM json_each($1))"
);

/// `$1` JSON array of seqs and `$2` of their lock tokens, pairwise; `$3` now. Each
/// seq's token is read by its index in `$2` (one pass over the batch; a join of the two
/// arrays would cost the batch's size squared).
pub(crate) const Q_COMPLETE_MANY: &str = "DELETE FROM queue_messages \
    WHERE (seq, lock_token) IN (SELECT s.value, $2 ->> s.key FROM json_each($1) s) \
    AND locked_until > $3 RETURNING seq, lock_token";

/// [`Q_COMPLETE_MANY`] (`$1`, `$2`, `$3` now), then [`Q_INSERT_MANY`] on queue `$4`
/// of the rows `$5`, enqueued at `$3`: one round trip where a send ends the holds of
/// what it answers (an agent's reply, a scheduler's next request).
pub(crate) const Q_COMPLETE_AND_INSERT: &str = concatcp!(
    Q_COMPLETE_MANY,
    "; WITH m(queue, now, batch) AS (SELECT $4, $3, $5) ",
    INSERT_MESSAGES
);

/// `$1` relay, `$2` lease end, `$3` now, `$4` limit.
pub(crate) const O_LEASE: &str = "UPDATE outbox SET relay = $1, leased_until = $2, attempts = attempts + 1 \
    WHERE seq IN (SELECT seq FROM outbox INDEXED BY outbox_unsent WHERE sent_at IS NULL \
        AND dead_at IS NULL AND (leased_until IS NULL OR leased_until <= $3) ORDER BY seq LIMIT CAST($4 AS INTEGER)) \
    RETURNING seq, queue, message_id, correlation_id, properties, body, scheduled_at, attempts";

/// `$1` seqs, `$2` relay, `$3` now, `$4` the reason.
pub(crate) const O_DEAD: &str = "UPDATE outbox SET dead_at = $3, dead_reason = $4, last_error = $4, \
    leased_until = NULL WHERE seq IN (SELECT value FROM json_each($1)) AND relay = $2";

/// `$1` seqs, `$2` relay, `$3` now.
pub(crate) const O_SENT: &str = "UPDATE outbox SET sent_at = $3, last_error = NULL \
    WHERE seq IN (SELECT value FROM json_each($1)) AND relay = $2";

/// `$1` seqs, `$2` relay, `$3` the error, `$4` not before.
pub(crate) const O_FAILED: &str = "UPDATE outbox SET last_error = $3, leased_until = $4 \
    WHERE seq IN (SELECT value FROM json_each($1)) AND relay = $2";

/// Deletes the messages `$1` (JSON array of seqs).
pub(crate) const Q_DELETE_MANY: &str =
    "DELETE FROM queue_messages WHERE seq IN (SELECT value FROM json_each($1))";

/// The details of order `$1`.
pub(crate) const SELECT_DETAILS: &str = "SELECT details FROM orders WHERE order_id = $1";

/// The details of the orders `$1` (JSON array): `order_id, details`.
const DETAILS_OF: &str =
    "SELECT order_id, details FROM orders WHERE order_id IN (SELECT value FROM json_each($1))";

/// `$1` owner, `$2` deadline, `$3` now, `$4` limit, `$5` the default workflow's
/// name, `$6` JSON object of the workflows it starts (name to version), `$7` JSON
/// array of the `name@version`s it carries on. A new order is pinned here.
pub(crate) const CLAIM: &str = "UPDATE order_state SET process_state = 'Processing', \
    locked_by = $1, complete_by = $2, lock_epoch = lock_epoch + 1, updated_at = $3, \
    workflow = coalesce(workflow, $5), \
    workflow_version = coalesce(workflow_version, \
        json_extract($6, '$.\"' || coalesce(workflow, $5) || '\"')) \
    WHERE order_id IN (SELECT order_id FROM order_state INDEXED BY order_state_claimable \
        WHERE process_state = 'Pending' AND locked_by IS NULL AND next_attempt_at <= $3 \
        AND CASE WHEN workflow_version IS NULL \
            THEN json_extract($6, '$.\"' || coalesce(workflow, $5) || '\"') IS NOT NULL \
            ELSE workflow || '@' || workflow_version IN (SELECT value FROM json_each($7)) END \
        ORDER BY next_attempt_at LIMIT CAST($4 AS INTEGER)) \
    RETURNING order_id, lock_epoch, complete_by, current_step, failure_count, reply_to, \
    finish_as, generation, last_error, workflow, workflow_version, waiting_on";

/// History for a claimed batch and the claimed orders' details, in one round trip:
/// `$1` JSON array of order ids, `$2` now, `$3` owner, `$4` the kind. Returns
/// `order_id, details` (the history insert returns nothing).
pub(crate) const CLAIMED_HISTORY_AND_DETAILS: &str = concatcp!(
    "INSERT INTO order_history \
    (order_id, at, actor, kind, from_state, to_state, epoch) \
    SELECT order_id, $2, $3, $4, 'Pending', 'Processing', lock_epoch FROM order_state \
    WHERE order_id IN (SELECT value FROM json_each($1)); ",
    DETAILS_OF
);

/// `$1` JSON array of `[order_id, owner, epoch]` fences, `$2` now. The `+` keeps
/// the planner off the process_state index: the batch drives, each fence one
/// primary-key probe, however many orders are Processing.
pub(crate) const COMPLETE: &str = "UPDATE order_state SET process_state = 'Processed', \
    locked_by = NULL, complete_by = NULL, updated_at = $2 \
    FROM (SELECT value ->> 0 AS order_id, value ->> 1 AS owner, value ->> 2 AS epoch \
          FROM jsonb_each($1)) AS f \
    WHERE order_state.order_id = f.order_id AND order_state.locked_by = f.owner \
    AND order_state.lock_epoch = f.epoch \
    AND +order_state.process_state = 'Processing' AND order_state.complete_by > $2 \
    RETURNING order_state.order_id";

/// History for a completed batch: `$1` JSON array of fences, `$2` now, `$3` the kind.
pub(crate) const COMPLETED_HISTORY: &str = "INSERT INTO order_history \
    (order_id, at, actor, kind, from_state, to_state, epoch) \
    SELECT value ->> 0, $2, value ->> 1, $3, 'Processing', 'Processed', value ->> 2 \
    FROM jsonb_each($1)";

/// The timed-out orders of a sweep: `$1` now, `$2` limit (the write lock is held).
/// See [`crate::driver::Statements::next_claimable`] (the claimable index,
/// `order_state_claimable`, gives the minimum).
pub(crate) const NEXT_CLAIMABLE: &str = "SELECT min(next_attempt_at) AS due, $1 AS now \
    FROM order_state INDEXED BY order_state_claimable \
    WHERE process_state = 'Pending' AND locked_by IS NULL";

/// See [`crate::driver::Statements::sweep_due`]: the predicate of [`LOCK_EXPIRED`].
pub(crate) const SWEEP_DUE: &str = "SELECT EXISTS (SELECT 1 FROM order_state s \
        INDEXED BY order_state_deadlines \
        WHERE process_state = 'Processing' AND complete_by < $1) AS expired, \
    EXISTS (SELECT 1 FROM alerts a WHERE a.published_at IS NULL) AS alerts, \
    EXISTS (SELECT 1 FROM service_health h WHERE h.outage > h.alerted \
        OR (h.state = 'Up' AND h.outage > h.resolved)) AS outages";

/// See [`crate::driver::Statements::next_visible`] (`queue_messages_ready` gives the
/// minimum).
pub(crate) const NEXT_VISIBLE: &str = "SELECT min(visible_at) AS due, $2 AS now \
    FROM queue_messages WHERE queue = $1";

pub(crate) const LOCK_EXPIRED: &str = "SELECT order_id, locked_by, lock_epoch, complete_by, \
    failure_count, current_step, finish_as, \
    (SELECT group_concat(t.name, char(10)) FROM order_steps t WHERE t.order_id = s.order_id \
        AND t.status IN ('Started', 'Succeeded')) AS in_force, \
    (SELECT h.service FROM service_health h WHERE h.service = s.waiting_on \
        AND h.state IN ('Down', 'Probing')) AS waiting_for \
    FROM order_state s INDEXED BY order_state_deadlines \
    WHERE process_state = 'Processing' AND complete_by < $1 ORDER BY complete_by LIMIT CAST($2 AS INTEGER)";

/// One decided recovery: `$1` order, `$2` failure count, `$3` state, `$4` next attempt
/// (NULL: unchanged), `$5` reason, `$6` now, `$7` epoch, `$8` finish_as.
pub(crate) const RECOVER: &str = "UPDATE order_state SET failure_count = $2, \
    process_state = $3, locked_by = NULL, complete_by = NULL, \
    next_attempt_at = coalesce($4, next_attempt_at), last_error = $5, updated_at = $6, \
    finish_as = $8 \
    WHERE order_id = $1 AND process_state = 'Processing' AND lock_epoch = $7 AND complete_by < $6";

// Batches arrive as one JSON array bound to one parameter, each element an array of
// the row's values, so a batch costs one statement however large it is: every
// statement is a round trip to the connection's worker thread.

/// Many step touches: `$1` now, `$2` JSON array of
/// `[order_id, owner, epoch, expect, new_step, failed, error]` (distinct orders).
pub(crate) const TOUCH_STEPS: &str = "UPDATE order_state SET \
    current_step = CASE WHEN w.new_step > order_state.current_step THEN w.new_step \
        ELSE order_state.current_step END, \
    last_error = CASE WHEN w.failed THEN w.err ELSE order_state.last_error END, \
    waiting_on = CASE WHEN w.new_step > order_state.current_step THEN NULL \
        ELSE order_state.waiting_on END, \
    updated_at = $1 \
    FROM (SELECT value ->> 0 AS order_id, value ->> 1 AS owner, value ->> 2 AS epoch, \
          value ->> 3 AS expect, value ->> 4 AS new_step, value ->> 5 AS failed, \
          value ->> 6 AS err FROM jsonb_each($2)) AS w \
    WHERE order_state.order_id = w.order_id AND order_state.locked_by = w.owner \
    AND order_state.lock_epoch = w.epoch AND +order_state.process_state = 'Processing' \
    AND order_state.complete_by > $1 \
    AND (w.expect < 0 OR order_state.current_step = w.expect) \
    RETURNING order_state.order_id";

/// Many history entries at `$1`: `$3` a JSON array of
/// `[order_id, actor, kind, from_state, to_state, epoch, step, reason]`, in order.
const INSERT_HISTORIES: &str = "INSERT INTO order_history \
    (order_id, at, actor, kind, from_state, to_state, epoch, step, reason) \
    SELECT value ->> 0, $1, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
        value ->> 5, value ->> 6, value ->> 7 \
    FROM jsonb_each($3) ORDER BY key";

/// Many step records and their history entries at `$1`, in one round trip: `$2` JSON
/// array of `[order_id, index, name, status, idempotency_key, detail, epoch,
/// irreversible, attempts]`, applied
/// in order; `$3` the history entries as [`INSERT_HISTORIES`] takes them.
pub(crate) const STEP_ROWS: &str = concatcp!(
    "INSERT INTO order_steps \
    (order_id, step_index, name, status, idempotency_key, attempts, detail, epoch, updated_at, \
     irreversible) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, \
        value ->> 8, value ->> 5, value ->> 6, $1, \
        value ->> 7 \
    FROM jsonb_each($2) WHERE true ORDER BY key \
    ON CONFLICT (order_id, step_index) DO UPDATE SET \
    name = excluded.name, status = excluded.status, \
    attempts = order_steps.attempts + excluded.attempts, detail = excluded.detail, \
    epoch = excluded.epoch, updated_at = excluded.updated_at, \
    irreversible = excluded.irreversible; ",
    INSERT_HISTORIES
);

/// Many new orders at `$1`: `$2` JSON array of `[order_id, details]`; returns the
/// ids inserted (a repeated id, here or already stored, is not).
pub(crate) const INSERT_ORDERS: &str = "INSERT INTO orders (order_id, details, created_at) \
    SELECT value ->> 0, value ->> 1, $1 FROM jsonb_each($2) WHERE true ORDER BY key \
    ON CONFLICT (order_id) DO NOTHING RETURNING order_id";

/// The Pending state rows of new orders at `$1` and their history entries, in one
/// round trip: `$2` JSON array of `[order_id, reply_to, workflow]`, `$3` the history
/// entries as [`INSERT_HISTORIES`] takes them.
pub(crate) const INSERT_STATES_AND_HISTORIES: &str = concatcp!(
    "INSERT INTO order_state \
    (order_id, process_state, next_attempt_at, reply_to, workflow, created_at, updated_at) \
    SELECT value ->> 0, 'Pending', $1, value ->> 1, value ->> 2, $1, $1 FROM jsonb_each($2); ",
    INSERT_HISTORIES
);

/// Records many message ids of queue `$1` as seen until `$2`, unless seen and not
/// expired at `$3`: `$4` JSON array of ids. Returns the ids that are new.
pub(crate) const Q_DEDUP_MANY: &str = "INSERT INTO queue_dedup (queue, message_id, expires_at) \
    SELECT $1, value, $2 FROM json_each($4) WHERE true ORDER BY key \
    ON CONFLICT (queue, message_id) DO UPDATE SET expires_at = excluded.expires_at \
    WHERE queue_dedup.expires_at <= $3 RETURNING message_id";

/// Many messages on queue `$1` enqueued at `$2`: `$3` JSON array of
/// `[message_id, correlation_id, properties, body as hex, visible_at]`, in order.
pub(crate) const Q_INSERT_MANY: &str = concatcp!(
    "WITH m(queue, now, batch) AS (SELECT $1, $2, $3) ",
    INSERT_MESSAGES
);

#[cfg(test)]
mod tests {
    /// A bare parameter as a statement's `LIMIT` makes SQLite compile the statement
    /// again at every execution (see the module's documentation).
    #[test]
    fn no_statement_here_takes_its_limit_as_a_bare_parameter() {
        let text = include_str!("statements.rs");
        let bare: Vec<&str> = text
            .match_indices("LIMIT $")
            .filter(|(at, needle)| {
                text[at + needle.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            })
            .map(|(at, _)| text[at..].lines().next().unwrap_or_default())
            .collect();
        assert!(bare.is_empty(), "LIMIT bound bare: {bare:?}");
    }

    /// A statement that reads the fields of a batch's rows (`value ->> n`) reads the
    /// rows with `jsonb_each`: `json_each` would hand each row over as text, parsed
    /// again for every field (see the module's documentation).
    #[test]
    fn rows_read_field_by_field_come_from_jsonb_each() {
        let text = include_str!("statements.rs");
        // The statements' text, without the comments that talk about them.
        let code: String = text[..text.find("#[cfg(test)]").unwrap_or(text.len())]
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let as_text: Vec<&str> = code
            .split("const ")
            .filter(|c| c.contains("value ->>") && c.contains("json_each("))
            .map(|c| c.lines().next().unwrap_or_default())
            .collect();
        assert!(as_text.is_empty(), "rows read as text: {as_text:?}");
    }
}
