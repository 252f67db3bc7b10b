-- An operator's retry of an order that stopped half undone (an undo in doubt, or some
-- steps undone and others not) first finishes the undoing, then runs the workflow
-- afresh. While the undoing runs the order is marked here; the scheduler that finishes
-- the undoing then starts the fresh run instead of ending the order in Error. Any
-- other operator move clears it.
ALTER TABLE order_state ADD COLUMN retry_after_undo BOOLEAN NOT NULL DEFAULT FALSE;
