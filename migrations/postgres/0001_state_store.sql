-- orderly state store, PostgreSQL dialect.
-- The user's contract: order_id, locked_by, complete_by, process_state, failure_count.

CREATE TABLE orders (
    order_id    TEXT        PRIMARY KEY,
    details     JSON        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL
);

CREATE TABLE order_state (
    order_id        TEXT        PRIMARY KEY REFERENCES orders (order_id),
    locked_by       TEXT,
    complete_by     TIMESTAMPTZ,
    process_state   TEXT        NOT NULL,
    failure_count   INTEGER     NOT NULL DEFAULT 0,
    lock_epoch      BIGINT      NOT NULL DEFAULT 0,
    current_step    INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    last_error      TEXT,
    reply_to        TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
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
    order_id        TEXT        NOT NULL,
    step_index      INTEGER     NOT NULL,
    name            TEXT        NOT NULL,
    status          TEXT        NOT NULL,
    idempotency_key TEXT        NOT NULL,
    attempts        INTEGER     NOT NULL DEFAULT 0,
    detail          TEXT,
    epoch           BIGINT      NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (order_id, step_index),
    CONSTRAINT order_steps_known_status
        CHECK (status IN ('Started', 'Succeeded', 'Failed', 'Compensated'))
);

CREATE TABLE order_history (
    seq        BIGINT      GENERATED ALWAYS AS IDENTITY,
    order_id   TEXT        NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    actor      TEXT        NOT NULL,
    kind       TEXT        NOT NULL,
    from_state TEXT,
    to_state   TEXT        NOT NULL,
    epoch      BIGINT      NOT NULL,
    step       INTEGER,
    reason     TEXT,
    -- One index serves both reading an order's timeline and uniqueness.
    PRIMARY KEY (order_id, seq)
);

-- The history is append-only: what happened stays as it was written.
CREATE FUNCTION order_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'order_history is append-only';
END
$$;

CREATE TRIGGER order_history_no_update BEFORE UPDATE OR DELETE ON order_history
    FOR EACH ROW EXECUTE FUNCTION order_history_append_only();
