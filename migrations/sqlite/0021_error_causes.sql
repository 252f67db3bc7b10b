-- The console at a million orders: Error orders are grouped by cause through an index,
-- not by reading every Error order into orderly.

-- An Error order's cause: its last error with the ids and numbers stripped
-- (`orderly_core::triage::error_pattern`, computed by orderly, not by SQL), with the
-- step it failed at and when it entered Error, copied from the row when the cause was
-- computed. Filled by whoever reads the causes (the console) for the Error rows without
-- one. Copies, so that the indexes below hold no column the hot path writes
-- (`current_step`, `updated_at`): an index on one would stop PostgreSQL from updating
-- rows in place (HOT) on every step.
ALTER TABLE order_state ADD COLUMN error_cause TEXT;
ALTER TABLE order_state ADD COLUMN error_cause_step INTEGER;
ALTER TABLE order_state ADD COLUMN error_cause_at TEXT;

-- The causes, each one's count, first and last seen read from the index alone.
CREATE INDEX order_state_error_causes
    ON order_state (workflow, workflow_version, error_cause_step, error_cause, created_at,
                    error_cause_at, order_id)
    WHERE process_state = 'Error' AND error_cause IS NOT NULL;

-- The Error rows whose cause is still to be computed (few: those since the last reading).
CREATE INDEX order_state_causes_unknown ON order_state (order_id)
    WHERE process_state = 'Error' AND error_cause IS NULL;

-- Leaving Error, a row's cause goes (whichever version of orderly moves it): in Error
-- again, its new cause is computed anew.
CREATE TRIGGER order_state_forgets_cause AFTER UPDATE OF process_state ON order_state
WHEN OLD.process_state = 'Error' AND NEW.process_state <> 'Error' AND OLD.error_cause IS NOT NULL
BEGIN
    UPDATE order_state SET error_cause = NULL, error_cause_step = NULL, error_cause_at = NULL
    WHERE order_id = NEW.order_id;
END;
