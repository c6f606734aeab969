-- vpay-reconciler schema. Names are fixed by shared/design/contract.md; the
-- checks keep bad rows out so that a bug in Python cannot store one.

CREATE TABLE jobs (
    id          bigserial PRIMARY KEY,
    kind        text        NOT NULL CHECK (kind <> ''),
    dedupe_key  text        NOT NULL UNIQUE CHECK (dedupe_key <> ''),
    payload     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    run_at      timestamptz NOT NULL DEFAULT now(),
    attempts    integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- consecutive claims that ended without an Outcome (exception, or a
    -- lease reaped after a crash); reset by any Outcome. Bounds poison jobs.
    failures    integer     NOT NULL DEFAULT 0 CHECK (failures >= 0),
    locked_by   text,
    locked_at   timestamptz,
    -- fencing token, new at every claim: every lease-ending write matches it,
    -- so a reaped worker cannot overwrite a later claim, even its own.
    lease_token uuid,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT jobs_lease_whole CHECK (
        (locked_by IS NULL) = (locked_at IS NULL)
        AND (locked_at IS NULL) = (lease_token IS NULL))
);

-- The claim reads only due, unleased, live rows: dead letters (infinity),
-- leased rows and far-future polls are outside this index.
CREATE INDEX jobs_claimable ON jobs (run_at)
    WHERE locked_at IS NULL AND run_at <> 'infinity';
-- The reaper and release_all read only leased rows.
CREATE INDEX jobs_leased ON jobs (locked_at) WHERE locked_at IS NOT NULL;
CREATE INDEX jobs_dead ON jobs (id) WHERE run_at = 'infinity';

CREATE TABLE merchants (
    id          text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.-]{1,64}$'),
    name        text        NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE payment_intents (
    id          text        PRIMARY KEY CHECK (id ~ '^pi_[A-Za-z0-9]+$'),
    merchant_id text        NOT NULL REFERENCES merchants (id),
    amount      bigint      NOT NULL CHECK (amount > 0),
    currency    text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status      text        NOT NULL CHECK (status IN ('requires_confirmation', 'processing',
                                'succeeded', 'requires_payment_method', 'canceled')),
    next_action jsonb,
    description text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payment_intents_merchant ON payment_intents (merchant_id, created_at);

CREATE TABLE charges (
    id                  text        PRIMARY KEY CHECK (id ~ '^ch_[A-Za-z0-9]+$'),
    payment_intent_id   text        NOT NULL REFERENCES payment_intents (id),
    rail                text        NOT NULL CHECK (rail IN ('mtn', 'orange')),
    rail_reference      text        NOT NULL CHECK (rail_reference <> ''),
    payer               text        NOT NULL CHECK (payer ~ '^[0-9]{8,15}$'),
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'succeeded', 'failed', 'unresolved')),
    failure_code        text,
    rail_transaction_id text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    submitted_at        timestamptz,
    settled_at          timestamptz,
    unresolved_at       timestamptz,
    prompt_expired_at   timestamptz,
    last_polled_at      timestamptz,
    UNIQUE (rail, rail_reference),
    CONSTRAINT charges_settled_when_terminal CHECK (
        (status IN ('succeeded', 'failed')) = (settled_at IS NOT NULL)),
    CONSTRAINT charges_failure_code_when_failed CHECK (
        (status = 'failed') = (failure_code IS NOT NULL))
);
CREATE INDEX charges_intent ON charges (payment_intent_id);
-- scan:live reads only live charges.
CREATE INDEX charges_live ON charges (created_at) WHERE status IN ('pending', 'unresolved');

CREATE TABLE events (
    id                text        PRIMARY KEY CHECK (id ~ '^evt_[A-Za-z0-9]+$'),
    type              text        NOT NULL CHECK (type IN ('payment_intent.processing',
                                      'payment_intent.succeeded', 'payment_intent.payment_failed')),
    payment_intent_id text        NOT NULL REFERENCES payment_intents (id),
    data              jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_intent ON events (payment_intent_id, created_at);

CREATE TABLE webhook_endpoints (
    id          text        PRIMARY KEY CHECK (id ~ '^we_[A-Za-z0-9]+$'),
    merchant_id text        NOT NULL REFERENCES merchants (id),
    url         text        NOT NULL CHECK (url ~ '^https?://'),
    secret      text        NOT NULL CHECK (secret ~ '^whsec_'),
    enabled     boolean     NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_merchant ON webhook_endpoints (merchant_id) WHERE enabled;

CREATE TABLE alerts (
    id              bigserial   PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind IN ('charge_unresolved', 'rail_contradiction',
                                    'job_dead_lettered')),
    charge_id       text        REFERENCES charges (id),
    details         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    acknowledged_at timestamptz
);
-- A charge is escalated once: a second escalation attempt conflicts here.
CREATE UNIQUE INDEX alerts_one_unresolved_per_charge ON alerts (charge_id)
    WHERE kind = 'charge_unresolved';
CREATE INDEX alerts_open ON alerts (created_at) WHERE acknowledged_at IS NULL;
