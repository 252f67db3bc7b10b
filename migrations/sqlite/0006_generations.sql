-- Runs of an order's workflow. An operator's retry of an order some of whose steps
-- were undone (compensated) runs the workflow again from the first step under the
-- next generation; every idempotency key carries it, so the remote services apply the
-- redo instead of answering with the undone result. 0 for the first run.
ALTER TABLE order_state ADD COLUMN generation INTEGER NOT NULL DEFAULT 0
    CONSTRAINT order_state_generation_not_negative CHECK (generation >= 0);
