-- A step's row is inserted when the step starts and updated once when it ends
-- (Succeeded or Failed; Compensated later on the way back). Packed full by the inserts
-- of other orders' steps, its page had no room for the new version, so 62% of those
-- updates wrote a new entry in the primary key's index and left the old one for a
-- vacuum (30,000 updates, 11,493 in place, in the benchmark's 10,000 orders). A page
-- now keeps 30% free for the versions of its rows, as order_state's do (migration 12):
-- the update goes in place (a HOT update) and the old version is pruned from the page.
-- Applies to pages written from now on; nothing is rewritten.
ALTER TABLE order_steps SET (fillfactor = 70);
