-- The operator console (issue 23; docs/console.md; contract: "Console").

-- People who sign in to the console. The password is an argon2id hash
-- (argon2-cffi's PHC string); a disabled operator cannot sign in and their
-- sessions end at once (operator_sessions are checked against it).
CREATE TABLE operators (
    id             bigserial   PRIMARY KEY,
    email          text        NOT NULL CHECK (email ~ '^[^@\s]+@[^@\s]+$' AND length(email) <= 254),
    role           text        NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    password_hash  text        NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    created_at     timestamptz NOT NULL DEFAULT now(),
    disabled_at    timestamptz
);
CREATE UNIQUE INDEX operators_email ON operators (lower(email));

-- Server-side sessions. Only the SHA-256 of the session id is stored: a
-- reader of the table (a backup, a replica) cannot sign in with it. Idle
-- timeout and absolute lifetime are checked on every request
-- (VPAY_CONSOLE_SESSION_IDLE_SECONDS, VPAY_CONSOLE_SESSION_MAX_SECONDS).
CREATE TABLE operator_sessions (
    id_sha256    text        PRIMARY KEY CHECK (id_sha256 ~ '^[0-9a-f]{64}$'),
    operator_id  bigint      NOT NULL REFERENCES operators (id) ON DELETE CASCADE,
    csrf_token   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    seen_at      timestamptz NOT NULL DEFAULT now(),
    address      text
);
CREATE INDEX operator_sessions_operator ON operator_sessions (operator_id);

-- Failed sign-ins, per account and per address: the throttle counts the
-- recent ones (a success clears the account's). Pruned by the sweep.
CREATE TABLE login_failures (
    id          bigserial   PRIMARY KEY,
    email       text        NOT NULL,
    address     text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX login_failures_email ON login_failures (lower(email), created_at);
CREATE INDEX login_failures_address ON login_failures (address, created_at);

-- Every operator action, from the console (actor = the operator's email)
-- and from the CLI (actor = the OS user@host): who, what, on what, why,
-- how it ended, when.
CREATE TABLE operator_actions (
    id          bigserial   PRIMARY KEY,
    actor       text        NOT NULL CHECK (actor <> ''),
    action      text        NOT NULL CHECK (action <> ''),
    target      text,
    note        text,
    result      text        NOT NULL,
    via         text        NOT NULL DEFAULT 'cli' CHECK (via IN ('cli', 'console')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_actions_created ON operator_actions (created_at DESC, id DESC);
CREATE INDEX operator_actions_target ON operator_actions (target, created_at);

-- One row per rail request (vpay.rails.calls.rail_call): what the rail
-- answered and how long it took. Under retention (the hourly sweep).
CREATE TABLE rail_calls (
    id           bigserial   PRIMARY KEY,
    rail         text        NOT NULL,
    operation    text        NOT NULL,
    reference    text,
    charge_id    text,
    refund_id    text,
    http_status  integer,
    answer       text        NOT NULL,
    reason       text,
    latency_ms   integer     NOT NULL CHECK (latency_ms >= 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rail_calls_charge ON rail_calls (charge_id, created_at) WHERE charge_id IS NOT NULL;
CREATE INDEX rail_calls_reference ON rail_calls (reference, created_at) WHERE reference IS NOT NULL;
CREATE INDEX rail_calls_created ON rail_calls (created_at);

-- Maker-checker for money: a console resolution is a proposal with
-- evidence; another operator approves it (then the settle runs) or rejects
-- it; the proposer may withdraw it. One open proposal per charge.
CREATE TABLE resolution_proposals (
    id           bigserial   PRIMARY KEY,
    charge_id    text        NOT NULL REFERENCES charges (id),
    outcome      text        NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    evidence     text        NOT NULL CHECK (length(btrim(evidence)) BETWEEN 1 AND 2000),
    proposed_by  text        NOT NULL,
    proposed_at  timestamptz NOT NULL DEFAULT now(),
    state        text        NOT NULL DEFAULT 'open'
                             CHECK (state IN ('open', 'approved', 'rejected', 'withdrawn')),
    decided_by   text,
    decided_at   timestamptz,
    decision_note text,
    CONSTRAINT resolution_proposals_checker CHECK (decided_by IS NULL OR decided_by <> proposed_by OR state = 'withdrawn')
);
CREATE UNIQUE INDEX resolution_proposals_one_open ON resolution_proposals (charge_id) WHERE state = 'open';

-- The overview's history: the worker samples once a minute (job
-- sample:overview); rows older than two days are deleted as it samples.
CREATE TABLE console_samples (
    sampled_at   timestamptz NOT NULL DEFAULT now(),
    lane         text        NOT NULL,
    due          integer     NOT NULL,
    leased       integer     NOT NULL,
    dead         integer     NOT NULL,
    oldest_due_seconds double precision,
    PRIMARY KEY (sampled_at, lane)
);

-- The console's searches and lists read through indexes, never a table
-- whole (docs/console.md, "Fast on a big database").
CREATE INDEX charges_rail_reference ON charges (rail_reference);
CREATE INDEX charges_payer ON charges (payer, created_at);
CREATE INDEX charges_created ON charges (created_at, id);
CREATE INDEX charges_status_created ON charges (status, created_at, id);
CREATE INDEX alerts_kind_created ON alerts (kind, created_at, id);
CREATE INDEX alerts_charge ON alerts (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
