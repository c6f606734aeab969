-- The operator's commands (vpay/money/operator.py; vpay-server jobs, alerts, prune)
-- and the URL-policy hold of webhook endpoints. Every "now" is the database's.

-- name: op_jobs_list
-- state: dead (run_at = infinity), stranded (a lease past its own expiry, or
-- whose holder is gone by its row in workers: dead by its heartbeat, stopped,
-- restarted; lease_holder_gone, sql/0024_workers.sql), leased, due,
-- scheduled. run_at is NULL for a dead letter (infinity has no ISO form).
-- holder_state and heartbeat_age: the holder's row in worker_states (NULL:
-- no row; only the lease's expiry judges it).
SELECT j.id, j.kind, j.lane AS lane, j.dedupe_key,
       CASE WHEN j.run_at = 'infinity' THEN 'dead'
            WHEN j.locked_at IS NOT NULL AND (j.lease_expires_at < now()
                 OR lease_holder_gone(j.locked_by, j.locked_at) IS NOT NULL) THEN 'stranded'
            WHEN j.locked_at IS NOT NULL THEN 'leased'
            WHEN j.run_at <= now() THEN 'due'
            ELSE 'scheduled' END AS state,
       CASE WHEN j.run_at <> 'infinity' THEN j.run_at END AS run_at,
       j.attempts, j.failures, j.locked_by, j.locked_at, j.lease_expires_at,
       CASE WHEN j.locked_at IS NOT NULL THEN coalesce(lease_holder_gone(j.locked_by, j.locked_at), w.state)
            END AS holder_state,
       CASE WHEN j.locked_at IS NOT NULL THEN round(w.heartbeat_age::numeric, 1)::float8 END AS heartbeat_age,
       j.dead_since, j.last_error, j.payload, j.created_at
  FROM jobs j
  LEFT JOIN worker_states w ON j.locked_at IS NOT NULL AND w.id = j.locked_by
 WHERE (NOT %(dead)s OR j.run_at = 'infinity')
   AND (NOT %(stranded)s OR (j.locked_at IS NOT NULL AND (j.lease_expires_at < now()
                             OR lease_holder_gone(j.locked_by, j.locked_at) IS NOT NULL)))
   AND (%(kind)s::text IS NULL OR j.kind = %(kind)s)
   AND (%(lane)s::text IS NULL OR j.lane = %(lane)s)
   AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s))
 ORDER BY j.run_at, j.id
 LIMIT %(limit)s;

-- name: op_jobs_retry
-- A dead letter made due now, its failure streak reset. A deliver job also
-- starts its webhook retry schedule again (its attempts are the schedule's
-- position: without the reset it would get exactly one more try). Its open
-- job_dead_lettered alerts are acknowledged with the operator's note.
WITH retried AS (
    UPDATE jobs
       SET run_at = now(), failures = 0,
           attempts = CASE WHEN kind = 'deliver' THEN 0 ELSE attempts END
     WHERE id = ANY(%(ids)s) AND run_at = 'infinity' AND locked_at IS NULL
    RETURNING id, kind, dedupe_key, attempts, last_error
), acked AS (
    UPDATE alerts a
       SET acknowledged_at = now(), note = %(note)s
      FROM retried
     WHERE a.kind = 'job_dead_lettered' AND a.acknowledged_at IS NULL
       AND a.details ->> 'job_id' = retried.id::text
    RETURNING a.id
)
SELECT id, kind, dedupe_key, attempts, last_error, (SELECT count(*) FROM acked) AS alerts_acknowledged
  FROM retried ORDER BY id;

-- name: op_jobs_release
-- A stranded lease (past its own lease_expires_at, or whose holder is gone:
-- lease_holder_gone) freed by hand, as the reaper would (failures + 1: a job
-- that keeps killing its worker is still bounded), due now. A live lease is
-- never matched: its holder is renewing it and beating its row.
UPDATE jobs
   SET locked_by = NULL, locked_at = NULL, lease_token = NULL, lease_expires_at = NULL,
       failures = failures + 1, run_at = now(),
       last_error = format('lease released by an operator (held by %%s since %%s%%s)', locked_by, locked_at,
                           CASE WHEN lease_expires_at < now() THEN ''
                                ELSE '; holder ' || lease_holder_gone(locked_by, locked_at) END)
 WHERE id = ANY(%(ids)s) AND locked_at IS NOT NULL
   AND (lease_expires_at < now() OR lease_holder_gone(locked_by, locked_at) IS NOT NULL)
RETURNING id, kind, dedupe_key, failures, last_error;

-- name: op_alerts_list
SELECT a.id, a.kind, a.charge_id, a.refund_id, a.details, a.created_at, a.acknowledged_at, a.note
  FROM alerts a
 WHERE (NOT %(open)s OR a.acknowledged_at IS NULL)
   AND (%(kind)s::text IS NULL OR a.kind = %(kind)s)
   AND (%(charge)s::text IS NULL OR a.charge_id = %(charge)s)
   AND (%(ids)s::bigint[] IS NULL OR a.id = ANY(%(ids)s))
 ORDER BY a.created_at, a.id
 LIMIT %(limit)s;

-- name: op_alerts_ack
UPDATE alerts
   SET acknowledged_at = now(), note = %(note)s
 WHERE id = ANY(%(ids)s) AND acknowledged_at IS NULL
RETURNING id, kind, charge_id, refund_id, details, created_at, acknowledged_at, note;

-- name: op_prune
-- Retention (prune --older-than DAYS, and the hourly sweep by
-- VPAY_RETENTION_DAYS): rows finished more than %(days)s days ago. Nothing a
-- live payment needs is touched: an intent with a pending or unresolved
-- charge or refund keeps its events; a live charge's or refund's dead
-- letters and alerts stay; an event with a delivery still pending or held,
-- or a fan-out/delivery job, stays. With %(apply)s false nothing is deleted
-- (the counts are what would be). One statement: one snapshot.
WITH cutoff AS (
    SELECT now() - make_interval(secs => %(days)s * 86400.0) AS t
), live_intent AS (
    SELECT c.payment_intent_id AS id FROM charges c WHERE c.status IN ('pending', 'unresolved')
    UNION
    SELECT c.payment_intent_id FROM refunds r JOIN charges c ON c.id = r.charge_id
     WHERE r.status IN ('pending', 'unresolved')
), live_charge AS (
    SELECT c.id FROM charges c WHERE c.status IN ('pending', 'unresolved')
    UNION
    SELECT r.charge_id FROM refunds r WHERE r.status IN ('pending', 'unresolved')
), deliveries AS (
    SELECT d.event_id, d.endpoint_id
      FROM webhook_deliveries d, cutoff
     WHERE d.status IN ('delivered', 'gone', 'skipped', 'dead_lettered') AND d.updated_at < cutoff.t
       AND NOT EXISTS (SELECT 1 FROM jobs j
                        WHERE j.dedupe_key = 'deliver:' || d.event_id || ':' || d.endpoint_id)
), events_gone AS (
    SELECT e.id
      FROM events e, cutoff
     WHERE e.created_at < cutoff.t
       AND e.payment_intent_id NOT IN (SELECT id FROM live_intent)
       AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                        WHERE d.event_id = e.id AND d.status IN ('pending', 'held'))
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = 'fanout:' || e.id)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key LIKE 'deliver:' || e.id || ':%%')
), alerts_gone AS (
    SELECT a.id
      FROM alerts a, cutoff
     WHERE a.acknowledged_at < cutoff.t
       AND (a.charge_id IS NULL OR a.charge_id NOT IN (SELECT id FROM live_charge))
), dead_gone AS (
    SELECT j.id
      FROM jobs j, cutoff
     WHERE j.run_at = 'infinity' AND coalesce(j.dead_since, j.created_at) < cutoff.t
       AND coalesce(j.payload ->> 'charge_id', '') NOT IN (SELECT id FROM live_charge)
       AND NOT EXISTS (SELECT 1 FROM refunds r WHERE r.id = j.payload ->> 'refund_id'
                                                 AND r.status IN ('pending', 'unresolved'))
), del_deliveries AS (
    DELETE FROM webhook_deliveries d USING deliveries x
     WHERE %(apply)s AND d.event_id = x.event_id AND d.endpoint_id = x.endpoint_id
    RETURNING 1
), del_events AS (
    -- an event's remaining (finished) deliveries go with it (ON DELETE CASCADE)
    DELETE FROM events e WHERE %(apply)s AND e.id IN (SELECT id FROM events_gone)
    RETURNING 1
), del_alerts AS (
    DELETE FROM alerts a WHERE %(apply)s AND a.id IN (SELECT id FROM alerts_gone)
    RETURNING 1
), del_dead AS (
    DELETE FROM jobs j WHERE %(apply)s AND j.id IN (SELECT id FROM dead_gone)
      AND j.run_at = 'infinity'
    RETURNING 1
)
SELECT (SELECT count(*) FROM deliveries) AS webhook_deliveries,
       (SELECT count(*) FROM events_gone) AS events,
       (SELECT count(*) FROM alerts_gone) AS alerts,
       (SELECT count(*) FROM dead_gone) AS dead_letters;

-- name: webhook_endpoint_hold
-- A worker's URL policy refuses the endpoint's URL: disable it once, with
-- the reason, and raise one webhook_endpoint_disabled alert; later refusals
-- (other deliveries in flight) change nothing. Answers a row only for the
-- call that disabled it.
WITH held AS (
    UPDATE webhook_endpoints
       SET enabled = false, disabled_at = now(), disabled_reason = %(reason)s,
           disabled_cause = 'url_policy'
     WHERE id = %(id)s AND enabled
    RETURNING id, merchant_id, url, disabled_reason
), alert AS (
    INSERT INTO alerts (kind, details)
    SELECT 'webhook_endpoint_disabled',
           jsonb_build_object('endpoint_id', id, 'merchant_id', merchant_id, 'url', url,
                              'reason', disabled_reason, 'cause', 'url_policy')
      FROM held
    ON CONFLICT DO NOTHING
)
SELECT id FROM held;

-- name: webhook_endpoint_disabled_cause
SELECT disabled_cause FROM webhook_endpoints WHERE id = %(id)s;

-- name: webhook_endpoint_requeue_held
-- webhooks enable after a URL-policy hold: every delivery that waited (held,
-- or never made because the fan-out ran while the endpoint was disabled) is
-- made pending again with its deliver job, due now, and the hold is cleared.
-- Run before webhook_endpoint_enable, in its transaction.
WITH ep AS (
    SELECT w.id, w.merchant_id,
           least(w.disabled_at, (SELECT min(e.created_at) FROM webhook_deliveries d
                                   JOIN events e ON e.id = d.event_id
                                  WHERE d.endpoint_id = w.id AND d.status = 'held')) AS since
      FROM webhook_endpoints w
     WHERE w.id = %(id)s AND w.disabled_cause = 'url_policy'
), missed AS (
    INSERT INTO webhook_deliveries (event_id, endpoint_id)
    SELECT e.id, ep.id
      FROM ep
      JOIN payment_intents i ON i.merchant_id = ep.merchant_id
      JOIN events e ON e.payment_intent_id = i.id AND e.created_at >= ep.since
    ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING event_id, endpoint_id
), held AS (
    UPDATE webhook_deliveries d SET status = 'pending', updated_at = now()
      FROM ep
     WHERE d.endpoint_id = ep.id AND d.status = 'held'
    RETURNING d.event_id, d.endpoint_id
), cleared AS (
    UPDATE webhook_endpoints w SET disabled_cause = NULL FROM ep WHERE w.id = ep.id
)
INSERT INTO jobs (kind, lane, dedupe_key, payload)
SELECT 'deliver', 'webhooks', 'deliver:' || event_id || ':' || endpoint_id,
       jsonb_build_object('event_id', event_id, 'endpoint_id', endpoint_id)
  FROM (SELECT event_id, endpoint_id FROM missed UNION SELECT event_id, endpoint_id FROM held) w
ON CONFLICT (dedupe_key) DO UPDATE SET run_at = now(), failures = 0, attempts = 0
 WHERE jobs.run_at = 'infinity'
RETURNING id;

-- name: op_charge_polls
-- payments show: each charge's poll job (next read, attempts, lane, last
-- error); a dead letter has no next read.
SELECT substr(j.dedupe_key, 6) AS charge_id, j.dedupe_key, j.lane AS lane,
       CASE WHEN j.run_at = 'infinity' THEN 'dead'
            WHEN j.locked_at IS NOT NULL AND j.lease_expires_at < now() THEN 'stranded'
            WHEN j.locked_at IS NOT NULL THEN 'leased'
            WHEN j.run_at <= now() THEN 'due'
            ELSE 'scheduled' END AS state,
       CASE WHEN j.run_at <> 'infinity' THEN j.run_at END AS next_read_at,
       j.attempts, j.failures, j.last_error
  FROM jobs j
 WHERE j.dedupe_key = ANY(%(keys)s);

-- name: op_open_alerts_of_charges
SELECT id, kind, charge_id, refund_id, details, created_at
  FROM alerts
 WHERE charge_id = ANY(%(ids)s) AND acknowledged_at IS NULL
 ORDER BY created_at, id;
