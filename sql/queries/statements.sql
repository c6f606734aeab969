-- Statement reconciliation (vpay/statements/) and settlement evidence
-- (money.settle_with_evidence, refunds.settle_refund_with_evidence). Amounts
-- are minor units; every "now" is Postgres's.

-- name: insert_settlement_evidence
-- Called in the settling transaction, after the status CAS moved the row.
INSERT INTO settlement_evidence (charge_id, refund_id, outcome, source, statement_id, line_no, evidence)
VALUES (%(charge_id)s, %(refund_id)s, %(outcome)s, %(source)s, %(statement_id)s, %(line_no)s, %(evidence)s)
RETURNING id;

-- name: statement_by_hash
-- completed_at NULL: an --apply whose batches were interrupted; importing the
-- same file again finishes it.
SELECT id, imported_at, completed_at FROM statements WHERE rail = %(rail)s AND file_sha256 = %(sha256)s;

-- name: insert_statement
-- The unique (rail, file_sha256) makes a concurrent import of the same file
-- wait for the first one's commit, then fail: it changes nothing.
INSERT INTO statements (id, rail, file_sha256, file_name, profile, columns, period_start, period_end,
                        period_source, line_count, report)
VALUES (%(id)s, %(rail)s, %(sha256)s, %(file_name)s, %(profile)s, %(columns)s, %(period_start)s,
        %(period_end)s, %(period_source)s, %(line_count)s, %(report)s)
RETURNING id, imported_at;

-- name: charges_for_statement
-- Our charges a statement's lines may name: by rail_reference (what we sent),
-- by Orange's order_id (the first 30 hex digits of it), by M-Pesa's
-- AccountReference (the first 12), by our own charge id (MoMo's externalId),
-- or by the rail's transaction id. One branch per
-- identifier, each an index scan (an OR of four ANYs over 20,000 values was
-- planned as a scan comparing every row with every value: seconds a chunk).
SELECT id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM charges WHERE rail = %(rail)s AND rail_reference = ANY(%(refs)s)
UNION
SELECT id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM charges WHERE rail = %(rail)s AND left(replace(rail_reference, '-', ''), 30) = ANY(%(refs)s)
UNION
SELECT id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM charges WHERE rail = 'mpesa' AND %(rail)s = 'mpesa'
                 AND left(replace(rail_reference, '-', ''), 12) = ANY(%(refs)s)
UNION
SELECT id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM charges WHERE rail = %(rail)s AND id = ANY(%(refs)s)
UNION
SELECT id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM charges WHERE rail = %(rail)s AND rail_transaction_id = ANY(%(txids)s);

-- name: refunds_for_statement
SELECT id, charge_id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM refunds WHERE rail = %(rail)s AND rail_reference = ANY(%(refs)s)
UNION
SELECT id, charge_id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM refunds WHERE rail = %(rail)s AND id = ANY(%(refs)s)
UNION
SELECT id, charge_id, rail_reference, rail_transaction_id, amount, currency, status, failure_code, created_at
  FROM refunds WHERE rail = %(rail)s AND rail_transaction_id = ANY(%(txids)s);

-- name: charge_successes_in_period
-- The successes of ours a statement covering [start, end] must list. Our
-- created_at precedes the rail's time for the same transaction, so a charge
-- created inside the period is inside it at the rail too.
SELECT id, rail_reference, rail_transaction_id, amount, currency, created_at
  FROM charges
 WHERE rail = %(rail)s AND status = 'succeeded'
   AND created_at >= %(start)s AND created_at <= %(end)s
 ORDER BY created_at, id;

-- name: refund_successes_in_period
SELECT id, charge_id, rail_reference, rail_transaction_id, amount, currency, created_at
  FROM refunds
 WHERE rail = %(rail)s AND status = 'succeeded'
   AND created_at >= %(start)s AND created_at <= %(end)s
 ORDER BY created_at, id;

-- name: insert_statement_alert
-- One alert per finding (alerts_one_per_statement_finding; a contradiction
-- also meets alerts_one_open_contradiction): an overlapping statement adds
-- nothing. Answers a row only when this call wrote it.
INSERT INTO alerts (kind, charge_id, refund_id, details)
VALUES (%(kind)s, %(charge_id)s, %(refund_id)s, %(details)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: list_statements
SELECT id, rail, file_name, profile, period_start, period_end, line_count, report, imported_at
  FROM statements
 ORDER BY imported_at DESC, id
 LIMIT %(limit)s;

-- name: load_statement
SELECT * FROM statements WHERE id = %(id)s;

-- name: lines_of_statement
SELECT * FROM statement_lines
 WHERE statement_id = %(id)s AND (%(exceptions_only)s = false OR outcome IN
       ('contradiction', 'unknown_rail_transaction', 'error'))
 ORDER BY line_no;

-- name: list_charges_by_status
-- The operator's list (charges list): ages by the database's clock; an
-- alert is open until acknowledged.
SELECT c.id, c.payment_intent_id, c.rail, c.rail_reference, c.payer, c.amount, c.currency, c.status,
       c.created_at, c.unresolved_at, c.last_polled_at,
       EXTRACT(EPOCH FROM now() - c.created_at)::float8 AS age_seconds,
       (SELECT count(*) FROM alerts a WHERE a.charge_id = c.id AND a.acknowledged_at IS NULL) AS open_alerts,
       -- a dead-lettered poll (run_at infinity) has no next read; a settled
       -- charge has neither a next read nor a rail answer to show (a poll
       -- row left behind, e.g. settled by a statement, is not its state)
       CASE WHEN c.status IN ('pending', 'unresolved') THEN nullif(j.run_at, 'infinity') END AS next_poll,
       coalesce(c.status IN ('pending', 'unresolved') AND j.run_at = 'infinity', false) AS poll_dead,
       CASE WHEN c.status IN ('pending', 'unresolved') THEN j.last_error END AS last_error
  FROM charges c LEFT JOIN jobs j ON j.dedupe_key = 'poll:' || c.id
 WHERE c.status = %(status)s
   AND c.created_at <= now() - make_interval(secs => %(older_than)s)
 ORDER BY c.created_at, c.id
 LIMIT %(limit)s;

-- name: lock_charge_for_resolve
-- charges resolve: the charge row is locked first, so the rule it checks
-- (unresolved, or pending with an open alert) still holds when it settles.
SELECT c.id, c.status,
       EXISTS (SELECT 1 FROM alerts a WHERE a.charge_id = c.id AND a.acknowledged_at IS NULL) AS has_open_alert
  FROM charges c
 WHERE c.id = %(id)s
   FOR UPDATE OF c;

-- name: evidence_of_charge
SELECT id, outcome, source, statement_id, line_no, evidence, created_at
  FROM settlement_evidence WHERE charge_id = %(id)s;

-- name: complete_statement
-- The last step of --apply: every batch is in; the stored report is final.
UPDATE statements SET report = %(report)s, completed_at = now() WHERE id = %(id)s;

-- name: statement_import_lock
-- One --apply per rail at a time (a session lock, released with the
-- connection): two imports settling the same charges in different orders
-- could deadlock. Answers false when another import holds it.
SELECT pg_try_advisory_lock(hashtext('vpay.statements.apply'), hashtext(%(rail)s));

-- name: statement_import_unlock
SELECT pg_advisory_unlock(hashtext('vpay.statements.apply'), hashtext(%(rail)s));

-- name: statement_lines_to_settle
-- The next batch of a statement's lines still to settle, in the order their
-- charges (refunds) are locked: by id, so two writers never wait on each
-- other in a cycle. Lines skipped this round (a poll held their row) are
-- passed back in %(skip)s.
SELECT line_no, charge_id, refund_id, settle_to, status_text, amount_text, currency, reference,
       rail_transaction_id, line_time, reason
  FROM statement_lines
 WHERE statement_id = %(id)s AND outcome = 'would_settle'
   AND NOT (line_no = ANY(%(skip)s))
 ORDER BY coalesce(charge_id, refund_id), line_no
 LIMIT %(limit)s;

-- name: lock_charges_for_batch
-- SKIP LOCKED: a charge a poll is settling right now is left to a later
-- batch; the import never waits on a poll, and a poll waits at most one batch.
SELECT id FROM charges WHERE id = ANY(%(ids)s) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED;

-- name: lock_refunds_for_batch
SELECT id FROM refunds WHERE id = ANY(%(ids)s) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED;

-- name: set_line_outcome
UPDATE statement_lines SET outcome = %(outcome)s, detail = %(detail)s
 WHERE statement_id = %(id)s AND line_no = %(line_no)s;

-- name: statement_summary
-- Counts and amounts (minor units) per outcome and currency, from the lines.
SELECT outcome, currency, count(*) AS n, sum(amount) AS amount
  FROM statement_lines WHERE statement_id = %(id)s
 GROUP BY outcome, currency;
