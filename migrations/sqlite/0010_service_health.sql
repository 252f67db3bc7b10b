-- Remote services' health, shared by the fleet: when an agent sees a service fail past
-- its threshold it is Down here, schedulers stop sending it requests and park the
-- orders that need it (Pending, held until it is back, not counted as failures), and a
-- probe decides when it is Up again. One row per service (an agent queue's name).
CREATE TABLE service_health (
    service           TEXT    PRIMARY KEY NOT NULL,
    state             TEXT    NOT NULL,
    down_since        TEXT,
    retry_at          TEXT,
    probes            INTEGER NOT NULL DEFAULT 0,
    outage            INTEGER NOT NULL DEFAULT 0,
    alerted           INTEGER NOT NULL DEFAULT 0,
    resolved          INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT,
    reported_by       TEXT,
    resume_per_second INTEGER NOT NULL DEFAULT 200,
    updated_at        TEXT    NOT NULL,
    CONSTRAINT service_health_known_state CHECK (state IN ('Up', 'Down', 'Probing')),
    CONSTRAINT service_health_resume_rate CHECK (resume_per_second > 0)
);

-- The service an order was parked for, kept until it moves past that step.
ALTER TABLE order_state ADD COLUMN waiting_on TEXT;

-- The orders waiting for each service, oldest first (small: only parked rows).
CREATE INDEX order_state_waiting ON order_state (waiting_on, created_at, order_id)
    WHERE process_state = 'Pending' AND waiting_on IS NOT NULL;
