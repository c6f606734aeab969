-- Each lease carries its own expiry, set by the worker that claimed it
-- (now() + that worker's --lease-seconds). A reaper frees only leases whose
-- own expiry has passed, so a replica run with a short lease can no longer
-- reap, and eventually dead-letter, a job that a replica with a longer lease
-- is still running.
ALTER TABLE jobs ADD COLUMN lease_expires_at timestamptz;
UPDATE jobs SET lease_expires_at = locked_at + interval '300 seconds' WHERE locked_at IS NOT NULL;
ALTER TABLE jobs DROP CONSTRAINT jobs_lease_whole;
ALTER TABLE jobs ADD CONSTRAINT jobs_lease_whole CHECK (
    (locked_by IS NULL) = (locked_at IS NULL)
    AND (locked_at IS NULL) = (lease_token IS NULL)
    AND (locked_at IS NULL) = (lease_expires_at IS NULL));
DROP INDEX jobs_leased;
CREATE INDEX jobs_leased ON jobs (lease_expires_at) WHERE locked_at IS NOT NULL;
