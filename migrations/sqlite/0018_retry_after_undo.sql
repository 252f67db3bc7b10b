-- An operator's retry of an order that stopped half undone (an undo in doubt, or some
-- steps undone and others not) first finishes the undoing, then runs the workflow
-- afresh. While the undoing runs the order is marked here; the scheduler that finishes
-- the undoing then starts the fresh run instead of ending the order in Error. Any
-- other operator move clears it.
ALTER TABLE order_state ADD COLUMN retry_after_undo INTEGER NOT NULL DEFAULT 0
    CONSTRAINT order_state_retry_after_undo_bool CHECK (retry_after_undo IN (0, 1));
