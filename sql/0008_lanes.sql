-- Lanes (issue #11; vpay/lanes.py owns the names and the mapping): every job
-- belongs to one named queue, set at enqueue, and a claim loop claims only
-- the lanes it serves, so a hanging merchant endpoint holds only the
-- webhooks lane and a trickling rail only its own.

ALTER TABLE jobs ADD COLUMN lane text;

-- Backfill by the rule of vpay.lanes.lane_for: rail kinds take the rail of
-- their charge (or of their refund); a rail kind whose charge is gone (its
-- handler dead-letters it) goes to housekeeping with the other odd jobs.
UPDATE jobs j
   SET lane = CASE
       WHEN j.kind IN ('poll', 'resubmit') THEN
            coalesce((SELECT c.rail FROM charges c WHERE c.id = j.payload ->> 'charge_id'), 'housekeeping')
       WHEN j.kind = 'refund_poll' THEN
            coalesce((SELECT r.rail FROM refunds r WHERE r.id = j.payload ->> 'refund_id'), 'housekeeping')
       WHEN j.kind IN ('fanout', 'deliver') THEN 'webhooks'
       ELSE 'housekeeping'
   END;

ALTER TABLE jobs ALTER COLUMN lane SET NOT NULL;
-- A lane no worker knows would be a job nobody ever claims. A new rail adds
-- its lane here and in vpay/lanes.py.
ALTER TABLE jobs ADD CONSTRAINT jobs_lane_known
    CHECK (lane IN ('mtn', 'orange', 'webhooks', 'housekeeping'));

-- The per-lane claim (sql/queries/queue.sql, claim_lane): lane = $1 AND due,
-- ORDER BY run_at LIMIT 1 FOR UPDATE SKIP LOCKED walks this index in run_at
-- order within the lane and stops at the first row it can lock; no sort, and
-- other lanes' backlogs are never read. jobs_claimable (run_at) stays: it
-- serves loops that share several lanes (claim_lanes) and the gauge.
CREATE INDEX jobs_claimable_lane ON jobs (lane, run_at)
    WHERE locked_at IS NULL AND run_at <> 'infinity';
