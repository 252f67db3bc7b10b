-- The key that signs the step requests and replies between schedulers and agents, so
-- that whoever may only send to a queue cannot have a service called or an order's
-- notices redirected. One row (id 1), written by the first role that needs it and
-- never changed; the secret is 64 hex digits. Whoever can read this table can sign:
-- it is as secret as the store's credentials.
CREATE TABLE message_keys (
    id         INTEGER     NOT NULL PRIMARY KEY,
    secret     TEXT        NOT NULL,
    created_at TEXT        NOT NULL,
    created_by TEXT        NOT NULL
) WITHOUT ROWID;
