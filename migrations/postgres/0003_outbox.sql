-- Transactional outbox, PostgreSQL dialect: messages a state change causes, written in
-- its transaction when the transport is external (Azure Service Bus), then published
-- by a relay. A relay leases a batch (relay, leased_until), publishes it, and marks it
-- sent; a lease that runs out lets another relay take the batch over.

CREATE TABLE outbox (
    seq            BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue          TEXT        NOT NULL,
    message_id     TEXT        NOT NULL,
    correlation_id TEXT,
    properties     TEXT        NOT NULL,
    body           BYTEA       NOT NULL,
    scheduled_at   TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL,
    relay          TEXT,
    leased_until   TIMESTAMPTZ,
    attempts       INTEGER     NOT NULL DEFAULT 0,
    last_error     TEXT,
    sent_at        TIMESTAMPTZ
);

CREATE INDEX outbox_unsent ON outbox (seq) WHERE sent_at IS NULL;
