-- What the operators' console and the system alerts read.

-- Finished orders by when they finished (only finished rows are indexed): the charts of
-- the last hour and retention read it instead of scanning every order.
CREATE INDEX order_state_finished ON order_state (updated_at)
    WHERE process_state IN ('Processed', 'Error', 'Cancelled');

-- Recoveries by time (only those entries are indexed).
CREATE INDEX order_history_recoveries ON order_history (at)
    WHERE kind IN ('Recovered', 'GaveUp');

-- Alerts about the system rather than one order (the oldest Pending order waiting too
-- long, dead letters growing, no supervisor leading, a service down): one row per
-- episode, raised once when its condition begins and resolved once when it ends.
CREATE TABLE system_alerts (
    alert_id    BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        TEXT        NOT NULL,
    subject     TEXT        NOT NULL,
    detail      TEXT        NOT NULL,
    raised_at   TIMESTAMPTZ NOT NULL,
    raised_by   TEXT        NOT NULL,
    resolved_at TIMESTAMPTZ
);
-- At most one open episode per condition and subject.
CREATE UNIQUE INDEX system_alerts_open ON system_alerts (kind, subject) WHERE resolved_at IS NULL;

-- The instances of a role that run (today the supervisors, leading or not), as last
-- seen: tells "no supervisor is running" from "a leader was lost".
CREATE TABLE role_presence (
    role     TEXT        NOT NULL,
    instance TEXT        NOT NULL,
    is_leader BOOLEAN    NOT NULL,
    seen_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (role, instance)
);
