-- One open rail_contradiction alert per charge (or refund) and per answer:
-- a verification read can be asked for by anyone who can reach the callback
-- route, and a rail that keeps contradicting must not flood the table. Once
-- an operator acknowledges the alert, a new contradiction opens a new one.
CREATE UNIQUE INDEX alerts_one_open_contradiction
    ON alerts (charge_id, coalesce(refund_id, ''), (details ->> 'rail_says'))
    WHERE kind = 'rail_contradiction' AND acknowledged_at IS NULL;
