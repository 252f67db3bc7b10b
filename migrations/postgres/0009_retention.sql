-- Retention: a finished order (Processed or Cancelled) may be removed with its steps
-- and history once it is older than the retention policy. The history stays
-- append-only for every other order: a history row may be deleted only while its
-- order's state row says Processed or Cancelled (so retention deletes the history
-- before the state row), and never updated.
CREATE OR REPLACE FUNCTION order_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND COALESCE(
        (SELECT process_state FROM order_state WHERE order_id = OLD.order_id), ''
    ) IN ('Processed', 'Cancelled') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'order_history is append-only';
END
$$;

-- Finding old dead letters of every queue.
CREATE INDEX queue_dead_letters_by_age ON queue_dead_letters (dead_lettered_at);
