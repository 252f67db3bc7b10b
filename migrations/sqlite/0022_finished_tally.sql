-- The console at a million orders: the orders by state counted without reading every
-- finished one. Processed and Cancelled orders never change again (only retention
-- removes them), so they are counted once, per minute of their finish, by the leader
-- (`SupervisorStore::tally_finished`), and the count by state adds to those tallies
-- only the finished rows since the last one.

-- Per minute, the Processed and Cancelled orders that finished in it and are still kept;
-- the Processed ones by bucket of their submit-to-Processed latency (the buckets of
-- `orderly_core::activity::LATENCY_BOUNDS_MS`; -1 for Cancelled), what the charts of a
-- day or a week read.
CREATE TABLE finished_tally (
    minute TEXT NOT NULL,
    process_state TEXT NOT NULL CHECK (process_state IN ('Processed', 'Cancelled')),
    bucket INTEGER NOT NULL,
    orders INTEGER NOT NULL,
    PRIMARY KEY (minute, process_state, bucket)
) WITHOUT ROWID;

-- The orders that finished before `upto` are in the tallies; those since, not yet. One
-- row; the epoch until the first tally.
CREATE TABLE finished_tally_mark (
    only_row INTEGER PRIMARY KEY CHECK (only_row = 1),
    upto TEXT NOT NULL
);
INSERT INTO finished_tally_mark (only_row, upto) VALUES (1, '1970-01-01T00:00:00.000000Z');

-- Removing tallied orders takes them off their minute's tally, whoever removes them and
-- whichever version of orderly does; never on the hot path (which deletes no state row).
CREATE TRIGGER order_state_leaves_tally AFTER DELETE ON order_state
WHEN OLD.process_state IN ('Processed', 'Cancelled')
    AND OLD.finished_at < (SELECT upto FROM finished_tally_mark)
BEGIN
    UPDATE finished_tally SET orders = orders - 1
    WHERE minute = substr(OLD.finished_at, 1, 16) || ':00.000000Z'
      AND process_state = OLD.process_state
      AND bucket = CASE WHEN OLD.process_state = 'Processed' THEN CASE
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 5 THEN 0
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 10 THEN 1
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 20 THEN 2
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 50 THEN 3
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 100 THEN 4
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 200 THEN 5
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 500 THEN 6
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 1000 THEN 7
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 2000 THEN 8
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 5000 THEN 9
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 10000 THEN 10
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 30000 THEN 11
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 60000 THEN 12
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 300000 THEN 13
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 1800000 THEN 14
          WHEN ((julianday(OLD.updated_at) - julianday(OLD.created_at)) * 86400000.0) < 3600000 THEN 15
          ELSE 16 END
      ELSE -1 END;
    DELETE FROM finished_tally
    WHERE minute = substr(OLD.finished_at, 1, 16) || ':00.000000Z'
      AND process_state = OLD.process_state AND orders <= 0;
END;
