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
    minute TIMESTAMPTZ NOT NULL,
    process_state TEXT NOT NULL CHECK (process_state IN ('Processed', 'Cancelled')),
    bucket INTEGER NOT NULL,
    orders BIGINT NOT NULL,
    PRIMARY KEY (minute, process_state, bucket)
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
                 process_state,
                 CASE WHEN process_state = 'Processed' THEN CASE
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 5 THEN 0
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 10 THEN 1
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 20 THEN 2
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 50 THEN 3
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 100 THEN 4
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 200 THEN 5
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 500 THEN 6
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 1000 THEN 7
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 2000 THEN 8
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 5000 THEN 9
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 10000 THEN 10
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 30000 THEN 11
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 60000 THEN 12
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 300000 THEN 13
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 1800000 THEN 14
                     WHEN (extract(epoch FROM (updated_at - created_at)) * 1000) < 3600000 THEN 15
                     ELSE 16 END
                 ELSE -1 END AS bucket,
                 count(*) AS n
          FROM gone
          WHERE process_state IN ('Processed', 'Cancelled') AND finished_at < mark
          GROUP BY 1, 2, 3) g
    WHERE t.minute = g.minute AND t.process_state = g.process_state AND t.bucket = g.bucket;
    DELETE FROM finished_tally WHERE orders <= 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER order_state_leaves_tally AFTER DELETE ON order_state
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION finished_tally_forget();
