-- Pinned workflow versions. `workflow` is the workflow an order asked for (NULL: the
-- schedulers' default); `workflow_version` is the version of it the order was
-- started under (set by its first claim, never changed after). A scheduler claims
-- only orders whose workflow it starts or whose pinned version it has loaded, and
-- applies that version's steps, so a deployment can change a workflow while orders
-- are in flight. Orders from before this migration have neither and are pinned to
-- the claiming scheduler's default when next claimed.
ALTER TABLE order_state ADD COLUMN workflow TEXT
    CONSTRAINT order_state_workflow_name CHECK (workflow IS NULL OR length(workflow) BETWEEN 1 AND 40);
ALTER TABLE order_state ADD COLUMN workflow_version TEXT
    CONSTRAINT order_state_workflow_version CHECK (workflow_version IS NULL OR workflow IS NOT NULL);
