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

-- The settle-time figure reads the last minute's settlements; the open
-- alerts by kind read only open alerts.
CREATE INDEX charges_settled ON charges (settled_at) WHERE settled_at IS NOT NULL;
CREATE INDEX alerts_open_kind ON alerts (kind, created_at) WHERE acknowledged_at IS NULL;
