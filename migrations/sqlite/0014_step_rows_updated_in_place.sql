-- PostgreSQL only: its step rows' pages keep room for their next version, so a step's
-- end updates its row in place (see its migration). SQLite rewrites a row within its
-- b-tree page whatever the page's fill; nothing to change.
SELECT 1;
