-- What the worker roles need next to the state row: how an order that is being undone
-- will end, and the operator alerts every Error raises.

-- NULL while an order runs forward. 'Error' or 'Cancelled' while its completed steps are
-- being compensated (after a permanent failure, or an operator's cancel): the owner
-- undoes them in reverse order, then moves the order to that state.
ALTER TABLE order_state ADD COLUMN finish_as TEXT
    CONSTRAINT order_state_known_finish CHECK (finish_as IN ('Error', 'Cancelled'));

-- One alert per Error episode of an order, raised by the same transaction that moves
-- the order to Error (whoever does it: a scheduler, a supervisor, an operator tool),
-- so no path to Error can forget it.
CREATE TABLE alerts (
    alert_id        BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id        TEXT        NOT NULL,
    raised_at       TIMESTAMPTZ NOT NULL,
    step_index      INTEGER     NOT NULL,
    last_error      TEXT,
    failure_count   INTEGER     NOT NULL,
    reply_to        TEXT,
    -- When the alert message went to the alerts queue (NULL: not yet).
    published_at    TIMESTAMPTZ,
    acknowledged_at TIMESTAMPTZ,
    acknowledged_by TEXT
);

CREATE INDEX alerts_unpublished ON alerts (alert_id) WHERE published_at IS NULL;
CREATE INDEX alerts_by_order ON alerts (order_id, alert_id);

CREATE FUNCTION order_state_raise_alert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alerts (order_id, raised_at, step_index, last_error, failure_count, reply_to)
    VALUES (NEW.order_id, NEW.updated_at, NEW.current_step, NEW.last_error,
            NEW.failure_count, NEW.reply_to);
    RETURN NULL;
END
$$;

CREATE TRIGGER order_state_raises_alert AFTER UPDATE OF process_state ON order_state
    FOR EACH ROW WHEN (NEW.process_state = 'Error' AND OLD.process_state <> 'Error')
    EXECUTE FUNCTION order_state_raise_alert();
