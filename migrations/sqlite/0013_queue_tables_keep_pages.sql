-- PostgreSQL only: its vacuum no longer cuts the queue's tables to nothing when they
-- empty out, which had its plans read the whole table at every take (see its
-- migration). SQLite plans each statement from the schema and its own statistics
-- (none are gathered here), not from the file's size; nothing to change.
SELECT 1;
