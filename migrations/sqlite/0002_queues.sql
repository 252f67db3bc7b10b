-- The embedded SQL queue (peek-lock), SQLite dialect. Times as in 0001: fixed-format
-- UTC text.

CREATE TABLE queues (
    name               TEXT    PRIMARY KEY NOT NULL,
    lock_duration_ms   INTEGER NOT NULL,
    max_delivery_count INTEGER NOT NULL,
    dedup_window_ms    INTEGER NOT NULL,
    created_at         TEXT    NOT NULL
);

-- A message is visible to receivers from visible_at: its scheduled time, the end of
-- its lock while locked, or the moment it was abandoned.
CREATE TABLE queue_messages (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    correlation_id TEXT,
    properties     TEXT    NOT NULL,
    body           BLOB    NOT NULL,
    enqueued_at    TEXT    NOT NULL,
    visible_at     TEXT    NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    lock_token     TEXT,
    locked_until   TEXT
);

CREATE INDEX queue_messages_ready ON queue_messages (queue, visible_at, seq);

-- Message ids seen recently, for duplicate detection.
CREATE TABLE queue_dedup (
    queue      TEXT NOT NULL,
    message_id TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    PRIMARY KEY (queue, message_id)
);

CREATE INDEX queue_dedup_expiry ON queue_dedup (expires_at);

CREATE TABLE queue_dead_letters (
    seq              INTEGER PRIMARY KEY NOT NULL,
    queue            TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    correlation_id   TEXT,
    properties       TEXT    NOT NULL,
    body             BLOB    NOT NULL,
    enqueued_at      TEXT    NOT NULL,
    delivery_count   INTEGER NOT NULL,
    reason           TEXT    NOT NULL,
    description      TEXT    NOT NULL,
    dead_lettered_at TEXT    NOT NULL
);

CREATE INDEX queue_dead_letters_by_queue ON queue_dead_letters (queue, dead_lettered_at, seq);
