-- PostgreSQL only: its queue's pages keep room for a locked message's new version (see
-- its migration). SQLite rewrites a row within its b-tree page and updates only the
-- indexes whose columns change; nothing to change.
SELECT 1;
