-- The operator console, part two (issue 23's gaps; docs/console.md).

-- A rail's 429/503 with Retry-After is stored like any answer (answer
-- 'paused'), with the end of the pause it imposed on the process that got it
-- (vpay.rails.gate): the overview's "rails paused" reads the pauses still in
-- force through this index, never the whole log.
ALTER TABLE rail_calls ADD COLUMN paused_until timestamptz;
CREATE INDEX rail_calls_paused ON rail_calls (paused_until) WHERE paused_until IS NOT NULL;

-- The overview's figures, once a minute beside console_samples (the worker's
-- sample:overview job; kept two days): status reads due and how late the
-- most overdue one is, charges settled since the last sample and their
-- settle time (settled_at - created_at), workers seen alive.
CREATE TABLE console_figures (
    sampled_at         timestamptz PRIMARY KEY DEFAULT now(),
    polls_due          integer     NOT NULL,
    poll_late_seconds  double precision,
    settled            integer     NOT NULL,
    settle_p50_seconds double precision,
    settle_p95_seconds double precision,
    workers            integer     NOT NULL
);

-- The settle-time figure and the overview's "settled in 24 h" read the
-- settlements of their window only (index-only: status and created_at are
-- in the index); the open alerts by kind read only open alerts.
CREATE INDEX charges_settled ON charges (settled_at) INCLUDE (status, created_at) WHERE settled_at IS NOT NULL;
CREATE INDEX alerts_open_kind ON alerts (kind, created_at) WHERE acknowledged_at IS NULL;

-- One row per rail callback the API read (vpay.api.callbacks): what it
-- named and what it did to the charge's poll (action: pulled_forward,
-- enqueued, spaced; left alone: polled_recently, leased, dead_lettered,
-- due_soon, raced; unknown_reference; token_refused). The console's payment
-- timeline reads them; under the same retention as rail_calls (the hourly
-- sweep, VPAY_RETENTION_DAYS). Never the body or a token: a callback is a
-- hint, and anyone may send one.
CREATE TABLE rail_callbacks (
    id           bigserial   PRIMARY KEY,
    rail         text        NOT NULL,
    reference    text        NOT NULL,
    charge_id    text,
    action       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rail_callbacks_charge ON rail_callbacks (charge_id, created_at) WHERE charge_id IS NOT NULL;
CREATE INDEX rail_callbacks_created ON rail_callbacks (created_at);
CREATE INDEX rail_callbacks_reference ON rail_callbacks (reference, created_at);

-- The payments list filtered by rail, newest first (keyset on created_at, id).
CREATE INDEX charges_rail_created ON charges (rail, created_at, id);

-- The unresolved workbench counts the statement lines naming a charge's
-- reference (a line the import could not tie to a charge has no charge_id).
CREATE INDEX statement_lines_reference ON statement_lines (reference) WHERE reference IS NOT NULL;
