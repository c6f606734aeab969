-- The operator console (vpay/console/, vpay/money/audit.py, vpay/money/proposals.py,
-- vpay/console/accounts.py): operators, sessions, the audit trail, the rail-call
-- log, maker-checker proposals and the pages' reads. Every list is bounded
-- (LIMIT) and keyset-paginated: no page reads a table whole.

-- name: audit_insert
INSERT INTO operator_actions (actor, action, target, note, result, via)
VALUES (%(actor)s, %(action)s, %(target)s, %(note)s, %(result)s, %(via)s)
RETURNING id;

-- name: audit_list
SELECT id, actor, action, target, note, result, via, created_at
  FROM operator_actions
 WHERE (%(actor)s::text IS NULL OR actor = %(actor)s)
   AND (%(action)s::text IS NULL OR action = %(action)s)
   AND (%(target)s::text IS NULL OR target = %(target)s)
   AND (%(before)s::bigint IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: audit_of_targets
SELECT id, actor, action, target, note, result, via, created_at
  FROM operator_actions
 WHERE target = ANY(%(targets)s)
 ORDER BY created_at, id
 LIMIT 200;

-- name: operator_insert
INSERT INTO operators (email, role, password_hash)
VALUES (%(email)s, %(role)s, %(hash)s)
RETURNING id, email, role, created_at, disabled_at;

-- name: operator_list
SELECT id, email, role, created_at, disabled_at
  FROM operators
 ORDER BY id
 LIMIT %(limit)s;

-- name: operator_by_email
SELECT id, email, role, password_hash, disabled_at
  FROM operators
 WHERE lower(email) = lower(%(email)s);

-- name: operator_set_hash
UPDATE operators SET password_hash = %(hash)s WHERE id = %(id)s;

-- name: operator_disable
-- Disabled: cannot sign in, and every session of theirs ends now.
WITH off AS (
    UPDATE operators SET disabled_at = coalesce(disabled_at, now())
     WHERE lower(email) = lower(%(email)s)
    RETURNING id, email, role, created_at, disabled_at
), gone AS (
    DELETE FROM operator_sessions s USING off WHERE s.operator_id = off.id
)
SELECT * FROM off;

-- name: session_insert
INSERT INTO operator_sessions (id_sha256, operator_id, csrf_token, address)
VALUES (%(sha)s, %(operator_id)s, %(csrf)s, %(address)s);

-- name: session_load
-- A live session: its operator enabled, not idle past %(idle)s seconds, not
-- older than %(max)s seconds. Seen now (the idle clock restarts).
UPDATE operator_sessions s
   SET seen_at = now()
  FROM operators o
 WHERE s.id_sha256 = %(sha)s AND o.id = s.operator_id AND o.disabled_at IS NULL
   AND s.seen_at > now() - make_interval(secs => %(idle)s)
   AND s.created_at > now() - make_interval(secs => %(max)s)
RETURNING o.id AS operator_id, o.email, o.role, s.csrf_token, s.created_at;

-- name: session_delete
DELETE FROM operator_sessions WHERE id_sha256 = %(sha)s;

-- name: session_prune
DELETE FROM operator_sessions
 WHERE seen_at < now() - make_interval(secs => %(idle)s)
    OR created_at < now() - make_interval(secs => %(max)s);

-- name: login_failures_recent
-- Failed sign-ins in the window, for this account and for this address.
SELECT (SELECT count(*) FROM login_failures
         WHERE lower(email) = lower(%(email)s) AND created_at > now() - make_interval(secs => %(window)s))
           AS by_account,
       (SELECT count(*) FROM login_failures
         WHERE address = %(address)s AND created_at > now() - make_interval(secs => %(window)s))
           AS by_address;

-- name: login_failure_insert
INSERT INTO login_failures (email, address) VALUES (left(%(email)s, 254), %(address)s);

-- name: login_failures_clear
DELETE FROM login_failures WHERE lower(email) = lower(%(email)s);

-- name: rail_call_insert
-- paused_seconds: the pause a 429/503 with Retry-After imposed (else NULL).
INSERT INTO rail_calls (rail, operation, reference, charge_id, refund_id, http_status, answer, reason,
                        latency_ms, paused_until)
VALUES (%(rail)s, %(operation)s, %(reference)s, %(charge_id)s, %(refund_id)s, %(http_status)s,
        %(answer)s, left(%(reason)s, 500), %(latency_ms)s,
        now() + make_interval(secs => %(paused_seconds)s::float8));

-- name: rail_calls_insert_batch
-- Many rail calls in one statement (the worker's BatchedRecorder,
-- vpay/rails/calls.py; issue 30): %(calls)s is a JSON array of rail_call_insert's
-- fields plus age, the seconds since the call ended, so that created_at (and
-- paused_until) are the database's clock at the call, as rail_call_insert's
-- now() would have been, not at the batch's write.
INSERT INTO rail_calls (rail, operation, reference, charge_id, refund_id, http_status, answer, reason,
                        latency_ms, paused_until, created_at)
SELECT c.rail, c.operation, c.reference, c.charge_id, c.refund_id, c.http_status, c.answer,
       left(c.reason, 500), c.latency_ms,
       now() - make_interval(secs => c.age) + make_interval(secs => c.paused_seconds),
       now() - make_interval(secs => c.age)
  FROM jsonb_to_recordset(%(calls)s) AS c(rail text, operation text, reference text, charge_id text,
                                          refund_id text, http_status integer, answer text,
                                          reason text, latency_ms integer, paused_seconds float8,
                                          age float8);

-- name: rail_callback_insert
INSERT INTO rail_callbacks (rail, reference, charge_id, action)
VALUES (%(rail)s, left(%(reference)s, 200), %(charge_id)s, %(action)s);

-- name: rail_callbacks_of_charge
SELECT id, rail, reference, action, created_at
  FROM rail_callbacks
 WHERE charge_id = %(charge_id)s
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: rail_callbacks_of_reference
-- Callbacks naming a reference (the payments search, when no charge matches).
SELECT count(*) AS n, max(created_at) AS last_at,
       count(*) FILTER (WHERE charge_id IS NULL) AS unknown
  FROM (SELECT charge_id, created_at FROM rail_callbacks WHERE reference = %(reference)s
         ORDER BY created_at DESC LIMIT 1000) r;

-- name: rail_calls_of_charge
SELECT id, rail, operation, reference, http_status, answer, reason, latency_ms, created_at
  FROM rail_calls
 WHERE charge_id = %(charge_id)s
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: console_prune
-- Retention of the console's own tables (the hourly sweep, VPAY_RETENTION_DAYS):
-- rail calls, callbacks and finished sign-in failures past it; samples past two days.
WITH cutoff AS (SELECT now() - make_interval(secs => %(days)s * 86400.0) AS t),
calls AS (DELETE FROM rail_calls r USING cutoff WHERE r.created_at < cutoff.t RETURNING 1),
callbacks AS (DELETE FROM rail_callbacks r USING cutoff WHERE r.created_at < cutoff.t RETURNING 1),
fails AS (DELETE FROM login_failures f USING cutoff WHERE f.created_at < cutoff.t RETURNING 1),
samples AS (DELETE FROM console_samples WHERE sampled_at < now() - interval '2 days' RETURNING 1),
figures AS (DELETE FROM console_figures WHERE sampled_at < now() - interval '2 days' RETURNING 1)
SELECT (SELECT count(*) FROM calls) AS rail_calls, (SELECT count(*) FROM callbacks) AS rail_callbacks,
       (SELECT count(*) FROM fails) AS login_failures,
       (SELECT count(*) FROM samples) AS console_samples, (SELECT count(*) FROM figures) AS console_figures;

-- name: proposal_insert
INSERT INTO resolution_proposals (charge_id, outcome, evidence, proposed_by)
VALUES (%(charge_id)s, %(outcome)s, %(evidence)s, %(actor)s)
RETURNING id, charge_id, outcome, evidence, proposed_by, proposed_at, state;

-- name: proposal_lock
SELECT id, charge_id, outcome, evidence, proposed_by, proposed_at, state, decided_by, decided_at,
       decision_note
  FROM resolution_proposals WHERE id = %(id)s FOR UPDATE;

-- name: proposal_decide
UPDATE resolution_proposals
   SET state = %(state)s, decided_by = %(actor)s, decided_at = now(), decision_note = %(note)s
 WHERE id = %(id)s AND state = 'open'
RETURNING id, charge_id, outcome, evidence, proposed_by, proposed_at, state, decided_by, decided_at,
          decision_note;

-- name: proposals_of_charges
SELECT id, charge_id, outcome, evidence, proposed_by, proposed_at, state, decided_by, decided_at,
       decision_note
  FROM resolution_proposals
 WHERE charge_id = ANY(%(ids)s)
 ORDER BY proposed_at, id;

-- name: console_unresolved
-- The workbench: unresolved charges and pending ones with an open alert,
-- oldest first, keyset by (created_at, id); the last rail call's answer and
-- the statement lines that mention the reference.
SELECT c.id, c.payment_intent_id, c.rail, c.rail_reference, c.amount, c.currency, c.status,
       c.created_at, extract(epoch FROM now() - c.created_at) AS age_seconds,
       (SELECT r.answer || coalesce(' ' || r.http_status, '') || coalesce(': ' || r.reason, '')
          FROM rail_calls r WHERE r.charge_id = c.id ORDER BY r.created_at DESC, r.id DESC LIMIT 1)
         AS last_answer,
       (SELECT j.last_error FROM jobs j WHERE j.dedupe_key = 'poll:' || c.id) AS last_error,
       (SELECT count(*) FROM statement_lines l WHERE l.charge_id = c.id OR l.reference = c.rail_reference)
         AS statement_lines,
       (SELECT p.id FROM resolution_proposals p WHERE p.charge_id = c.id AND p.state = 'open')
         AS open_proposal
  FROM charges c
 WHERE c.status IN ('pending', 'unresolved')
   AND (c.status = 'unresolved'
        OR EXISTS (SELECT 1 FROM alerts a WHERE a.charge_id = c.id AND a.acknowledged_at IS NULL))
   AND (%(after_created)s::timestamptz IS NULL OR (c.created_at, c.id) > (%(after_created)s, %(after_id)s))
 ORDER BY c.created_at, c.id
 LIMIT %(limit)s;

-- name: console_statement_lines_of_charge
SELECT l.statement_id, l.line_no, l.reference, l.rail_transaction_id, l.msisdn, l.amount_text,
       l.currency, l.status_text, l.line_time, l.outcome
  FROM statement_lines l
 WHERE l.charge_id = %(charge_id)s OR l.reference = %(reference)s
 ORDER BY l.statement_id, l.line_no
 LIMIT 50;

-- name: console_payment_search
-- One search box (an intent, charge or refund id, a rail reference, a rail
-- transaction id, or a payer's MSISDN) and filters (status, rail, merchant,
-- created from/to); newest first, keyset on (created_at, id). Run unprepared
-- (vpay.console.pages): each run is planned with its values, so an absent
-- filter folds away and the plan takes the index that filter has
-- (charges_created, charges_status_created, charges_rail_created, the search
-- columns' indexes, or payment_intents_merchant_page for a small merchant).
SELECT c.id, c.payment_intent_id, i.merchant_id, c.rail, c.rail_reference, c.payer, c.amount,
       c.currency, c.status, c.created_at
  FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
 WHERE (%(q)s::text IS NULL
        OR c.id = %(q)s OR c.payment_intent_id = %(q)s OR c.rail_reference = %(q)s
        OR c.rail_transaction_id = %(q)s OR c.payer = %(q)s
        OR c.id = (SELECT r.charge_id FROM refunds r WHERE r.id = %(q)s)
        OR c.id = (SELECT r.charge_id FROM refunds r WHERE r.rail_transaction_id = %(q)s LIMIT 1))
   AND (%(status)s::text IS NULL OR c.status = %(status)s)
   AND (%(rail)s::text IS NULL OR c.rail = %(rail)s)
   AND (%(merchant)s::text IS NULL OR i.merchant_id = %(merchant)s)
   AND (%(since)s::timestamptz IS NULL OR c.created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR c.created_at < %(until)s)
   AND (%(before_created)s::timestamptz IS NULL OR (c.created_at, c.id) < (%(before_created)s, %(before_id)s))
 ORDER BY c.created_at DESC, c.id DESC
 LIMIT %(limit)s;

-- name: console_deliveries_of_events
SELECT d.event_id, d.endpoint_id, w.url, d.status, d.attempts, d.last_status_code, d.last_error,
       d.created_at, d.updated_at, d.delivered_at
  FROM webhook_deliveries d JOIN webhook_endpoints w ON w.id = d.endpoint_id
 WHERE d.event_id = ANY(%(ids)s)
 ORDER BY d.created_at
 LIMIT 200;

-- name: console_alerts_of_charge
SELECT id, kind, details, created_at, acknowledged_at, note
  FROM alerts WHERE charge_id = %(charge_id)s ORDER BY created_at, id LIMIT 100;

-- name: console_refunds_of_charge
SELECT id, rail_reference, amount, currency, status, created_at, settled_at
  FROM refunds WHERE charge_id = %(charge_id)s ORDER BY created_at LIMIT 50;

-- name: console_evidence_of_charge
SELECT id, outcome, source, statement_id, line_no, evidence, created_at
  FROM settlement_evidence WHERE charge_id = %(charge_id)s ORDER BY created_at, id LIMIT 50;

-- name: console_alerts_page
SELECT a.id, a.kind, a.charge_id, a.refund_id, a.details, a.created_at, a.acknowledged_at, a.note
  FROM alerts a
 WHERE (%(state)s::text IS NULL OR (%(state)s = 'open') = (a.acknowledged_at IS NULL))
   AND (%(kind)s::text IS NULL OR a.kind = %(kind)s)
   AND (%(after)s::bigint IS NULL OR a.id > %(after)s)
 ORDER BY a.id
 LIMIT %(limit)s;

-- name: console_jobs_page
-- Dead letters (jobs_dead) or stranded leases (jobs_leased), keyset by id.
SELECT j.id, j.kind, j.lane, j.dedupe_key,
       CASE WHEN j.run_at = 'infinity' THEN 'dead' ELSE 'stranded' END AS state,
       j.attempts, j.failures, j.locked_by, j.lease_expires_at, j.dead_since, j.last_error
  FROM jobs j
 WHERE ((%(state)s = 'dead' AND j.run_at = 'infinity')
        OR (%(state)s = 'stranded' AND j.locked_at IS NOT NULL AND j.lease_expires_at < now()))
   AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
   AND (%(lane)s::text IS NULL OR j.lane = %(lane)s)
   AND (%(after)s::bigint IS NULL OR j.id > %(after)s)
 ORDER BY j.id
 LIMIT %(limit)s;

-- name: console_endpoints_page
SELECT w.id, w.merchant_id, w.url, w.enabled, w.created_at, w.disabled_at, w.disabled_reason,
       w.disabled_cause
  FROM webhook_endpoints w
 WHERE (%(merchant)s::text IS NULL OR w.merchant_id = %(merchant)s)
   AND (%(after)s::text IS NULL OR w.id > %(after)s)
 ORDER BY w.id
 LIMIT %(limit)s;

-- name: console_deliveries_page
SELECT d.event_id, d.endpoint_id, d.status, d.attempts, d.last_status_code, d.last_error,
       d.created_at, d.updated_at
  FROM webhook_deliveries d
 WHERE (%(endpoint)s::text IS NULL OR d.endpoint_id = %(endpoint)s)
   AND (%(event)s::text IS NULL OR d.event_id = %(event)s)
 ORDER BY d.created_at DESC
 LIMIT %(limit)s;

-- name: webhook_redeliver
-- Send an event to an endpoint again: its delivery (made if missing) pending,
-- the deliver job due now with its schedule restarted; a job in flight (leased)
-- is left alone (it is delivering already). Answers the job id, or nothing
-- when the event or endpoint is unknown or the endpoint disabled.
WITH target AS (
    SELECT e.id AS event_id, w.id AS endpoint_id
      FROM events e JOIN payment_intents i ON i.id = e.payment_intent_id
      JOIN webhook_endpoints w ON w.merchant_id = i.merchant_id
     WHERE e.id = %(event_id)s AND w.id = %(endpoint_id)s AND w.enabled
), delivery AS (
    INSERT INTO webhook_deliveries (event_id, endpoint_id)
    SELECT event_id, endpoint_id FROM target
    ON CONFLICT (event_id, endpoint_id) DO UPDATE SET status = 'pending', updated_at = now()
    RETURNING event_id, endpoint_id
)
INSERT INTO jobs (kind, lane, dedupe_key, payload)
SELECT 'deliver', 'webhooks', 'deliver:' || event_id || ':' || endpoint_id,
       jsonb_build_object('event_id', event_id, 'endpoint_id', endpoint_id)
  FROM delivery
ON CONFLICT (dedupe_key) DO UPDATE SET run_at = now(), failures = 0, attempts = 0
 WHERE jobs.locked_at IS NULL
RETURNING id;

-- name: console_lane_depth
-- Per lane: due now (counted up to 10,001: the page says "over 10,000"),
-- leased, dead, and the oldest due job's age (seconds). Due jobs through the
-- claim's own indexes (jobs_claimable_lane for share round 0,
-- jobs_over_share beyond), leased through jobs_leased, dead through jobs_dead.
SELECT l.lane,
       (SELECT count(*) FROM (SELECT 1 FROM jobs j
                               WHERE j.lane = l.lane AND j.locked_at IS NULL AND j.run_at <> 'infinity'
                                 AND j.share_round = 0 AND j.run_at <= now() LIMIT 10001) d0)
       + (SELECT count(*) FROM (SELECT 1 FROM jobs j
                                 WHERE j.lane = l.lane AND j.locked_at IS NULL AND j.run_at <> 'infinity'
                                   AND j.share_round > 0 AND j.run_at <= now() LIMIT 10001) d1) AS due,
       (SELECT count(*) FROM jobs j WHERE j.lane = l.lane AND j.locked_at IS NOT NULL) AS leased,
       (SELECT count(*) FROM jobs j WHERE j.lane = l.lane AND j.run_at = 'infinity') AS dead,
       extract(epoch FROM now() - least(
           (SELECT min(j.run_at) FROM jobs j WHERE j.lane = l.lane AND j.locked_at IS NULL
               AND j.run_at <> 'infinity' AND j.share_round = 0 AND j.run_at <= now()),
           (SELECT min(j.run_at) FROM jobs j WHERE j.lane = l.lane AND j.locked_at IS NULL
               AND j.run_at <> 'infinity' AND j.share_round > 0 AND j.run_at <= now())))::float8
         AS oldest_due_seconds
  FROM unnest(%(lanes)s::text[]) AS l(lane);

-- name: console_sample_insert
INSERT INTO console_samples (lane, due, leased, dead, oldest_due_seconds)
SELECT lane, due, leased, dead, oldest_due_seconds FROM jsonb_to_recordset(%(rows)s::jsonb)
    AS x(lane text, due int, leased int, dead int, oldest_due_seconds double precision)
ON CONFLICT DO NOTHING;

-- name: console_samples_recent
SELECT sampled_at, lane, due, leased, dead, oldest_due_seconds
  FROM console_samples
 WHERE sampled_at > now() - interval '24 hours'
 ORDER BY sampled_at, lane
 LIMIT 6000;

-- name: console_charges_by_status
-- The overview's payments by status, each counted up to 10,001 (the page
-- says "over 10,000"): the live ones now (few, by the reconciler's design;
-- a backlog costs at most the cap), the terminal ones settled in the last 24
-- hours (through charges_settled, which carries the status); a count of
-- every terminal charge ever would read the table whole.
SELECT (SELECT count(*) FROM (SELECT 1 FROM charges WHERE status = 'pending' LIMIT 10001) p) AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM charges WHERE status = 'unresolved' LIMIT 10001) u) AS unresolved,
       (SELECT count(*) FROM (SELECT 1 FROM charges WHERE settled_at > now() - interval '24 hours'
                                 AND status = 'succeeded' LIMIT 10001) s) AS succeeded,
       (SELECT count(*) FROM (SELECT 1 FROM charges WHERE settled_at > now() - interval '24 hours'
                                 AND status = 'failed' LIMIT 10001) f) AS failed;

-- name: console_open_alerts_by_kind
-- Through alerts_open_kind (open alerts only).
SELECT kind, count(*) AS n FROM alerts WHERE acknowledged_at IS NULL GROUP BY kind ORDER BY kind;

-- name: console_figures_insert
-- The overview's figures for the minute (console_figures): status reads due
-- and the most overdue one's lateness (through jobs_claimable), charges
-- settled since the last sample (at most 10 minutes back; through
-- charges_settled) and their settle time, workers alive (console_workers).
WITH since AS (
    SELECT greatest(coalesce(max(sampled_at), now() - interval '1 minute'), now() - interval '10 minutes') AS t
      FROM console_figures WHERE sampled_at > now() - interval '10 minutes'
), polls AS (
    SELECT count(*) AS n, extract(epoch FROM now() - min(j.run_at))::float8 AS late
      FROM jobs j
     WHERE j.kind = ANY(%(poll_kinds)s) AND j.run_at <= now() AND j.locked_at IS NULL AND j.run_at <> 'infinity'
), settled AS (
    SELECT count(*) AS n,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM c.settled_at - c.created_at)::float8) AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM c.settled_at - c.created_at)::float8) AS p95
      FROM charges c, since
     WHERE c.settled_at > since.t AND c.settled_at <= now()
)
INSERT INTO console_figures (polls_due, poll_late_seconds, settled, settle_p50_seconds, settle_p95_seconds, workers)
SELECT polls.n, polls.late, settled.n, settled.p50, settled.p95, %(workers)s
  FROM polls, settled
ON CONFLICT DO NOTHING;

-- name: console_figures_recent
SELECT sampled_at, polls_due, poll_late_seconds, settled, settle_p50_seconds, settle_p95_seconds, workers
  FROM console_figures
 WHERE sampled_at > now() - interval '24 hours'
 ORDER BY sampled_at
 LIMIT 1500;

-- name: console_workers
-- The workers table (sql/0024_workers.sql; vpay.engine.workers): live
-- workers, dead ones heard from in the last 24 hours (older rows stay, for
-- `workers list`, until the week's retention), those stopped in the last
-- hour; live first, with the leases each holds now and the latest lease's
-- end (through jobs_leased).
SELECT s.id AS worker_id, s.host, s.pid, s.lanes, s.version, s.started_at, s.heartbeat_age, s.state,
       coalesce(h.leases, 0) AS leases, h.lease_until
  FROM worker_states s
  LEFT JOIN (SELECT locked_by, count(*) AS leases, max(lease_expires_at) AS lease_until
               FROM jobs WHERE locked_at IS NOT NULL GROUP BY locked_by) h ON h.locked_by = s.id
 WHERE s.state = 'live'
    OR (s.stopped_at IS NULL AND s.heartbeat_at > now() - interval '24 hours')
    OR s.stopped_at > now() - interval '1 hour'
 ORDER BY s.state <> 'live', s.id
 LIMIT 100;

-- name: console_rails_paused
-- Pauses in force as every process honours them (rail_pauses: one row per
-- rail), with how many 429/503 answers asked for a pause still in force
-- (rail_calls, through rail_calls_paused).
SELECT p.rail, p.paused_until, p.reason, p.set_by, p.set_at,
       (SELECT count(*) FROM rail_calls x WHERE x.paused_until > now() AND x.rail = p.rail) AS pauses
  FROM rail_pauses p
 WHERE p.paused_until > now()
 ORDER BY p.rail;

-- name: console_rail_health
-- The last 15 minutes per rail (through rail_calls_created): calls, answers
-- that asked for less traffic (429/503), errors (no answer, 5xx), the last
-- of those.
SELECT r.rail, count(*) AS calls,
       count(*) FILTER (WHERE r.http_status IN (429, 503)) AS throttled,
       count(*) FILTER (WHERE r.answer IN ('no_answer', 'error') OR r.http_status >= 500) AS errors,
       max(r.created_at) FILTER (WHERE r.http_status IN (429, 503) OR r.answer IN ('no_answer', 'error')
                                 OR r.http_status >= 500) AS last_trouble
  FROM rail_calls r
 WHERE r.created_at > now() - interval '15 minutes'
 GROUP BY r.rail
 ORDER BY r.rail;

-- name: console_rails_misconfigured
-- Open rail_misconfigured alerts per rail and code (through alerts_open_kind).
SELECT a.details->>'rail' AS rail, a.details->>'code' AS code, count(*) AS n, max(a.created_at) AS last_at
  FROM alerts a
 WHERE a.kind = 'rail_misconfigured' AND a.acknowledged_at IS NULL
 GROUP BY 1, 2
 ORDER BY 1, 2
 LIMIT 50;

-- name: console_disabled_endpoints
SELECT id, merchant_id, url, disabled_at, disabled_reason
  FROM webhook_endpoints WHERE NOT enabled ORDER BY disabled_at DESC NULLS LAST LIMIT 20;

-- name: console_samples_prune
-- The overview's retention: lane samples and minute figures older than two
-- days (docs/console.md, "Retention"); one statement so a sample is one
-- transaction of three statements.
WITH s AS (DELETE FROM console_samples WHERE sampled_at < now() - interval '2 days')
DELETE FROM console_figures WHERE sampled_at < now() - interval '2 days';
