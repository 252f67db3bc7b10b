-- Outbox messages that cannot be delivered (their queue does not exist, or they failed
-- too many times) are set aside with the reason, for operators (`orderly outbox`, the
-- dashboard, /metrics), instead of being retried forever. Sent rows are deleted after
-- a retention period, so the table holds what is in flight and what needs a look.
ALTER TABLE outbox ADD COLUMN dead_at TEXT;
ALTER TABLE outbox ADD COLUMN dead_reason TEXT;
CREATE INDEX outbox_dead ON outbox (seq) WHERE dead_at IS NOT NULL;
CREATE INDEX outbox_sent ON outbox (sent_at) WHERE sent_at IS NOT NULL;
