-- The console at a million orders: Error orders are grouped by cause through an index,
-- not by reading every Error order into orderly.

-- An Error order's cause: its last error with the ids and numbers stripped
-- (`orderly_core::triage::error_pattern`, computed by orderly, not by SQL), and the
-- `updated_at` of the row it was computed from. A cause counts only while the row is
-- as it was then: a row changed since (retried, cancelled, moved, in Error again) has
-- its cause computed anew, whichever version of orderly changed it. Filled by whoever
-- reads the causes (the console), for the rows that need it.
ALTER TABLE order_state ADD COLUMN error_cause TEXT;
ALTER TABLE order_state ADD COLUMN error_cause_at TIMESTAMPTZ;

-- Only Error rows, so the hot path's writes never touch it; it holds every column the
-- grouping reads (read from the index alone).
CREATE INDEX order_state_error_causes
    ON order_state (workflow, workflow_version, current_step, error_cause, error_cause_at,
                    updated_at, created_at, order_id)
    WHERE process_state = 'Error';
