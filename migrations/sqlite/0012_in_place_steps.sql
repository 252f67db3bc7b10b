-- Finished orders are indexed by finished_at, which only a finished row has (its
-- updated_at, as the old index read it), so the same queries serve both dialects. On
-- PostgreSQL this keeps a step's write off every index (see its migration); SQLite
-- computes the column when read.
ALTER TABLE order_state ADD COLUMN finished_at TEXT GENERATED ALWAYS AS (
    CASE WHEN process_state IN ('Processed', 'Error', 'Cancelled') THEN updated_at END
) VIRTUAL;

DROP INDEX order_state_finished;
CREATE INDEX order_state_finished ON order_state (finished_at) WHERE finished_at IS NOT NULL;
