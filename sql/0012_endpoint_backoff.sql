-- Isolation (issue 11): a merchant's endpoint that is timing out is backed
-- off as an endpoint, so its other pending deliveries wait with it instead
-- of each spending a whole attempt deadline in the webhook lane.
--
-- timeouts_in_row: attempts to this endpoint that timed out in a row (reset
-- by any answer). backoff_until: no delivery to it is attempted before this;
-- while it is in the future, deliver jobs are deferred without a POST. When
-- it has passed, one delivery (the probe) moves it forward by one attempt's
-- deadline and tries; the others keep waiting on the probe's outcome.
ALTER TABLE webhook_endpoints
    ADD COLUMN timeouts_in_row integer NOT NULL DEFAULT 0 CHECK (timeouts_in_row >= 0),
    ADD COLUMN backoff_until   timestamptz;
