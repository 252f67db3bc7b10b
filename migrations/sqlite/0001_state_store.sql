-- orderly state store, SQLite dialect.
-- The user's contract: order_id, locked_by, complete_by, process_state, failure_count.
-- Times are UTC text in one fixed format (2026-11-22T07:35:03.123456Z), so that text
-- order is time order and operators can read them.

CREATE TABLE orders (
    order_id    TEXT PRIMARY KEY NOT NULL,
    details     TEXT NOT NULL CHECK (json_valid(details)),
    created_at  TEXT NOT NULL
);

CREATE TABLE order_state (
    order_id        TEXT    PRIMARY KEY NOT NULL REFERENCES orders (order_id),
    locked_by       TEXT,
    complete_by     TEXT,
    process_state   TEXT    NOT NULL,
    failure_count   INTEGER NOT NULL DEFAULT 0,
    lock_epoch      INTEGER NOT NULL DEFAULT 0,
    current_step    INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT    NOT NULL,
    last_error      TEXT,
    reply_to        TEXT,
    created_at      TEXT    NOT NULL,
    updated_at      TEXT    NOT NULL,
    CONSTRAINT order_state_known_state
        CHECK (process_state IN ('Pending', 'Processing', 'Processed', 'Error', 'Cancelled')),
    CONSTRAINT order_state_failure_count_not_negative CHECK (failure_count >= 0),
    -- An order is locked, with a deadline, exactly while it is Processing.
    CONSTRAINT order_state_locked_iff_processing
        CHECK ((process_state = 'Processing') = (locked_by IS NOT NULL AND complete_by IS NOT NULL))
);

-- Claim: only Pending rows are indexed, so finished rows cost nothing.
CREATE INDEX order_state_claimable ON order_state (next_attempt_at) WHERE process_state = 'Pending';
-- Sweep: only Processing rows, by deadline.
CREATE INDEX order_state_deadlines ON order_state (complete_by) WHERE process_state = 'Processing';
-- Triage: Error orders oldest first (small: only Error rows), and all orders oldest first.
-- Every transition rewrites index entries (no HOT update can apply), so each index
-- here is paid on every write: keep them few and partial where possible.
CREATE INDEX order_state_errors ON order_state (created_at, order_id) WHERE process_state = 'Error';
CREATE INDEX order_state_by_age ON order_state (created_at, order_id);

-- Steps and history are written only in the transaction that changes the order's state
-- row, whose foreign key already proves the order exists; a second check per row would
-- only cost time on the hot path.
CREATE TABLE order_steps (
    order_id        TEXT    NOT NULL,
    step_index      INTEGER NOT NULL,
    name            TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    detail          TEXT,
    epoch           INTEGER NOT NULL,
    updated_at      TEXT    NOT NULL,
    PRIMARY KEY (order_id, step_index),
    CONSTRAINT order_steps_known_status
        CHECK (status IN ('Started', 'Succeeded', 'Failed', 'Compensated'))
);

CREATE TABLE order_history (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id   TEXT    NOT NULL,
    at         TEXT    NOT NULL,
    actor      TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    from_state TEXT,
    to_state   TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    step       INTEGER,
    reason     TEXT
);

CREATE INDEX order_history_by_order ON order_history (order_id, seq);

-- The history is append-only: what happened stays as it was written.
CREATE TRIGGER order_history_no_update BEFORE UPDATE ON order_history
BEGIN
    SELECT RAISE(ABORT, 'order_history is append-only');
END;

CREATE TRIGGER order_history_no_delete BEFORE DELETE ON order_history
BEGIN
    SELECT RAISE(ABORT, 'order_history is append-only');
END;
