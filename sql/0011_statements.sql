-- Statement reconciliation (vpay/statements/, docs/flows/statements.md) and
-- the evidence behind every settlement that no status read made
-- (`statements import --apply`, `charges resolve`).

-- One imported statement: the file a rail (or aggregator) exported, by its
-- SHA-256, so the same file imported twice is recognised and changes nothing.
-- Written only by `--apply`, in the same transaction as everything it did.
CREATE TABLE statements (
    id            text        PRIMARY KEY CHECK (id ~ '^st_[A-Za-z0-9]+$'),
    rail          text        NOT NULL CHECK (rail IN ('mtn', 'orange')),
    file_sha256   text        NOT NULL CHECK (file_sha256 ~ '^[0-9a-f]{64}$'),
    file_name     text        NOT NULL,
    profile       text        NOT NULL,   -- profile name, or "map" for an explicit --map
    columns       jsonb       NOT NULL,   -- map key -> the file's column name
    period_start  timestamptz,            -- earliest line time (NULL: no line had a time)
    period_end    timestamptz,            -- latest line time
    line_count    integer     NOT NULL CHECK (line_count >= 0),
    report        jsonb       NOT NULL DEFAULT '{}'::jsonb,  -- counts and amounts per outcome, missing list
    imported_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (rail, file_sha256),
    CONSTRAINT statements_period_ordered CHECK (period_start <= period_end)
);

-- Every line of an imported statement, as read and as judged.
CREATE TABLE statement_lines (
    statement_id        text        NOT NULL REFERENCES statements (id),
    line_no             integer     NOT NULL CHECK (line_no >= 2),   -- the file's line (1 = header)
    kind                text        CHECK (kind IN ('charge', 'refund')),
    reference           text,
    rail_transaction_id text,
    msisdn              text,
    amount_text         text,       -- exactly as the file had it
    amount              bigint,     -- minor units; NULL when unreadable
    currency            text,
    status_text         text,       -- the rail's word
    line_time           timestamptz,
    outcome             text        NOT NULL CHECK (outcome IN ('matched', 'settled', 'would_settle',
                            'contradiction', 'unknown_rail_transaction', 'still_pending', 'error')),
    charge_id           text        REFERENCES charges (id),
    refund_id           text        REFERENCES refunds (id),
    detail              text,
    PRIMARY KEY (statement_id, line_no)
);
CREATE INDEX statement_lines_charge ON statement_lines (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX statement_lines_refund ON statement_lines (refund_id) WHERE refund_id IS NOT NULL;

-- Why a charge or refund was settled without a status read: a statement line
-- or an operator's note. Written in the settling transaction, only when the
-- compare-and-swap moved the row, so there is at most one per charge/refund.
CREATE TABLE settlement_evidence (
    id            bigserial   PRIMARY KEY,
    charge_id     text        REFERENCES charges (id),
    refund_id     text        REFERENCES refunds (id),
    outcome       text        NOT NULL CHECK (outcome IN ('succeeded', 'failed')),
    source        text        NOT NULL CHECK (source IN ('statement', 'operator')),
    statement_id  text,
    line_no       integer,
    evidence      text        NOT NULL CHECK (length(btrim(evidence)) > 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT settlement_evidence_one_subject CHECK ((charge_id IS NULL) <> (refund_id IS NULL)),
    CONSTRAINT settlement_evidence_line CHECK (
        (source = 'statement') = (statement_id IS NOT NULL AND line_no IS NOT NULL)),
    FOREIGN KEY (statement_id, line_no) REFERENCES statement_lines (statement_id, line_no)
        DEFERRABLE INITIALLY DEFERRED
);
CREATE UNIQUE INDEX settlement_evidence_one_per_charge ON settlement_evidence (charge_id)
    WHERE charge_id IS NOT NULL;
CREATE UNIQUE INDEX settlement_evidence_one_per_refund ON settlement_evidence (refund_id)
    WHERE refund_id IS NOT NULL;

-- Statement lines name our charges and refunds by what the rail saw: the
-- reference we sent (unique already), Orange's order_id (the first 30 hex
-- digits of it), or the rail's own transaction id.
CREATE INDEX charges_order_id ON charges (left(replace(rail_reference, '-', ''), 30));
CREATE INDEX charges_rail_transaction_id ON charges (rail_transaction_id) WHERE rail_transaction_id IS NOT NULL;
CREATE INDEX refunds_rail_transaction_id ON refunds (rail_transaction_id) WHERE rail_transaction_id IS NOT NULL;

-- New alert kinds, added to whatever the check allows now (other migrations
-- extend it too, so the list is read rather than restated).
DO $$
DECLARE
    kinds text[];
BEGIN
    SELECT array_agg(DISTINCT m[1]) INTO kinds
      FROM pg_constraint c, regexp_matches(pg_get_constraintdef(c.oid), '''([a-z_]+)''', 'g') AS m
     WHERE c.conrelid = 'alerts'::regclass AND c.conname = 'alerts_kind_check';
    kinds := array(SELECT DISTINCT unnest(kinds || ARRAY['missing_from_statement', 'unknown_rail_transaction']));
    ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
    EXECUTE format('ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind IN (%s))',
                   (SELECT string_agg(quote_literal(k), ', ' ORDER BY k) FROM unnest(kinds) AS k));
END
$$;

-- A statement finding is alerted once, acknowledged or not: importing the
-- same period again (an overlapping statement) raises nothing new.
-- details->>'finding' names it: 'missing', 'unknown:<rail>:<id>',
-- 'contradiction:<rail_says>', 'amount_mismatch'.
CREATE UNIQUE INDEX alerts_one_per_statement_finding
    ON alerts (kind, coalesce(charge_id, ''), coalesce(refund_id, ''), (details ->> 'finding'))
    WHERE details ? 'finding';
