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

-- ---- the import's working tables (vpay/statements/matcher.py) -------------------
-- A statement's lines are spooled into temporary tables of the importing
-- session as they are read (COPY), then grouped and judged from there in
-- bounded chunks: the importer's memory does not grow with the file.
-- Temporary tables are never WAL-logged and vanish with the session.

-- name: statement_work_drop
DROP TABLE IF EXISTS pg_temp.statement_spool, pg_temp.statement_found, pg_temp.statement_unknown,
                     pg_temp.statement_judged;

-- name: statement_spool_create
-- One row per line as read (lines.Line); ref_key / tx_key: lines.canonical.
CREATE TEMP TABLE statement_spool (
    line_no integer NOT NULL, kind text, reference text, rail_transaction_id text, ref_key text,
    tx_key text, msisdn text, amount_text text, amount bigint, currency text, status_text text,
    status text, line_time timestamptz, reason text, error text
);

-- name: statement_found_create
-- The charge or refund each line names, with what the line is compared to
-- (read once: the snapshot the set-wise judgement uses). No index: every
-- join on it is a hash join over all of it.
CREATE TEMP TABLE statement_found (line_no integer NOT NULL, kind text NOT NULL, id text NOT NULL,
                                   status text, amount bigint, currency text);

-- name: statement_unknown_create
CREATE TEMP TABLE statement_unknown (line_no integer PRIMARY KEY, ref_key text, tx_key text,
                                     label integer NOT NULL);

-- name: statement_judged_create
-- One row per judged line: statement_lines' columns, and the alert it raises.
CREATE TEMP TABLE statement_judged (
    line_no integer NOT NULL, kind text, reference text, rail_transaction_id text, msisdn text,
    amount_text text, amount bigint, currency text, status_text text, line_time timestamptz,
    outcome text NOT NULL, charge_id text, refund_id text, detail text, settle_to text, reason text,
    alert_kind text, alert_charge_id text, alert_refund_id text, alert_details jsonb
);

-- name: statement_spool_analyze
-- Temporary tables are never analyzed by autovacuum: without statistics the
-- joins below are planned for a handful of rows.
ANALYZE pg_temp.statement_spool;

-- name: statement_found_analyze
ANALYZE pg_temp.statement_found;

-- name: statement_spool_largest_gap
-- The largest gap between consecutive readable line times, and its place k
-- (k lines lie before it, in time order); ties: the latest
-- (matcher._refuse_strays). Over the distinct times with their counts: a
-- statement's lines share times (a second, a day), so the sort is short.
WITH t AS (SELECT line_time, count(*) AS n FROM pg_temp.statement_spool WHERE error IS NULL GROUP BY line_time),
     g AS (SELECT sum(n) OVER w AS k, lead(line_time) OVER w - line_time AS gap FROM t
           WINDOW w AS (ORDER BY line_time ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
SELECT gap, k FROM g WHERE gap IS NOT NULL ORDER BY gap DESC, k DESC LIMIT 1;

-- name: statement_spool_time_at
-- The readable line at place k of the time order (as above).
SELECT line_time, line_no FROM pg_temp.statement_spool WHERE error IS NULL
 ORDER BY line_time, line_no OFFSET %(k)s - 1 LIMIT 1;

-- name: statement_spool_any_within
-- Does a declared or given period hold any readable line's time?
SELECT EXISTS (SELECT 1 FROM pg_temp.statement_spool
                WHERE error IS NULL AND line_time BETWEEN %(start)s AND %(end)s);

-- name: statement_resolve
-- The charge or refund each line names, as matcher._find did per line: a
-- line's own kind first (no kind: a charge first), by its reference (the
-- reference we sent, our own id, the first N hex digits of the reference on
-- the rails in matcher.PREFIX_REFERENCES) before the rail's transaction id.
-- prio: 2 for the other kind, +1 for the transaction id; the lowest wins.
-- Set-wise (hash joins): one pass over the lines, not one query per chunk.
INSERT INTO pg_temp.statement_found (line_no, kind, id, status, amount, currency)
SELECT DISTINCT ON (line_no) line_no, kind, id, status, amount, currency FROM (
    SELECT s.line_no, 'charge' AS kind, c.id, c.status, c.amount, c.currency,
           CASE WHEN s.kind = 'refund' THEN 2 ELSE 0 END AS prio
      FROM pg_temp.statement_spool s JOIN charges c ON c.rail = %(rail)s AND c.rail_reference = s.reference
    UNION ALL
    SELECT s.line_no, 'charge', c.id, c.status, c.amount, c.currency, CASE WHEN s.kind = 'refund' THEN 2 ELSE 0 END
      FROM pg_temp.statement_spool s JOIN charges c ON c.rail = %(rail)s AND c.rail_reference = s.ref_key
     WHERE s.ref_key <> s.reference
    UNION ALL
    SELECT s.line_no, 'charge', c.id, c.status, c.amount, c.currency, CASE WHEN s.kind = 'refund' THEN 2 ELSE 0 END
      FROM pg_temp.statement_spool s JOIN charges c ON c.rail = %(rail)s AND c.id = s.ref_key
     WHERE left(s.ref_key, 3) = 'ch_'
    UNION ALL
    SELECT s.line_no, 'charge', c.id, c.status, c.amount, c.currency, CASE WHEN s.kind = 'refund' THEN 2 ELSE 0 END
      FROM pg_temp.statement_spool s JOIN charges c
        ON c.rail = %(rail)s AND lower(left(replace(c.rail_reference, '-', ''), %(prefix)s)) = s.ref_key
     WHERE %(prefix)s > 0
    UNION ALL
    SELECT s.line_no, 'charge', c.id, c.status, c.amount, c.currency, CASE WHEN s.kind = 'refund' THEN 3 ELSE 1 END
      FROM pg_temp.statement_spool s JOIN charges c
        ON c.rail = %(rail)s AND c.rail_transaction_id = s.rail_transaction_id
    UNION ALL
    SELECT s.line_no, 'charge', c.id, c.status, c.amount, c.currency, CASE WHEN s.kind = 'refund' THEN 3 ELSE 1 END
      FROM pg_temp.statement_spool s JOIN charges c ON c.rail = %(rail)s AND c.rail_transaction_id = s.tx_key
     WHERE s.tx_key <> s.rail_transaction_id
    UNION ALL
    SELECT s.line_no, 'refund', r.id, r.status, r.amount, r.currency, CASE WHEN s.kind = 'refund' THEN 0 ELSE 2 END
      FROM pg_temp.statement_spool s JOIN refunds r ON r.rail = %(rail)s AND r.rail_reference = s.reference
    UNION ALL
    SELECT s.line_no, 'refund', r.id, r.status, r.amount, r.currency, CASE WHEN s.kind = 'refund' THEN 0 ELSE 2 END
      FROM pg_temp.statement_spool s JOIN refunds r ON r.rail = %(rail)s AND r.rail_reference = s.ref_key
     WHERE s.ref_key <> s.reference
    UNION ALL
    SELECT s.line_no, 'refund', r.id, r.status, r.amount, r.currency, CASE WHEN s.kind = 'refund' THEN 0 ELSE 2 END
      FROM pg_temp.statement_spool s JOIN refunds r ON r.rail = %(rail)s AND r.id = s.ref_key
     WHERE left(s.ref_key, 3) = 're_'
    UNION ALL
    SELECT s.line_no, 'refund', r.id, r.status, r.amount, r.currency, CASE WHEN s.kind = 'refund' THEN 1 ELSE 3 END
      FROM pg_temp.statement_spool s JOIN refunds r
        ON r.rail = %(rail)s AND r.rail_transaction_id = s.rail_transaction_id
    UNION ALL
    SELECT s.line_no, 'refund', r.id, r.status, r.amount, r.currency, CASE WHEN s.kind = 'refund' THEN 1 ELSE 3 END
      FROM pg_temp.statement_spool s JOIN refunds r ON r.rail = %(rail)s AND r.rail_transaction_id = s.tx_key
     WHERE s.tx_key <> s.rail_transaction_id
) m
ORDER BY line_no, prio, id;

-- name: statement_judge_matched
-- The common line judged set-wise: the only line naming a charge (refund)
-- of ours that is settled the same way, with the same amount and currency,
-- is ``matched`` (matcher._judge's first rule; a failure without an amount,
-- and every other case, are judged in Python). Most of a statement's lines
-- never travel back to the importer.
INSERT INTO pg_temp.statement_judged (line_no, kind, reference, rail_transaction_id, msisdn, amount_text, amount,
                                      currency, status_text, line_time, outcome, charge_id, refund_id, detail,
                                      reason)
SELECT s.line_no, f.kind, s.reference, s.rail_transaction_id, s.msisdn, s.amount_text, s.amount, s.currency,
       s.status_text, s.line_time, 'matched', CASE WHEN f.kind = 'charge' THEN f.id END,
       CASE WHEN f.kind = 'refund' THEN f.id END, f.status, s.reason
  FROM pg_temp.statement_found f
  JOIN pg_temp.statement_spool s ON s.line_no = f.line_no
 WHERE s.error IS NULL AND (s.kind IS NULL OR s.kind = f.kind)
   AND s.status IN ('succeeded', 'failed') AND s.status = f.status
   AND s.currency = f.currency AND s.amount = f.amount
   AND NOT EXISTS (SELECT 1 FROM pg_temp.statement_found o
                    WHERE o.kind = f.kind AND o.id = f.id AND o.line_no <> f.line_no);

-- name: statement_work_settings
-- The import's queries sort and hash whole statements: in memory rather
-- than in temporary files (the server's memory, for this transaction only);
-- no JIT compilation for queries run once.
SELECT set_config('work_mem', '64MB', true), set_config('jit', 'off', true);

-- name: statement_unknown_fill
-- Readable lines naming nothing of ours: grouped by the identifiers they
-- share (below), each its own group to begin with.
INSERT INTO pg_temp.statement_unknown (line_no, ref_key, tx_key, label)
SELECT s.line_no, s.ref_key, s.tx_key, s.line_no FROM pg_temp.statement_spool s
 WHERE s.error IS NULL AND NOT EXISTS (SELECT 1 FROM pg_temp.statement_found f WHERE f.line_no = s.line_no);

-- name: statement_unknown_step
-- One step of connected components: a line takes the lowest label of the
-- lines sharing its reference or its transaction id (two namespaces, as
-- the rail writes them). Repeated until nothing changes, every line of a
-- group carries the group's first line number.
UPDATE pg_temp.statement_unknown u SET label = m.label
  FROM (SELECT line_no,
               least(label,
                     CASE WHEN ref_key IS NOT NULL THEN min(label) OVER (PARTITION BY ref_key) END,
                     CASE WHEN tx_key IS NOT NULL THEN min(label) OVER (PARTITION BY tx_key) END) AS label
          FROM pg_temp.statement_unknown) m
 WHERE m.line_no = u.line_no AND m.label < u.label;

-- name: statement_spool_groups
-- Every line not judged yet (statement_judge_matched) with what it names, one group after another (a charge or
-- refund of ours; a group of unknown lines; an unreadable unknown line
-- alone), each group in file order.
SELECT s.line_no, s.kind, s.reference, s.rail_transaction_id, s.msisdn, s.amount_text, s.amount,
       s.currency, s.status_text, s.status, s.line_time, s.reason, s.error,
       f.kind AS subject_kind, coalesce(c.id, r.id) AS subject_id, r.charge_id AS subject_charge_id,
       coalesce(c.rail_reference, r.rail_reference) AS subject_reference,
       coalesce(c.rail_transaction_id, r.rail_transaction_id) AS subject_transaction_id,
       coalesce(c.amount, r.amount) AS subject_amount, coalesce(c.currency, r.currency) AS subject_currency,
       coalesce(c.status, r.status) AS subject_status,
       coalesce(c.failure_code, r.failure_code) AS subject_failure_code,
       CASE WHEN f.line_no IS NOT NULL THEN 0 WHEN u.line_no IS NOT NULL THEN 1 ELSE 2 END AS grp_kind,
       coalesce(f.kind || ':' || f.id, u.label::text, s.line_no::text) AS grp
  FROM pg_temp.statement_spool s
  LEFT JOIN pg_temp.statement_found f ON f.line_no = s.line_no
  LEFT JOIN charges c ON f.kind = 'charge' AND c.id = f.id
  LEFT JOIN refunds r ON f.kind = 'refund' AND r.id = f.id
  LEFT JOIN pg_temp.statement_unknown u ON u.line_no = s.line_no
 WHERE NOT EXISTS (SELECT 1 FROM pg_temp.statement_judged j WHERE j.line_no = s.line_no)
 ORDER BY grp_kind, grp, s.line_no;

-- name: statement_judged_summary
SELECT outcome, currency, count(*) AS n, sum(amount) AS amount
  FROM pg_temp.statement_judged GROUP BY outcome, currency;

-- name: statement_judged_exceptions
SELECT line_no, outcome, kind, reference, rail_transaction_id, msisdn, amount, amount_text, currency,
       status_text, line_time, charge_id, refund_id, detail
  FROM pg_temp.statement_judged
 WHERE outcome IN ('contradiction', 'unknown_rail_transaction', 'error')
 ORDER BY line_no;

-- name: statement_judged_to_settle
SELECT count(*) FROM pg_temp.statement_judged WHERE outcome = 'would_settle';

-- name: statement_lines_from_judged
-- The record (importer step 1): the judged lines become the statement's.
INSERT INTO statement_lines (statement_id, line_no, kind, reference, rail_transaction_id, msisdn, amount_text,
                             amount, currency, status_text, line_time, outcome, charge_id, refund_id, detail,
                             settle_to, reason)
SELECT %(id)s, line_no, kind, reference, rail_transaction_id, msisdn, amount_text, amount, currency,
       status_text, line_time, outcome, charge_id, refund_id, detail, settle_to, reason
  FROM pg_temp.statement_judged ORDER BY line_no;

-- name: statement_alerts_from_judged
-- The lines' alerts, in file order, each raised once
-- (alerts_one_per_statement_finding); answers those this call wrote.
INSERT INTO alerts (kind, charge_id, refund_id, details)
SELECT alert_kind, alert_charge_id, alert_refund_id,
       alert_details || jsonb_build_object('statement_id', %(id)s::text)
  FROM pg_temp.statement_judged WHERE alert_kind IS NOT NULL ORDER BY line_no
ON CONFLICT DO NOTHING
RETURNING kind, charge_id, refund_id, details ->> 'finding';

-- name: charge_successes_absent
-- The successes of ours a statement covering [start, end] must list, less
-- the charges its lines name. Our created_at precedes the rail's time for the
-- same transaction, so a charge created inside the period is inside it at
-- the rail too.
SELECT id, rail_reference, rail_transaction_id, amount, currency, created_at
  FROM charges c
 WHERE rail = %(rail)s AND status = 'succeeded'
   AND created_at >= %(start)s AND created_at <= %(end)s
   AND NOT EXISTS (SELECT 1 FROM pg_temp.statement_found f WHERE f.kind = 'charge' AND f.id = c.id)
 ORDER BY created_at, id;

-- name: refund_successes_absent
SELECT id, charge_id, rail_reference, rail_transaction_id, amount, currency, created_at
  FROM refunds r
 WHERE rail = %(rail)s AND status = 'succeeded'
   AND created_at >= %(start)s AND created_at <= %(end)s
   AND NOT EXISTS (SELECT 1 FROM pg_temp.statement_found f WHERE f.kind = 'refund' AND f.id = r.id)
 ORDER BY created_at, id;
