-- Retention: a finished order (Processed or Cancelled) may be removed with its steps
-- and history once it is older than the retention policy. The history stays
-- append-only for every other order: a history row may be deleted only while its
-- order's state row says Processed or Cancelled (so retention deletes the history
-- before the state row), and never updated.
DROP TRIGGER order_history_no_delete;

CREATE TRIGGER order_history_no_delete BEFORE DELETE ON order_history
WHEN COALESCE((SELECT process_state FROM order_state WHERE order_id = OLD.order_id), '')
    NOT IN ('Processed', 'Cancelled')
BEGIN
    SELECT RAISE(ABORT, 'order_history is append-only');
END;

-- Finding old dead letters of every queue.
CREATE INDEX queue_dead_letters_by_age ON queue_dead_letters (dead_lettered_at);
