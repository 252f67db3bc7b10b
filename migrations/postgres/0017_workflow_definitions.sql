-- Workflow versions are data: the first time a version is used (a scheduler that loads
-- it starts, or `orderly migrate --workflow` declares it), its definition is written
-- here, and any scheduler runs an order pinned to any version stored here, whether or
-- not it loaded that version's file. A deploy, a rollback or the demo's shortened
-- workflow never strands an order. Rows are never changed: a version's definition is
-- what its version (a hash of the definition) says it is.
CREATE TABLE workflow_definitions (
    name          TEXT        NOT NULL,
    version       TEXT        NOT NULL,
    definition    TEXT        NOT NULL,
    first_seen_at TIMESTAMPTZ NOT NULL,
    first_seen_by TEXT        NOT NULL,
    PRIMARY KEY (name, version)
);
