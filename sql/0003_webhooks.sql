-- Webhooks: secret rotation, why an endpoint was disabled, and one row per
-- (event, endpoint) delivery (vpay/webhooks.py, vpay/handlers/webhooks.py).

-- Secret rotation (Standard Webhooks, "webhook headers": the signature header
-- is a list so that a secret can change without downtime). While
-- previous_secret_expires_at is in the future, deliveries are signed with
-- both secrets.
ALTER TABLE webhook_endpoints
    ADD COLUMN previous_secret            text CHECK (previous_secret ~ '^whsec_'),
    ADD COLUMN previous_secret_expires_at timestamptz,
    ADD COLUMN disabled_at                timestamptz,
    ADD COLUMN disabled_reason            text,
    ADD CONSTRAINT webhook_endpoints_previous_secret_whole CHECK (
        (previous_secret IS NULL) = (previous_secret_expires_at IS NULL));

-- One row per delivery the fan-out decided on. The fan-out inserts here and
-- into jobs in one statement, so re-running a fan-out creates nothing new
-- even after its deliver jobs have finished and been deleted. The row keeps
-- the delivery's outcome after its job is gone (what an operator or a
-- merchant asks: "was evt_… sent to we_…, and what did it answer?").
CREATE TABLE webhook_deliveries (
    event_id         text        NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    endpoint_id      text        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'delivered', 'gone', 'skipped',
                                                   'dead_lettered')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_status_code integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    PRIMARY KEY (event_id, endpoint_id)
);
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at);
