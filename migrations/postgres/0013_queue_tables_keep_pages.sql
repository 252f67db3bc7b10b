-- A vacuum no longer gives back the empty pages at the end of the queue's tables.
--
-- Messages are inserted, locked and deleted, so these tables empty out whenever the
-- system is idle, and a vacuum then cut their files to nothing. The server's estimate of
-- a table's size comes from its file and from what the last vacuum counted: a take or a
-- completion planned then (and a vacuum makes every connection plan its statements
-- again) saw an empty table, chose to read the whole of it, and kept that plan for
-- every execution after it, however full the table got. Under load, each take read the
-- whole table three times (3,840 buffers for 18 messages, seen with auto_explain).
-- With the pages kept, the file stays at its high-water mark, a plan made on an idle
-- table still sees what a whole read costs, and the index is used.
--
-- A truncation also takes the table's exclusive lock, which stops every receive
-- while it lasts; the pages kept are reused by the next messages.
ALTER TABLE queue_messages SET (vacuum_truncate = false);
ALTER TABLE outbox SET (vacuum_truncate = false);
