-- Fair claims inside a lane (issue #11, "a burst holds up nobody else";
-- docs/flows/reconciler.md, "Fairness inside a lane"; vpay/fairness.py).
--
-- A lane claims its due jobs oldest first. One merchant's burst (500
-- payments at once, or 500 callbacks pulling 500 polls forward) puts
-- hundreds of due jobs ahead of every other merchant's next poll in that
-- lane. So each job carries the merchant it works for (fair_key), and when a
-- lane falls behind, the worker places the due jobs beyond each merchant's
-- share into rounds (share_round; rebalance_lane in sql/queries/queue.sql):
-- a claim takes the oldest due job within its merchant's share (round 0)
-- first, then the lowest round, oldest first inside it, so backlogged
-- merchants are served one job per round each. Nothing is skipped for good:
-- the lane stays work-conserving, and a claim sets the round back to 0.

ALTER TABLE jobs ADD COLUMN fair_key text;
-- 0: within its merchant's share (every job starts here); n > 0: placed in
-- round n of the lane's fair queue by a rebalance.
ALTER TABLE jobs ADD COLUMN share_round integer NOT NULL DEFAULT 0 CHECK (share_round >= 0);

-- The merchant a job works for, from its payload: a charge's or a refund's
-- intent, or an event's (fanout and deliver). NULL for housekeeping and test
-- kinds: such jobs are never placed in a round and keep their age order.
CREATE FUNCTION jobs_fair_key(payload jsonb) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN payload ? 'charge_id' THEN
             (SELECT i.merchant_id FROM charges c JOIN payment_intents i ON i.id = c.payment_intent_id
               WHERE c.id = payload ->> 'charge_id')
        WHEN payload ? 'refund_id' THEN
             (SELECT i.merchant_id FROM refunds r JOIN charges c ON c.id = r.charge_id
                JOIN payment_intents i ON i.id = c.payment_intent_id
               WHERE r.id = payload ->> 'refund_id')
        WHEN payload ? 'event_id' THEN
             (SELECT i.merchant_id FROM events e JOIN payment_intents i ON i.id = e.payment_intent_id
               WHERE e.id = payload ->> 'event_id')
    END
$$;

-- Every insert path gets its key here (queue.enqueue, the charge's own poll,
-- scan_live, fan-out, deliveries, operator re-queues), including ones
-- written later: no path can forget it.
CREATE FUNCTION jobs_set_fair_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.fair_key := jobs_fair_key(NEW.payload);
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_fair_key
    BEFORE INSERT ON jobs FOR EACH ROW
    WHEN (NEW.fair_key IS NULL AND NEW.lane <> 'housekeeping')
    EXECUTE FUNCTION jobs_set_fair_key();

UPDATE jobs SET fair_key = jobs_fair_key(payload) WHERE lane <> 'housekeeping';

-- The claim's first probe reads only jobs within their share (round 0); the
-- second only placed ones, round by round. Both stay ordered scans that stop
-- at the first row they can lock (0001's and 0008's indexes, now without
-- placed rows; jobs_over_share is small: a backlog's excess).
DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (run_at)
    WHERE locked_at IS NULL AND run_at <> 'infinity' AND share_round = 0;
DROP INDEX jobs_claimable_lane;
CREATE INDEX jobs_claimable_lane ON jobs (lane, run_at)
    WHERE locked_at IS NULL AND run_at <> 'infinity' AND share_round = 0;
CREATE INDEX jobs_over_share ON jobs (lane, share_round, run_at)
    WHERE locked_at IS NULL AND run_at <> 'infinity' AND share_round > 0;
