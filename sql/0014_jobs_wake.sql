-- Wake on commit (issue #15; vpay/wake.py; shared/design/rails.md, "Waking on
-- commit"): a job that becomes due NOW notifies channel vpay_jobs with its
-- lane, and the worker's listener wakes an idle claim loop of that lane. A
-- trigger, as procrastinate does, so every writer of jobs is covered (the
-- enqueue, the fan-out's deliveries, the scan, a callback's pull-forward, the
-- drain's release, the reaper) without each remembering to.
--
-- NOTIFY is sent at commit, and identical (channel, payload) pairs of one
-- transaction are collapsed: a batch of 10,000 jobs of one lane is one
-- notification. Jobs due later notify nothing: the claim tells a loop when
-- the next one is due and it sleeps until then (capped by --idle-sleep).
--
-- The WHEN clauses are evaluated in C for each row, so the claim (which sets
-- locked_at) and the heartbeat (lease_expires_at only: not in UPDATE OF) pay
-- no function call.

CREATE FUNCTION jobs_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('vpay_jobs', NEW.lane);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_wake_on_insert
    AFTER INSERT ON jobs FOR EACH ROW
    WHEN (NEW.locked_at IS NULL AND NEW.run_at <= now())
    EXECUTE FUNCTION jobs_wake();

-- Moved to due and unleased: a pull-forward (run_at now), a release or a
-- reap (locked_at cleared), a reschedule with no delay.
CREATE TRIGGER jobs_wake_on_due
    AFTER UPDATE OF run_at, locked_at ON jobs FOR EACH ROW
    WHEN (NEW.locked_at IS NULL AND NEW.run_at <= now()
          AND (OLD.locked_at IS NOT NULL OR OLD.run_at > now()))
    EXECUTE FUNCTION jobs_wake();
