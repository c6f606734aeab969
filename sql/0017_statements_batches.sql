-- Statements II (issue 26): `statements import --apply` records the statement
-- and its judged lines in one transaction, then settles in short batches
-- (vpay/statements/importer.py, BATCH_SETTLES), so the worker's polls never
-- wait on a long import. A statement whose batches were interrupted (a kill,
-- a lost connection) is finished by importing the same file again: it is
-- found by (rail, file_sha256) with completed_at still NULL.

ALTER TABLE statements ADD COLUMN completed_at timestamptz;
-- Every statement recorded before this migration was applied in one transaction.
UPDATE statements SET completed_at = imported_at;
-- Where the period came from: given (--period-start/--period-end), declared
-- (the file's period columns) or lines (its readable lines' times).
ALTER TABLE statements ADD COLUMN period_source text
    CHECK (period_source IN ('given', 'declared', 'lines'));

-- A would_settle line keeps the outcome it proves until its batch settles it.
ALTER TABLE statement_lines ADD COLUMN settle_to text CHECK (settle_to IN ('succeeded', 'failed'));
CREATE INDEX statement_lines_to_settle ON statement_lines (statement_id, coalesce(charge_id, refund_id))
    WHERE outcome = 'would_settle';
-- The line's reason, kept so a resumed import settles a failure with it.
ALTER TABLE statement_lines ADD COLUMN reason text;
