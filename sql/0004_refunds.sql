-- Refunds (vpay/refunds.py, vpay/handlers/refund_poll.py; docs/flows/refunds.md).
-- A refund gives back all or part of a succeeded charge. Its life mirrors a
-- charge's: pending -> succeeded | failed | unresolved; unresolved ->
-- succeeded | failed. Only the authenticated refund status read settles it.

CREATE TABLE refunds (
    id                  text        PRIMARY KEY CHECK (id ~ '^re_[A-Za-z0-9]+$'),
    charge_id           text        NOT NULL REFERENCES charges (id),
    rail                text        NOT NULL CHECK (rail IN ('mtn', 'orange')),
    -- our UUIDv4, sent as MoMo's X-Reference-Id: the rail's id of the refund
    rail_reference      text        NOT NULL CHECK (rail_reference ~
                            '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'),
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'succeeded', 'failed', 'unresolved')),
    failure_code        text,
    rail_transaction_id text,
    reason              text        CHECK (length(reason) <= 160),
    created_at          timestamptz NOT NULL DEFAULT now(),
    submitted_at        timestamptz,
    settled_at          timestamptz,
    unresolved_at       timestamptz,
    last_polled_at      timestamptz,
    UNIQUE (rail, rail_reference),
    CONSTRAINT refunds_settled_when_terminal CHECK (
        (status IN ('succeeded', 'failed')) = (settled_at IS NOT NULL)),
    CONSTRAINT refunds_failure_code_when_failed CHECK (
        (status = 'failed') = (failure_code IS NOT NULL)),
    CONSTRAINT refunds_unresolved_stamped CHECK (
        status <> 'unresolved' OR unresolved_at IS NOT NULL)
);
-- The create transaction sums a charge's non-failed refunds.
CREATE INDEX refunds_charge ON refunds (charge_id);
CREATE INDEX refunds_live ON refunds (created_at) WHERE status IN ('pending', 'unresolved');

-- Merchants learn a refund's outcome through their webhooks. Refund events
-- hang off the refunded charge's intent, like every other event.
ALTER TABLE events DROP CONSTRAINT events_type_check;
ALTER TABLE events ADD CONSTRAINT events_type_check CHECK (type IN (
    'payment_intent.processing', 'payment_intent.succeeded', 'payment_intent.payment_failed',
    'refund.succeeded', 'refund.failed'));

-- A refund still pending at the 24-hour horizon is escalated once, with one
-- alert (charge_id = the refunded charge, refund_id = the refund).
ALTER TABLE alerts ADD COLUMN refund_id text REFERENCES refunds (id);
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind IN (
    'charge_unresolved', 'rail_contradiction', 'job_dead_lettered', 'refund_unresolved'));
CREATE UNIQUE INDEX alerts_one_unresolved_per_refund ON alerts (refund_id)
    WHERE kind = 'refund_unresolved';
