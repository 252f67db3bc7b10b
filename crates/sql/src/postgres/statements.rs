//! The PostgreSQL text of the store's statements. Lists are bound as arrays; the hot
//! statements take a whole batch as parallel arrays (`unnest`) and write its history in
//! the same statement.

use const_format::concatcp;

use crate::driver::{Receive, Statements, Tidy};
use crate::rows::{DEAD_LETTER_COLUMNS, MESSAGE_COLUMNS};

/// The statements the shared code runs, in PostgreSQL.
pub(crate) const SQL: Statements = Statements {
    texts_of_1: "SELECT unnest(CAST($1 AS TEXT[]))",
    for_update: " FOR UPDATE",
    for_share: " FOR SHARE",
    minute_of: "(date_trunc('minute', {} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')",
    latency_ms: "(extract(epoch FROM (updated_at - created_at)) * 1000)",
    // The expression of the index `orders_by_customer` (migration 0020).
    fill_causes: "UPDATE order_state s SET error_cause = v.cause, \
        error_cause_step = s.current_step, error_cause_at = s.updated_at \
        FROM json_to_recordset(CAST($1 AS json)) AS v(order_id text, at timestamptz, cause text) \
        WHERE s.order_id = v.order_id AND s.updated_at = v.at AND s.process_state = 'Error' \
        AND s.error_cause IS NULL",
    customer_orders: "order_id IN (SELECT o.order_id FROM orders o WHERE o.details ->> 'customer_id' = ?)",
    select_details: SELECT_DETAILS,
    find_expired: FIND_EXPIRED,
    next_claimable: NEXT_CLAIMABLE,
    next_visible: NEXT_VISIBLE,
    sweep_due: SWEEP_DUE,
    lock_expired: LOCK_EXPIRED,
    q_receive: Receive::OneStatement {
        alone: Q_RECEIVE,
        in_tx: Q_RECEIVE_IN_TX,
    },
    sends_alone: true,
    writes_send: true,
    o_lease: O_LEASE,
    o_dead: O_DEAD,
    o_sent: O_SENT,
    o_failed: O_FAILED,
    tidy: Some(Tidy {
        dead_rows: DEAD_ROWS,
        horizon: HORIZON,
        vacuum: &VACUUM,
        unbounded: "SET statement_timeout = 0",
        bounded: "RESET statement_timeout",
    }),
};

/// The counts of left-behind row versions and live rows of the tables `$1` in this
/// schema (the statistics' figures, reported by each server process about once a
/// second). Only tables this role may vacuum (it owns them, or is a superuser): the
/// server skips the others with a warning, which would be no vacuum.
const DEAD_ROWS: &str = "SELECT t.relname AS table_name, t.n_dead_tup AS dead, \
        t.n_live_tup AS live \
    FROM pg_stat_user_tables t JOIN pg_class c ON c.oid = t.relid \
    WHERE t.schemaname = current_schema() AND t.relname = ANY($1::text[]) \
        AND pg_has_role(c.relowner, 'USAGE')";

/// What holds back the vacuums of this database's tables: the oldest of the other
/// sessions' transactions and snapshots, the prepared transactions and the replication
/// slots (`xid` has no order of its own: the oldest is the one of greatest age). No row
/// when nothing holds them back: then a vacuum removes everything, and the statistics'
/// count of dead rows, which other sessions report up to a second late (after the
/// vacuum that removed them, sometimes), is set right by the next one. Sessions of
/// other roles show theirs only to a role allowed to read all statistics; one that
/// cannot see the holder sees the horizon move with the others, and vacuums as before.
const HORIZON: &str = "SELECT x::text AS horizon FROM ( \
        SELECT backend_xmin AS x FROM pg_stat_activity \
            WHERE datname = current_database() AND backend_xmin IS NOT NULL \
                AND pid <> pg_backend_pid() \
        UNION ALL SELECT backend_xid FROM pg_stat_activity \
            WHERE datname = current_database() AND backend_xid IS NOT NULL \
                AND pid <> pg_backend_pid() \
        UNION ALL SELECT transaction FROM pg_prepared_xacts \
            WHERE database = current_database() \
        UNION ALL SELECT xmin FROM pg_replication_slots WHERE xmin IS NOT NULL) h \
    ORDER BY age(x) DESC LIMIT 1";

/// The hot tables, those whose rows turn over fastest: every message is inserted,
/// locked and deleted; an order's state row is updated at each of its steps (its
/// partial indexes keep entries for the states it left), its step rows twice each;
/// outbox rows are leased and marked sent. Each with its vacuum: one that another
/// vacuum (autovacuum, another leader's last one) is working on is skipped rather than
/// waited for.
const VACUUM: [(&str, &str); 4] = [
    ("queue_messages", "VACUUM (SKIP_LOCKED) queue_messages"),
    ("order_state", "VACUUM (SKIP_LOCKED) order_state"),
    ("order_steps", "VACUUM (SKIP_LOCKED) order_steps"),
    ("outbox", "VACUUM (SKIP_LOCKED) outbox"),
];

/// The first part of [`Q_RECEIVE`]: the clock, the candidates, those delivered too
/// often dead-lettered, and the lock of the others, to which it adds what the lock
/// does to `visible_at`; then [`RECEIVE_TAIL`].
const RECEIVE_HEAD: &str = concatcp!(
    "WITH clock AS (SELECT coalesce($2::timestamptz, now()) AS now), \
     candidates AS MATERIALIZED (SELECT ctid AS tid, delivery_count >= $4 AS exhausted \
        FROM queue_messages WHERE queue = $1 AND visible_at <= (SELECT now FROM clock) \
            AND (locked_until IS NULL OR locked_until <= (SELECT now FROM clock)) \
        ORDER BY visible_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED), \
     gone AS (DELETE FROM queue_messages \
        WHERE ctid = ANY(ARRAY(SELECT tid FROM candidates WHERE exhausted)) \
        RETURNING seq, queue, message_id, correlation_id, properties, body, enqueued_at, \
            delivery_count), \
     dead AS (INSERT INTO queue_dead_letters (",
    DEAD_LETTER_COLUMNS,
    ") SELECT seq, queue, message_id, correlation_id, properties, body, enqueued_at, \
            delivery_count, 'MaxDeliveryCountExceeded', \
            'delivered ' || delivery_count || ' times without being completed', \
            (SELECT now FROM clock) FROM gone), \
     taken AS (UPDATE queue_messages SET delivery_count = delivery_count + 1, lock_token = $5, \
        locked_until = (SELECT now FROM clock) + $6 * interval '1 millisecond'"
);

/// The rest of [`Q_RECEIVE`]: which messages the lock is on, and the result.
const RECEIVE_TAIL: &str = concatcp!(
    " WHERE ctid = ANY(ARRAY(SELECT tid FROM candidates WHERE NOT exhausted)) \
        RETURNING ",
    MESSAGE_COLUMNS,
    ") \
     SELECT taken.*, (SELECT now FROM clock) AS now, \
        (SELECT count(*) FROM gone) AS dead_lettered \
     FROM (SELECT 1) AS one LEFT JOIN taken ON true"
);

/// [`Receive::OneStatement`]: the messages a receive finds locked, and those
/// delivered too often dead-lettered, in one statement with no look at the head of the
/// queue first (that read cost a round trip and a walk of the index for each receive
/// that found something). A take of nothing returns one row of the clock and the count
/// alone, joined to nothing.
///
/// The messages it locked are updated (or dead-lettered) by their row's address
/// (`ctid`, read under the lock), a TID scan whatever the indexes' sizes. Found again
/// by `seq`, the server chose between the primary key and `queue_messages_ready` by
/// their sizes, and a plan made on a small queue walked the whole of the latter once
/// per message. (On a small table never vacuumed the server may still read the table
/// whole, until the leader's first vacuum makes every connection plan again.) A
/// message changed by another transaction between this statement's snapshot and its
/// lock is locked in its new version, which this statement cannot see: it is left,
/// unchanged, for the next take.
pub(crate) const Q_RECEIVE: &str = concatcp!(
    RECEIVE_HEAD,
    ", visible_at = (SELECT now FROM clock) + $6 * interval '1 millisecond'",
    RECEIVE_TAIL
);

/// [`Q_RECEIVE`] for a take inside the transaction that acts on what it takes: the
/// lock leaves `visible_at` as it was. Nothing else sees the messages while the
/// transaction holds their rows; those it consumes it deletes, and a message it leaves
/// held is hidden by its `locked_until` until the lock ends (every take skips a message
/// whose lock holds). The lock then changes no indexed column, so the server can write
/// it in place, with no new entries in the queue's indexes for a message deleted before
/// the transaction ends.
pub(crate) const Q_RECEIVE_IN_TX: &str = concatcp!(RECEIVE_HEAD, RECEIVE_TAIL);

/// `$1` relay, `$2` lease end, `$3` now, `$4` limit.
pub(crate) const O_LEASE: &str = "UPDATE outbox SET relay = $1, leased_until = $2, attempts = attempts + 1 \
    WHERE seq = ANY(ARRAY(SELECT seq FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL \
        AND (leased_until IS NULL OR leased_until <= $3) ORDER BY seq LIMIT $4 FOR UPDATE SKIP LOCKED)) \
    RETURNING seq, queue, message_id, correlation_id, properties, body, scheduled_at, attempts";

/// `$1` seqs, `$2` relay, `$3` now, `$4` the reason.
pub(crate) const O_DEAD: &str = "UPDATE outbox SET dead_at = $3, dead_reason = $4, last_error = $4, \
    leased_until = NULL WHERE seq = ANY($1::bigint[]) AND relay = $2";

/// `$1` seqs, `$2` relay, `$3` now.
pub(crate) const O_SENT: &str = "UPDATE outbox SET sent_at = $3, last_error = NULL \
    WHERE seq = ANY($1::bigint[]) AND relay = $2";

/// `$1` seqs, `$2` relay, `$3` the error, `$4` not before.
pub(crate) const O_FAILED: &str = "UPDATE outbox SET last_error = $3, leased_until = $4 \
    WHERE seq = ANY($1::bigint[]) AND relay = $2";

// A send statement ([`Q_SEND`] and its variants) is [`SEND_CLOCK`], the duplicate
// detection ([`DEDUP_FRESH`], or none), [`SEND_INSERT`], the filter on what it inserts
// ([`DEDUP_ONLY_FRESH`], or none), [`SEND_COMPLETED`], the rows of the holds it
// completes ([`COMPLETION`] or [`NO_COMPLETION`]) and [`SEND_RESULT`].

/// The clock of a send: `$6`, or the server's now.
const SEND_CLOCK: &str = "WITH clock AS (SELECT coalesce($6::timestamptz, now()) AS now), ";

/// The insert of a send's messages, up to its filter.
const SEND_INSERT: &str = "inserted AS ( \
        INSERT INTO queue_messages \
            (queue, message_id, correlation_id, properties, body, enqueued_at, visible_at) \
        SELECT $1, m.id, m.correlation, m.properties, m.body, c.now, \
            greatest(coalesce(m.scheduled, c.now), c.now) \
        FROM clock c, \
            unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $7::timestamptz[]) \
            AS m(id, correlation, properties, body, scheduled) ";

/// The end of the insert, and the start of the holds a send completes.
const SEND_COMPLETED: &str = "RETURNING 1), completed AS (";

/// A send's one result: how many it inserted, and the holds it completed.
const SEND_RESULT: &str = ") \
    SELECT s.inserted, completed.seq, completed.lock_token \
    FROM (SELECT c.n AS inserted, (SELECT pg_notify($9, $10) WHERE c.n > 0) IS NULL AS quiet \
        FROM (SELECT count(*) AS n FROM inserted) c) s \
    LEFT JOIN completed ON true";

/// The duplicate detection of [`Q_SEND_DEDUP`]: the ids not seen on queue `$1` within
/// `$8` milliseconds, recorded as seen.
const DEDUP_FRESH: &str = "fresh AS ( \
        INSERT INTO queue_dedup (queue, message_id, expires_at) \
        SELECT $1, id, (SELECT now FROM clock) + $8::bigint * interval '1 millisecond' \
        FROM unnest($2::text[]) AS id \
        ON CONFLICT (queue, message_id) DO UPDATE SET expires_at = excluded.expires_at \
        WHERE queue_dedup.expires_at <= (SELECT now FROM clock) RETURNING message_id), ";

/// What [`Q_SEND_DEDUP`] inserts: the ids [`DEDUP_FRESH`] found fresh.
const DEDUP_ONLY_FRESH: &str = "WHERE m.id IN (SELECT message_id FROM fresh) ";

/// The completion of [`Q_SEND_COMPLETING`]: deletes the messages `$11` (seqs) still
/// held under the lock tokens `$12`, pairwise.
const COMPLETION: &str = "DELETE FROM queue_messages q \
    USING unnest($11::bigint[], $12::text[]) AS h(seq, token) \
    WHERE q.seq = h.seq AND q.lock_token = h.token AND q.locked_until > (SELECT now FROM clock) \
    RETURNING q.seq, q.lock_token";

/// No completion: a send that completes nothing (`$11` and `$12` unused).
const NO_COMPLETION: &str = "SELECT NULL::bigint AS seq, NULL::text AS lock_token WHERE false";

/// A send, in one statement that reads the clock itself (`$6`; NULL: the server's
/// now). Inserts messages into queue `$1` (ids `$2`, correlations `$3`, properties
/// `$4`, bodies `$5`, scheduled for `$7`, NULL: at once; each visible from the later
/// of that and now; [`Q_SEND_DEDUP`]: except those whose id was seen there within the
/// duplicate window of `$8` milliseconds, which this one does not read); if it
/// inserted any, notifies channel `$9` of `$10` (delivered at commit). One row, of how
/// many it inserted (`inserted`) and NULLs.
pub(crate) const Q_SEND: &str = concatcp!(
    SEND_CLOCK,
    SEND_INSERT,
    SEND_COMPLETED,
    NO_COMPLETION,
    SEND_RESULT
);

/// [`Q_SEND`] that also deletes the messages `$11` (seqs) still held under the lock
/// tokens `$12`, pairwise. One row per completed hold (`seq`, `lock_token`), or one of
/// NULLs if none; every row carries how many it inserted. Inside a transaction it is
/// the send with what it consumes, or, with no messages, the completion alone; alone
/// it is a transaction of its own ([`crate::driver::Driver::send_and_complete_alone`]):
/// one round trip where a transaction takes five.
///
/// A send that completes nothing (a client's, a claim's first requests) runs
/// [`Q_SEND`]: with the completion in it, a plan made for the parameters at hand knew
/// the holds were none, looked cheaper than the one plan for any (which expects ten
/// and joins them to the table), and the server planned the client's sends to a queue
/// that detects duplicates again at every call.
pub(crate) const Q_SEND_COMPLETING: &str = concatcp!(
    SEND_CLOCK,
    SEND_INSERT,
    SEND_COMPLETED,
    COMPLETION,
    SEND_RESULT
);

/// [`Q_SEND`] to a queue that detects duplicates: only ids not seen within its window.
/// Two statements, not one that tests `$8` for NULL: with the test in it, a plan made
/// for the parameters at hand (which leaves out the branch not taken) always looked
/// cheaper than the one plan for any, so the server planned the statement again at
/// most executions (a third of the calls under paced load, a tenth of the server's
/// time in the queue's statements).
pub(crate) const Q_SEND_DEDUP: &str = concatcp!(
    SEND_CLOCK,
    DEDUP_FRESH,
    SEND_INSERT,
    DEDUP_ONLY_FRESH,
    SEND_COMPLETED,
    NO_COMPLETION,
    SEND_RESULT
);

/// [`Q_SEND_DEDUP`] with the completion of [`Q_SEND_COMPLETING`].
pub(crate) const Q_SEND_DEDUP_COMPLETING: &str = concatcp!(
    SEND_CLOCK,
    DEDUP_FRESH,
    SEND_INSERT,
    DEDUP_ONLY_FRESH,
    SEND_COMPLETED,
    COMPLETION,
    SEND_RESULT
);

/// The details of order `$1` (as text).
pub(crate) const SELECT_DETAILS: &str = "SELECT details::text FROM orders WHERE order_id = $1";

/// The injected now (`$1`) or the server's.
pub(crate) const NOW: &str = "SELECT coalesce($1::timestamptz, now()) AS now";

// The hot statements below select their rows with `= ANY(ARRAY(...))` (or an
// id array) so every row of a batch is one primary-key probe: joined as a CTE
// instead, the planner hash-joins the batch against a scan of the whole table.
//
// What a batch says per order (a fence, a step to move to) is one JSON object keyed by
// order id ([`batch_of`]) that each row looks itself up in, not an `unnest` of arrays
// joined to the rows: the planner, expecting one row from the id list and a deadline
// it has no statistics for (all NULL when last analyzed), nested the whole array under
// each row it found, and a completion of 500 orders took 60 ms instead of 14.
//
// Nor do they name the state the partial indexes are on (`process_state =
// 'Pending'` or `'Processing'`), where something else already proves it: the fence
// `locked_by = owner` (a locked row is Processing: `order_state_locked_iff_processing`),
// or the claim's own locking select (`FOR UPDATE` re-checks its filter on the row it
// locks). Named, it lets the planner combine the primary key with a whole scan of
// `order_state_deadlines` or `order_state_claimable`, whose entries for rows that
// have moved on stay until a vacuum: on a busy or new table (no statistics yet) a
// record of 23 steps read 17,284 index entries and 485 heap pages instead of 23 rows.

/// `$1` injected now or NULL, `$2` limit, `$3` owner, `$4` timeout in microseconds,
/// `$5` the default workflow's name, `$6` JSON object of the workflows it starts
/// (name to version), `$7` the `name@version`s it carries on. A new order is
/// pinned here. `$8` the history kind. Each row says the clock's now (`at`).
pub(crate) const CLAIM: &str = "WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now), \
    claimed AS ( \
        UPDATE order_state s SET process_state = 'Processing', locked_by = $3, \
            complete_by = clock.now + $4::bigint * interval '1 microsecond', \
            lock_epoch = s.lock_epoch + 1, updated_at = clock.now, \
            workflow = coalesce(s.workflow, $5), \
            workflow_version = coalesce(s.workflow_version, $6::text::jsonb ->> coalesce(s.workflow, $5)) \
        FROM clock \
        WHERE s.order_id = ANY(ARRAY( \
                SELECT c.order_id FROM order_state c \
                WHERE c.process_state = 'Pending' AND c.locked_by IS NULL \
                    AND c.next_attempt_at <= (SELECT now FROM clock) \
                    AND CASE WHEN c.workflow_version IS NULL \
                        THEN ($6::text::jsonb ->> coalesce(c.workflow, $5)) IS NOT NULL \
                        ELSE (c.workflow || '@' || c.workflow_version) = ANY($7::text[]) END \
                ORDER BY c.next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED)) \
        RETURNING s.order_id, s.lock_epoch, s.complete_by, s.current_step, s.failure_count, \
            s.reply_to, s.finish_as, s.generation, s.last_error, s.workflow, s.workflow_version, \
            s.waiting_on, clock.now AS at), \
    history AS ( \
        INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch) \
        SELECT order_id, at, $3, $8, 'Pending', 'Processing', lock_epoch FROM claimed) \
    SELECT c.order_id, c.lock_epoch, c.complete_by, c.current_step, c.failure_count, c.reply_to, \
        c.finish_as, c.generation, c.last_error, c.workflow, c.workflow_version, c.waiting_on, \
        (SELECT o.details::text FROM orders o WHERE o.order_id = c.order_id) AS details, c.at \
    FROM claimed c";

/// `$1` injected now or NULL, `$2` order ids, `$3` the batch ([`batch_of`]): per
/// order id `owner` and `epoch`, `$4` the history kind.
pub(crate) const COMPLETE: &str = "WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now, \
        $3::jsonb AS batch), \
    done AS ( \
        UPDATE order_state s SET process_state = 'Processed', locked_by = NULL, complete_by = NULL, \
            updated_at = clock.now \
        FROM clock \
        WHERE s.order_id = ANY($2::text[]) \
            AND s.locked_by = clock.batch -> s.order_id ->> 'owner' \
            AND s.lock_epoch = (clock.batch -> s.order_id ->> 'epoch')::bigint \
            AND s.complete_by > clock.now \
        RETURNING s.order_id, s.lock_epoch, clock.batch -> s.order_id ->> 'owner' AS owner, \
            clock.now AS at), \
    history AS ( \
        INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch) \
        SELECT order_id, at, owner, $4, 'Processing', 'Processed', lock_epoch FROM done) \
    SELECT order_id FROM done";

/// The CTEs of [`WRITE_STEPS`] and [`WRITE_STEPS_SENDING`] (`touched`, `written`,
/// `records`, `history`), which each follows with its own.
const WRITE_STEPS_CTES: &str = "WITH b AS (SELECT $3::jsonb AS batch), \
    touched AS ( \
        UPDATE order_state s SET \
            current_step = greatest(s.current_step, (b.batch -> s.order_id ->> 'step')::int), \
            last_error = CASE WHEN (b.batch -> s.order_id ->> 'failed')::bool \
                THEN b.batch -> s.order_id ->> 'error' ELSE s.last_error END, \
            waiting_on = CASE WHEN (b.batch -> s.order_id ->> 'step')::int > s.current_step \
                THEN NULL ELSE s.waiting_on END, \
            process_state = CASE WHEN (b.batch -> s.order_id ->> 'complete')::bool \
                THEN 'Processed' ELSE s.process_state END, \
            locked_by = CASE WHEN (b.batch -> s.order_id ->> 'complete')::bool \
                THEN NULL ELSE s.locked_by END, \
            complete_by = CASE WHEN (b.batch -> s.order_id ->> 'complete')::bool \
                THEN NULL ELSE s.complete_by END, \
            updated_at = $1 \
        FROM b \
        WHERE s.order_id = ANY($2::text[]) \
            AND s.locked_by = b.batch -> s.order_id ->> 'owner' \
            AND s.lock_epoch = (b.batch -> s.order_id ->> 'epoch')::bigint \
            AND s.complete_by > $1 \
            AND ((b.batch -> s.order_id ->> 'expect')::int < 0 \
                OR s.current_step = (b.batch -> s.order_id ->> 'expect')::int) \
        RETURNING s.order_id, b.batch -> s.order_id ->> 'owner' AS owner, \
            s.lock_epoch AS epoch, b.batch -> s.order_id -> 'steps' AS steps, \
            s.process_state = 'Processed' AS completed), \
    written AS ( \
        SELECT t.order_id, t.owner, t.epoch, u.n, (u.step ->> 'index')::int AS idx, \
            u.step ->> 'name' AS name, u.step ->> 'status' AS status, \
            u.step ->> 'key' AS key, u.step ->> 'detail' AS detail, u.step ->> 'kind' AS kind, \
            (u.step ->> 'irreversible')::boolean AS irreversible, \
            (u.step ->> 'attempts')::int AS attempts \
        FROM touched t, jsonb_array_elements(t.steps) WITH ORDINALITY AS u(step, n)), \
    records AS ( \
        INSERT INTO order_steps \
            (order_id, step_index, name, status, idempotency_key, attempts, detail, epoch, updated_at, \
             irreversible) \
        SELECT order_id, idx, name, status, key, attempts, detail, epoch, $1, irreversible \
        FROM written \
        ON CONFLICT (order_id, step_index) DO UPDATE SET \
            name = excluded.name, status = excluded.status, \
            attempts = order_steps.attempts + excluded.attempts, detail = excluded.detail, \
            epoch = excluded.epoch, updated_at = excluded.updated_at, \
            irreversible = excluded.irreversible), \
    history AS ( \
        INSERT INTO order_history \
            (order_id, at, actor, kind, from_state, to_state, epoch, step, reason) \
        SELECT order_id, $1, owner, kind, 'Processing', to_state, epoch, idx, detail \
        FROM (SELECT order_id, n, owner, kind, 'Processing' AS to_state, epoch, idx, detail \
                FROM written \
            UNION ALL \
            SELECT order_id, NULL, owner, $4, 'Processed', epoch, NULL, NULL \
                FROM touched WHERE completed) AS entries \
        ORDER BY order_id, n NULLS LAST)";

/// The fenced, step-guarded touch of many step writes at once and, for the orders it
/// touched, their step records and history entries: `$1` now, `$2` order ids, `$3` the
/// batch ([`batch_of`]): per order id `owner`, `epoch`, `expect` (the step it
/// expects, -1: any), `step` (the step to move to, -1: none), `failed`, `error`,
/// `complete` (the order completes with it: Processed, its lock released, a `$4`
/// history entry after its steps') and `steps`, its updates in order (`index`,
/// `name`, `status`, `key`, `detail`, `kind` of history, `irreversible`, `attempts`:
/// what the record adds to the step's attempts). Each order's records come
/// from its own touched row (no join), its history entries in the order of its
/// updates. The completion is the touch itself: one new version of the state row,
/// not two, and no statement of its own. Returns the orders touched.
pub(crate) const WRITE_STEPS: &str = concatcp!(WRITE_STEPS_CTES, " SELECT order_id FROM touched");

/// The CTEs that send what the orders of `applied` (a relation of `order_id`s: those
/// a statement wrote) cause and end the deliveries that asked for them, for a
/// statement that writes first and reads its clock from `$1`: `sent` inserts the
/// messages of those orders (to queues that detect no duplicates: no window is read)
/// in the order given, each visible from the later of its scheduled time (NULL: at
/// once) and `$1`; `notified` tells other processes, at commit, of each queue that got
/// any; `completed` deletes those orders' holds still held under their lock token and
/// not expired at `$1`, returning `seq` and `lock_token`. The sends and holds are the
/// one row of `sending`, which names the parameters of the statement it is part of
/// ([`SENDING_WRITE_STEPS`], [`SENDING_INSERT_ORDERS`]): the messages' order ids
/// (`orders`), `queues`, `ids`, `correlations`, `properties`, `bodies` and `scheduled`
/// times; the `channel` and the `origin` of the notifications
/// ([`crate::wakeups::Wakeups::notice`]); the holds' order ids (`hold_orders`),
/// `seqs` and lock `tokens`. A statement reads `notified` in its result, or nothing is
/// notified.
const SENDS: &str = ", sent AS ( \
        INSERT INTO queue_messages \
            (queue, message_id, correlation_id, properties, body, enqueued_at, visible_at) \
        SELECT m.queue, m.id, m.correlation, m.properties, m.body, $1, \
            greatest(coalesce(m.scheduled, $1), $1) \
        FROM sending p, unnest(p.orders, p.queues, p.ids, p.correlations, p.properties, \
                p.bodies, p.scheduled) WITH ORDINALITY \
            AS m(order_id, queue, id, correlation, properties, body, scheduled, n) \
        WHERE m.order_id IN (SELECT order_id FROM applied) \
        ORDER BY m.n \
        RETURNING queue), \
    notified AS ( \
        SELECT pg_notify(p.channel, s.queue || ' ' || p.origin) \
        FROM sending p, (SELECT DISTINCT queue FROM sent) s), \
    completed AS ( \
        DELETE FROM queue_messages q \
        USING sending p, unnest(p.hold_orders, p.seqs, p.tokens) AS h(order_id, seq, token) \
        WHERE h.order_id IN (SELECT order_id FROM applied) \
            AND q.seq = h.seq AND q.lock_token = h.token AND q.locked_until > $1 \
        RETURNING q.seq, q.lock_token)";

/// The `sending` of [`WRITE_STEPS_SENDING`]: its parameters `$5..$16` ([`SENDS`]), and
/// the orders it touched as `applied`.
const SENDING_WRITE_STEPS: &str = ", sending AS (SELECT $5::text[] AS orders, \
        $6::text[] AS queues, $7::text[] AS ids, $8::text[] AS correlations, \
        $9::text[] AS properties, $10::bytea[] AS bodies, $11::timestamptz[] AS scheduled, \
        $12::text AS channel, $13::text AS origin, $14::text[] AS hold_orders, \
        $15::bigint[] AS seqs, $16::text[] AS tokens), \
    applied AS (SELECT order_id FROM touched)";

/// [`WRITE_STEPS`] that also sends what the writes of the orders it touched cause and
/// ends the deliveries that asked for them ([`SENDS`], `$5..$16`), all in the one
/// statement: for a scheduler, the step write, the next requests and the reply's
/// completion are one round trip, not one per queue and one more for the write. Only
/// an order touched sends or consumes: a refused write leaves both to its caller.
/// Returns one row per order touched (`order_id`) and one per hold completed (`seq`,
/// `lock_token`).
pub(crate) const WRITE_STEPS_SENDING: &str = concatcp!(
    WRITE_STEPS_CTES,
    SENDING_WRITE_STEPS,
    SENDS,
    " SELECT t.order_id, NULL::bigint AS seq, NULL::text AS lock_token, \
        (SELECT count(*) FROM notified) AS notified \
    FROM touched t \
    UNION ALL \
    SELECT NULL, c.seq, c.lock_token, NULL FROM completed c"
);

/// What a sweep reads of an overdue order ([`orderly_core::store::Expired`]), from
/// `order_state s`: its fence and deadline, the steps in force, and the service it waits
/// on if that is down.
const EXPIRED_SELECT: &str = "SELECT s.order_id, s.locked_by, s.lock_epoch, \
        s.complete_by, s.failure_count, s.current_step, s.finish_as, \
        (SELECT string_agg(t.name, E'\\n' ORDER BY t.step_index) FROM order_steps t \
            WHERE t.order_id = s.order_id AND t.status IN ('Started', 'Succeeded')) AS in_force, \
        (SELECT h.service FROM service_health h WHERE h.service = s.waiting_on \
            AND h.state IN ('Down', 'Probing')) AS waiting_for \
    FROM order_state s WHERE s.process_state = 'Processing' ";

/// Overdue orders, most overdue first, for reading (nothing locked): `$1` injected now
/// or NULL, `$2` limit.
/// See [`crate::driver::Statements::next_claimable`] (the claimable index,
/// `order_state_claimable`, gives the minimum).
pub(crate) const NEXT_CLAIMABLE: &str = "SELECT min(next_attempt_at) AS due, \
    coalesce($1::timestamptz, now()) AS now FROM order_state \
    WHERE process_state = 'Pending' AND locked_by IS NULL";

/// See [`crate::driver::Statements::sweep_due`]: the predicate of [`LOCK_EXPIRED`].
pub(crate) const SWEEP_DUE: &str = "SELECT EXISTS (SELECT 1 FROM order_state s \
        WHERE s.process_state = 'Processing' \
        AND s.complete_by < coalesce($1::timestamptz, now())) AS expired, \
    EXISTS (SELECT 1 FROM alerts a WHERE a.published_at IS NULL) AS alerts, \
    EXISTS (SELECT 1 FROM service_health h WHERE h.outage > h.alerted \
        OR (h.state = 'Up' AND h.outage > h.resolved)) AS outages";

/// See [`crate::driver::Statements::next_visible`] (`queue_messages_ready` gives the
/// minimum).
pub(crate) const NEXT_VISIBLE: &str = "SELECT min(visible_at) AS due, \
    coalesce($2::timestamptz, now()) AS now FROM queue_messages WHERE queue = $1";

pub(crate) const FIND_EXPIRED: &str = concatcp!(
    EXPIRED_SELECT,
    "AND s.complete_by < coalesce($1::timestamptz, now()) ORDER BY s.complete_by LIMIT $2"
);

/// The expired orders of a sweep, locked (others' sweeps skip them): `$1` now,
/// `$2` limit. What happens to each is decided in Rust (`RecoveryPolicy::decide`).
pub(crate) const LOCK_EXPIRED: &str = concatcp!(
    EXPIRED_SELECT,
    "AND s.complete_by < $1 ORDER BY s.complete_by LIMIT $2 FOR UPDATE OF s SKIP LOCKED"
);

/// The decided recoveries, set-based: `$1` now, `$2` actor, `$3` order ids, `$4` the
/// batch ([`batch_of`]): per order id `epoch`, `failures` (the new count), `state`,
/// `finish_as`, `next_at` (the next attempt, NULL: unchanged), `reason` and `kind` (of
/// history).
pub(crate) const RECOVER: &str = "WITH b AS (SELECT $4::jsonb AS batch), \
    recovered AS ( \
        UPDATE order_state s SET \
            failure_count = (b.batch -> s.order_id ->> 'failures')::int, \
            process_state = b.batch -> s.order_id ->> 'state', \
            finish_as = b.batch -> s.order_id ->> 'finish_as', \
            next_attempt_at = coalesce((b.batch -> s.order_id ->> 'next_at')::timestamptz, \
                s.next_attempt_at), \
            last_error = b.batch -> s.order_id ->> 'reason', \
            locked_by = NULL, complete_by = NULL, updated_at = $1 \
        FROM b \
        WHERE s.order_id = ANY($3::text[]) AND s.process_state = 'Processing' \
            AND s.lock_epoch = (b.batch -> s.order_id ->> 'epoch')::bigint \
            AND s.complete_by < $1 \
        RETURNING s.order_id, s.process_state AS state, s.last_error AS reason, \
            b.batch -> s.order_id ->> 'kind' AS kind, s.lock_epoch), \
    history AS ( \
        INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch, reason) \
        SELECT order_id, $1, $2, kind, 'Processing', state, lock_epoch, reason FROM recovered) \
    SELECT order_id FROM recovered";

/// The CTEs of [`INSERT_ORDERS`] and [`INSERT_ORDERS_SENDING`] (`u`, `o`, `s`, `h`),
/// which each follows with its own.
const INSERT_ORDERS_CTES: &str = "WITH u AS ( \
        SELECT id, details, reply_to, workflow, n \
        FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY \
            AS x(id, details, reply_to, workflow, n)), \
    o AS (INSERT INTO orders (order_id, details, created_at) \
        SELECT id, details::json, $1 FROM u ORDER BY n \
        ON CONFLICT (order_id) DO NOTHING RETURNING order_id), \
    s AS (INSERT INTO order_state \
        (order_id, process_state, next_attempt_at, reply_to, workflow, created_at, updated_at) \
        SELECT u.id, 'Pending', $1, u.reply_to, u.workflow, $1, $1 \
        FROM u JOIN o ON o.order_id = u.id), \
    h AS (INSERT INTO order_history (order_id, at, actor, kind, from_state, to_state, epoch) \
        SELECT u.id, $1, $6, $7, NULL, 'Pending', 0 FROM u JOIN o ON o.order_id = u.id ORDER BY u.n)";

/// The `sending` of [`INSERT_ORDERS_SENDING`]: its parameters `$8..$19` ([`SENDS`]),
/// and the orders it inserted as `applied`.
const SENDING_INSERT_ORDERS: &str = ", sending AS (SELECT $8::text[] AS orders, \
        $9::text[] AS queues, $10::text[] AS ids, $11::text[] AS correlations, \
        $12::text[] AS properties, $13::bytea[] AS bodies, $14::timestamptz[] AS scheduled, \
        $15::text AS channel, $16::text AS origin, $17::text[] AS hold_orders, \
        $18::bigint[] AS seqs, $19::text[] AS tokens), \
    applied AS (SELECT order_id FROM o)";

/// Many new orders at `$1`: `$2` ids, `$3` details, `$4` reply queues, `$5` workflows,
/// in batch order, each id once (the shared code keeps an id's first row); each new id
/// gets its details, its Pending state row and a Submitted history entry by `$6` (`$7`
/// the kind). Returns the ids inserted.
pub(crate) const INSERT_ORDERS: &str = concatcp!(INSERT_ORDERS_CTES, " SELECT order_id FROM o");

/// [`INSERT_ORDERS`] that also sends what the orders it inserted cause and ends the
/// deliveries that carried them ([`SENDS`], `$8..$19`), and, if it inserted any,
/// tells other processes at commit that orders can be claimed (channel `$15`, `$20`
/// and the origin `$16`): a submitter's batch is one statement, not three. Returns one
/// row per order inserted (`order_id`) and one per hold completed (`seq`,
/// `lock_token`).
pub(crate) const INSERT_ORDERS_SENDING: &str = concatcp!(
    INSERT_ORDERS_CTES,
    SENDING_INSERT_ORDERS,
    SENDS,
    ", claimable AS (SELECT pg_notify(p.channel, $20 || ' ' || p.origin) FROM sending p \
        WHERE EXISTS (SELECT 1 FROM o)) \
    SELECT o.order_id, NULL::bigint AS seq, NULL::text AS lock_token, \
        (SELECT count(*) FROM notified) + (SELECT count(*) FROM claimable) AS notified \
    FROM o \
    UNION ALL \
    SELECT NULL, c.seq, c.lock_token, NULL FROM completed c"
);
