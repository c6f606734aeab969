-- The operator's toolkit (vpay/cli/jobs.py, alerts.py, prune.py; vpay/operator.py)
-- and the URL-policy hold of webhook endpoints (vpay/handlers/webhooks.py).

-- alerts ack --note: who owns the case and why, kept with the alert.
ALTER TABLE alerts ADD COLUMN note text CHECK (note IS NULL OR length(note) BETWEEN 1 AND 2000);
-- Every kind the contract names (shared/design/contract.md, Tables), so that
-- no branch's migration narrows the list another relies on.
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind IN (
    'charge_unresolved', 'rail_contradiction', 'job_dead_lettered', 'refund_unresolved',
    'rail_misconfigured', 'webhook_endpoint_disabled', 'missing_from_statement',
    'unknown_rail_transaction'));
-- prune reads acknowledged alerts by age.
CREATE INDEX alerts_acknowledged ON alerts (acknowledged_at) WHERE acknowledged_at IS NOT NULL;
-- One open webhook_endpoint_disabled alert per endpoint: a policy refusal
-- seen by many deliveries at once raises one.
CREATE UNIQUE INDEX alerts_one_open_endpoint_disabled ON alerts ((details ->> 'endpoint_id'))
    WHERE kind = 'webhook_endpoint_disabled' AND acknowledged_at IS NULL;

-- When a job was dead-lettered (run_at became 'infinity'): prune keeps a dead
-- letter for VPAY_RETENTION_DAYS from then, not from the job's creation. Set
-- by a trigger so that every way of parking (the loop's park, the reaper)
-- records it; cleared when the job is re-queued (jobs retry).
ALTER TABLE jobs ADD COLUMN dead_since timestamptz;
UPDATE jobs SET dead_since = now() WHERE run_at = 'infinity';
CREATE FUNCTION jobs_dead_since() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.dead_since := CASE WHEN NEW.run_at = 'infinity' THEN now() END;
    RETURN NEW;
END $$;
CREATE TRIGGER jobs_dead_since BEFORE UPDATE OF run_at ON jobs
    FOR EACH ROW WHEN ((OLD.run_at = 'infinity') IS DISTINCT FROM (NEW.run_at = 'infinity'))
    EXECUTE FUNCTION jobs_dead_since();
CREATE TRIGGER jobs_dead_since_insert BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.run_at = 'infinity') EXECUTE FUNCTION jobs_dead_since();

-- An endpoint disabled because a worker's URL policy refuses its URL (it was
-- registered under VPAY_WEBHOOKS_ALLOW_PRIVATE=1, the worker runs without):
-- its deliveries are 'held', not ended, and `webhooks enable` re-queues them.
ALTER TABLE webhook_endpoints ADD COLUMN disabled_cause text
    CHECK (disabled_cause IS NULL OR disabled_cause IN ('url_policy'));
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_status_check;
ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_status_check CHECK (
    status IN ('pending', 'delivered', 'gone', 'skipped', 'dead_lettered', 'held'));
-- prune reads finished deliveries by age; enable reads an endpoint's held ones.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (updated_at)
    WHERE status IN ('delivered', 'gone', 'skipped', 'dead_lettered');
CREATE INDEX webhook_deliveries_held ON webhook_deliveries (endpoint_id) WHERE status = 'held';
CREATE INDEX events_created ON events (created_at);
