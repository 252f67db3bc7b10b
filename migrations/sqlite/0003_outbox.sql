-- Transactional outbox, SQLite dialect: messages a state change causes, written in its
-- transaction when the transport is external (Azure Service Bus), then published by a
-- relay. A relay leases a batch (relay, leased_until), publishes it, and marks it
-- sent; a lease that runs out lets another relay take the batch over.

CREATE TABLE outbox (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT    NOT NULL,
    message_id     TEXT    NOT NULL,
    correlation_id TEXT,
    properties     TEXT    NOT NULL,
    body           BLOB    NOT NULL,
    scheduled_at   TEXT,
    created_at     TEXT    NOT NULL,
    relay          TEXT,
    leased_until   TEXT,
    attempts       INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT,
    sent_at        TEXT
);

CREATE INDEX outbox_unsent ON outbox (seq) WHERE sent_at IS NULL;
