-- The gauges read at scrape (vpay/base/metrics.py, DatabaseCollector): one
-- statement, run under SET LOCAL statement_timeout, answering rows of
-- (family, label_a, label_b, value). Every "now" is the database's.

-- name: metrics_snapshot
-- Queue depth by lane and state, with the states the gauge line and the
-- runbooks use: due = unleased and run_at passed, leased, dead = run_at 'infinity'.
SELECT 'queue_jobs' AS family, q.lane AS a, s.state AS b, s.n AS value
  FROM (SELECT lane,
               count(*) FILTER (WHERE locked_at IS NULL AND run_at <= now() AND run_at <> 'infinity') AS due,
               count(*) FILTER (WHERE locked_at IS NOT NULL) AS leased,
               count(*) FILTER (WHERE run_at = 'infinity') AS dead
          FROM jobs
         GROUP BY lane) q
 CROSS JOIN LATERAL (VALUES ('due', q.due), ('leased', q.leased), ('dead', q.dead)) AS s(state, n)
UNION ALL
SELECT 'alerts_open', kind, NULL, count(*) FROM alerts WHERE acknowledged_at IS NULL GROUP BY kind
UNION ALL
SELECT 'charges', status, NULL, count(*) FROM charges GROUP BY status
UNION ALL
SELECT 'webhook_endpoints_disabled', NULL, NULL, count(*) FROM webhook_endpoints WHERE NOT enabled
UNION ALL
-- Seconds left of each rail's fleet-wide pause (rail_pauses: one row per rail).
SELECT 'rail_paused_seconds', rail, NULL, greatest(extract(epoch FROM paused_until - now()), 0)::float8
  FROM rail_pauses
UNION ALL
-- workers whose heartbeat is within their bound (sql/0024_workers.sql)
SELECT 'workers_live', NULL, NULL, count(*) FROM worker_states WHERE state = 'live';
