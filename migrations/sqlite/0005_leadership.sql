-- Leadership terms (leader election): one row per led role, today 'supervisor'.
-- Every new term takes a strictly larger epoch before its leader's first write, and
-- every write of a leader checks its (name, epoch, holder) against this row in the
-- same transaction, so a deposed leader's writes are refused.
CREATE TABLE leadership (
    name             TEXT    PRIMARY KEY,
    epoch            INTEGER  NOT NULL CHECK (epoch > 0),
    holder           TEXT    NOT NULL,
    -- The SQL elector's lease, on the database's clock: the term holds until then.
    -- NULL for a term whose lease lives elsewhere (an Azure blob): epoch alone fences it.
    lease_expires_at TEXT,
    started_at       TEXT NOT NULL,
    renewed_at       TEXT NOT NULL,
    -- The last write the leader made under this term.
    last_write_at    TEXT
);
