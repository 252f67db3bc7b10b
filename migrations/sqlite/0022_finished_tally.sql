-- The console at a million orders: the orders by state counted without reading every
-- finished one. Processed and Cancelled orders never change again (only retention
-- removes them), so they are counted once, per minute of their finish, by the leader
-- (`SupervisorStore::tally_finished`), and the count by state adds to those tallies
-- only the finished rows since the last one.

-- Per minute, the Processed and Cancelled orders that finished in it and are still kept.
CREATE TABLE finished_tally (
    minute TEXT NOT NULL,
    process_state TEXT NOT NULL CHECK (process_state IN ('Processed', 'Cancelled')),
    orders INTEGER NOT NULL,
    PRIMARY KEY (minute, process_state)
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
      AND process_state = OLD.process_state;
    DELETE FROM finished_tally
    WHERE minute = substr(OLD.finished_at, 1, 16) || ':00.000000Z'
      AND process_state = OLD.process_state AND orders <= 0;
END;
