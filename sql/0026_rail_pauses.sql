-- A rail's backpressure pause, shared by every process (issue 25, "Rail
-- backpressure fleet-wide"; vpay/rails/pauses.py). A rail that answers 429 or
-- 503 with Retry-After asks the whole deployment for less traffic, not the
-- one process that got the answer: that process writes the pause here, and
-- every worker and API process reads it (a copy at most
-- vpay.rails.pauses.REFRESH_SECONDS old) before calling the rail.
--
-- One row per rail, updated in place: the table holds at most one row per
-- known rail (its retention), the last pause of each, over or not. A pause
-- only extends (the upsert keeps a later paused_until), and every process
-- caps what it honours at its own VPAY_<RAIL>_MAX_PAUSE_SECONDS from now.
CREATE TABLE rail_pauses (
    rail         text        PRIMARY KEY CHECK (rail IN ('mtn', 'orange', 'mpesa', 'pawapay')),
    paused_until timestamptz NOT NULL,
    reason       text        NOT NULL,   -- short, credential-free: "HTTP 429 Retry-After 30"
    set_by       text        NOT NULL,   -- the process that got the answer: a worker id, or "api <host>:<pid>"
    set_at       timestamptz NOT NULL DEFAULT now()
);
