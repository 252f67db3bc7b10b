-- The console at a million orders: the orders by state counted without reading every
-- finished one. Processed and Cancelled orders never change again (only retention
-- removes them), so they are counted once, per minute of their finish, by the leader
-- (`SupervisorStore::tally_finished`), and the count by state adds to those tallies
-- only the finished rows since the last one.

-- Per minute, the Processed and Cancelled orders that finished in it and are still kept.
CREATE TABLE finished_tally (
    minute TIMESTAMPTZ NOT NULL,
    process_state TEXT NOT NULL CHECK (process_state IN ('Processed', 'Cancelled')),
    orders BIGINT NOT NULL,
    PRIMARY KEY (minute, process_state)
);

-- The minutes emptied by retention, found without reading the others.
CREATE INDEX finished_tally_empty ON finished_tally (minute) WHERE orders <= 0;

-- The orders that finished before `upto` are in the tallies; those since, not yet. One
-- row; the epoch until the first tally.
CREATE TABLE finished_tally_mark (
    only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    upto TIMESTAMPTZ NOT NULL
);
INSERT INTO finished_tally_mark (upto) VALUES ('1970-01-01T00:00:00Z');

-- Removing tallied orders takes them off their minute's tally, whoever removes them and
-- whichever version of orderly does. Once per statement (retention deletes in batches),
-- never on the hot path (which deletes no state row). The mark is read FOR SHARE: a
-- tally under way (which holds it FOR UPDATE) and a removal wait for one another, so
-- each sees the other's work whole.
CREATE FUNCTION finished_tally_forget() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mark TIMESTAMPTZ;
BEGIN
    SELECT upto INTO mark FROM finished_tally_mark FOR SHARE;
    UPDATE finished_tally t SET orders = t.orders - g.n
    FROM (SELECT (date_trunc('minute', finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS minute,
                 process_state, count(*) AS n
          FROM gone
          WHERE process_state IN ('Processed', 'Cancelled') AND finished_at < mark
          GROUP BY 1, 2) g
    WHERE t.minute = g.minute AND t.process_state = g.process_state;
    DELETE FROM finished_tally WHERE orders <= 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER order_state_leaves_tally AFTER DELETE ON order_state
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION finished_tally_forget();
