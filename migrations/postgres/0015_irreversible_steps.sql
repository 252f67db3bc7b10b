-- A step that can never be undone (no compensation, and its effect must not stand
-- when its order is undone) says so on its row when it starts: once it may have taken
-- effect, a cancel that would undo the order is refused at once, naming it, instead of
-- being left for a scheduler to find. Rows written before this say false; a scheduler
-- still refuses to undo such an order when it claims it.
ALTER TABLE order_steps ADD COLUMN irreversible BOOLEAN NOT NULL DEFAULT false;
