-- The embedded SQL queue (peek-lock), PostgreSQL dialect.

CREATE TABLE queues (
    name               TEXT        PRIMARY KEY,
    lock_duration_ms   BIGINT      NOT NULL,
    max_delivery_count INTEGER     NOT NULL,
    dedup_window_ms    BIGINT      NOT NULL,
    created_at         TIMESTAMPTZ NOT NULL
);

-- A message is visible to receivers from visible_at: its scheduled time, the end of
-- its lock while locked, or the moment it was abandoned.
CREATE TABLE queue_messages (
    seq            BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue          TEXT        NOT NULL,
    message_id     TEXT        NOT NULL,
    correlation_id TEXT,
    properties     TEXT        NOT NULL,
    body           BYTEA       NOT NULL,
    enqueued_at    TIMESTAMPTZ NOT NULL,
    visible_at     TIMESTAMPTZ NOT NULL,
    delivery_count INTEGER     NOT NULL DEFAULT 0,
    lock_token     TEXT,
    locked_until   TIMESTAMPTZ
);

CREATE INDEX queue_messages_ready ON queue_messages (queue, visible_at, seq);

-- Message ids seen recently, for duplicate detection.
CREATE TABLE queue_dedup (
    queue      TEXT        NOT NULL,
    message_id TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (queue, message_id)
);

CREATE INDEX queue_dedup_expiry ON queue_dedup (expires_at);

CREATE TABLE queue_dead_letters (
    seq              BIGINT      PRIMARY KEY,
    queue            TEXT        NOT NULL,
    message_id       TEXT        NOT NULL,
    correlation_id   TEXT,
    properties       TEXT        NOT NULL,
    body             BYTEA       NOT NULL,
    enqueued_at      TIMESTAMPTZ NOT NULL,
    delivery_count   INTEGER     NOT NULL,
    reason           TEXT        NOT NULL,
    description      TEXT        NOT NULL,
    dead_lettered_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX queue_dead_letters_by_queue ON queue_dead_letters (queue, dead_lettered_at, seq);
