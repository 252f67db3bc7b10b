-- An operator acknowledges an alert about the system ("seen, being handled"), as one
-- acknowledges an order's alert: who and when. The episode stays open until its
-- condition ends; acknowledging does not resolve it.
ALTER TABLE system_alerts ADD COLUMN acknowledged_by TEXT;
ALTER TABLE system_alerts ADD COLUMN acknowledged_at TEXT;
